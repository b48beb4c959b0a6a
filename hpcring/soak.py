"""Soak test: many all-reduces of mixed sizes, dtypes and algorithms, checking results and memory.

    mpiexec -n 4 python -m hpcring.soak --calls 10000

A leak of one small buffer per call, or a communicator duplicated per call, shows up
here as resident memory that keeps growing after the warm-up; a race or a stale
cached buffer shows up as a wrong element. Exits 1 on either, 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

from . import ALGORITHMS, allreduce
from .errors import aborting

SIZES = (0, 1, 7, 100, 1000, 4096 + 3, 65_536 + 1)
DTYPES = ("float32", "float64", "int64", "float16", "complex64")


def resident_bytes() -> int:
    """Current resident set size of this process (Linux /proc), not the peak."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hpcring.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000, help="all-reduces in all (default 10000)")
    parser.add_argument("--warmup", type=int, default=None, help="calls before memory is measured")
    parser.add_argument("--max-growth", type=float, default=0.05, help="allowed RSS growth (fraction)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


@aborting
def main(argv: list[str] | None = None) -> int:
    """Run the soak on COMM_WORLD; every rank returns the same exit code."""
    args = parse(argv)
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    warmup = args.warmup if args.warmup is not None else max(args.calls // 10, 1)
    rng = np.random.default_rng(args.seed)  # same seed on every rank: the same sequence of calls
    wrong, baseline = 0, None
    for call in range(args.calls):
        if call == warmup:
            baseline = resident_bytes()
        n = int(rng.choice(SIZES))
        dtype = np.dtype(str(rng.choice(DTYPES)))
        algorithm = str(rng.choice(ALGORITHMS))
        x = np.full(n, rank + 1 + call % 3, dtype=dtype)
        out = np.empty_like(x) if call % 2 else None
        result = allreduce(x, algorithm=algorithm, out=out)
        want = size * (size + 1) // 2 + size * (call % 3)
        wrong += int(np.count_nonzero(result != want))
    final = resident_bytes()
    wrong = comm.allreduce(wrong)
    growth = (final - baseline) / baseline if baseline else 0.0
    worst = comm.allreduce(growth, op=MPI.MAX)
    ok = wrong == 0 and worst <= args.max_growth
    if rank == 0:
        print(
            f"hpcring soak: {args.calls} calls on {size} ranks, {wrong} wrong elements, "
            f"resident memory growth after warm-up {worst * 100:+.2f}% "
            f"(limit {args.max_growth * 100:.0f}%): {'ok' if ok else 'FAILED'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
