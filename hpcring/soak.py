"""Soak test: many all-reduces of mixed sizes, dtypes and algorithms, checking results and memory.

    mpiexec -n 4 python -m hpcring.soak --calls 10000
    mpiexec -n 4 python -m hpcring.soak --calls 2000 --faults     # one rank errs every 100th call

With ``--faults``, every ``--fault-every``-th call one rank (in turn) passes another count, dtype
or op, or skips the call: a mismatch must be a ValueError on every rank and leave the
communicator usable (the next call is checked like any other), a skip a StallError naming
that rank on the others, after which every rank goes on on a fresh duplicate.

A leak of one small buffer per call, or a communicator duplicated per call, shows up
here as resident memory that keeps growing after the warm-up; a race or a stale
cached buffer shows up as a wrong element. Exits 1 on either, 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from . import ALGORITHMS, allreduce
from .errors import StallError, aborting
from .polling import GRACE

SIZES = (0, 1, 7, 100, 1000, 4096 + 3, 65_536 + 1)
DTYPES = ("float32", "float64", "int64", "float16", "complex64")
FAULTS = ("count", "dtype", "op", "skip")  # in turn, one per --fault-every calls


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
    parser.add_argument(
        "--faults", action="store_true", help="one rank mismatches or skips every --fault-every-th call"
    )
    parser.add_argument("--fault-every", type=int, default=100, help="calls between faults (default 100)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=2.0,
        help="seconds before a skip is a StallError (--faults; default 2)",
    )
    return parser.parse_args(argv)


def fresh(ended: MPI.Intracomm, comm: MPI.Intracomm) -> MPI.Intracomm:
    """A new duplicate of ``comm`` to go on with, after a stall ended ``ended`` (freed: what
    hpcring made for it goes with it)."""
    work = comm.Dup()
    ended.Free()
    return work


def faulty(x: np.ndarray, op: str, fault: str) -> tuple[np.ndarray, str]:
    """The odd rank's arguments for a mismatch fault: another count, dtype or op."""
    if fault == "count":
        return np.ones(x.size + 1, dtype=x.dtype), op
    if fault == "dtype":
        return np.ones(x.size, dtype=np.float32 if x.dtype != np.float32 else np.float64), op
    return x, "prod"  # another op that applies to every dtype (max does not to complex)


@aborting
def main(argv: list[str] | None = None) -> int:
    """Run the soak on COMM_WORLD; every rank returns the same exit code."""
    args = parse(argv)
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    warmup = args.warmup if args.warmup is not None else max(args.calls // 10, 1)
    rng = np.random.default_rng(args.seed)  # same seed on every rank: the same sequence of calls
    wrong, missed, baseline = 0, 0, None
    faults = args.faults and size > 1  # one rank has no other to disagree with
    work = comm.Dup() if faults else comm
    for call in range(args.calls):
        if call == warmup:
            baseline = resident_bytes()
        n = int(rng.choice(SIZES))
        dtype = np.dtype(str(rng.choice(DTYPES)))
        algorithm = str(rng.choice(ALGORITHMS))
        x = np.full(n, rank + 1 + call % 3, dtype=dtype)
        out = np.empty_like(x) if call % 2 else None
        fault = None
        if faults and call % args.fault_every == args.fault_every - 1:
            number = call // args.fault_every
            fault, odd = FAULTS[number % len(FAULTS)], number % size
        if fault is None:
            result = allreduce(x, algorithm=algorithm, out=out, comm=work)
            want = size * (size + 1) // 2 + size * (call % 3)
            wrong += int(np.count_nonzero(result != want))
            continue
        if fault == "skip" and rank == odd:
            time.sleep(args.timeout + GRACE + 0.5)  # until the others have given up on this rank
            work = fresh(work, comm)
            continue
        mine, op = faulty(x, "sum", fault) if rank == odd else (x, "sum")
        try:
            allreduce(mine, op=op, algorithm=algorithm, comm=work, timeout=args.timeout)
            missed += 1  # every fault must raise
        except ValueError as error:
            missed += int(fault == "skip" or "disagree" not in str(error))
        except StallError as error:
            missed += int(fault != "skip" or error.missing != [odd])
            work = fresh(work, comm)  # a StallError ends that communicator
    final = resident_bytes()
    wrong, missed = comm.allreduce(wrong), comm.allreduce(missed, op=MPI.MAX)  # faults: each rank sees all
    growth = (final - baseline) / baseline if baseline else 0.0
    worst = comm.allreduce(growth, op=MPI.MAX)
    ok = wrong == 0 and missed == 0 and worst <= args.max_growth
    if rank == 0:
        injected = (
            f", {args.calls // args.fault_every} faults, {missed} not raised as they should" if faults else ""
        )
        print(
            f"hpcring soak: {args.calls} calls on {size} ranks{injected}, {wrong} wrong elements, "
            f"resident memory growth after warm-up {worst * 100:+.2f}% "
            f"(limit {args.max_growth * 100:.0f}%): {'ok' if ok else 'FAILED'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
