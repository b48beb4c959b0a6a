"""Why buckets: syncing many small gradients one all-reduce each versus through `GradientSync`.

    mpiexec -n 4 python -m hpcring.examples.fusion [--arrays 200] [--count 256] [--repeats 20]

Each separate call pays the agreement step and the algorithm's latency steps; a bucket
pays them once for all the arrays in it. Prints the median over repeats (max over ranks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import hpcring
from hpcring.training import GradientSync


def timed(comm: MPI.Intracomm, run) -> float:
    """Seconds for ``run()`` on the slowest rank, starting together."""
    comm.Barrier()
    start = time.perf_counter()
    run()
    return comm.allreduce(time.perf_counter() - start, op=MPI.MAX)


@hpcring.aborting
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcring.examples.fusion", description=__doc__)
    parser.add_argument("--arrays", type=int, default=200)
    parser.add_argument("--count", type=int, default=256, help="elements per array")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--algorithm", default="auto", choices=hpcring.ALGORITHMS)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(comm.Get_rank())
    grads = [rng.standard_normal(args.count).astype(args.dtype) for _ in range(args.arrays)]
    sync = GradientSync(grads, comm=comm, algorithm=args.algorithm)

    def separate() -> None:
        for g in grads:
            hpcring.allreduce(g, op="mean", algorithm=args.algorithm, comm=comm)

    def bucketed() -> None:
        sync.ready_all()
        sync.wait()

    for run in (separate, bucketed):  # warm-up: duplicate communicators, plans, scratch
        run()
    times: dict[str, list[float]] = {"separate": [], "bucketed": []}
    for _ in range(args.repeats):
        times["separate"].append(timed(comm, separate))
        times["bucketed"].append(timed(comm, bucketed))
    med = {name: statistics.median(values) for name, values in times.items()}
    if comm.Get_rank() == 0:
        nbytes = args.count * np.dtype(args.dtype).itemsize
        print(
            f"# {comm.Get_size()} ranks, {args.arrays} arrays of {nbytes} B ({args.dtype}), algorithm "
            f"{args.algorithm}, {len(sync.buckets)} bucket(s), median of {args.repeats}"
        )
        print(f"separate allreduce calls: {1e3 * med['separate']:8.2f} ms")
        print(f"GradientSync buckets:     {1e3 * med['bucketed']:8.2f} ms")
        print(f"speed-up:                 {med['separate'] / med['bucketed']:8.1f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
