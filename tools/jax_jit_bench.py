"""The cost of an all-reduce inside jax.jit: hpcring.jax.allreduce (an ordered io_callback) beside
mpi4jax.allreduce (an XLA FFI custom call) in the same run, and hpcring.allreduce outside jit.

    mpiexec -n 2 python tools/jax_jit_bench.py [--sizes 1K,64K,1M] [--iters 50]

Rank 0 prints the median over iterations of the slowest rank's time per call (each call is one
jitted function holding one all-reduce of float32 values, its result blocked on). mpi4jax is
not a dependency of hpcring: where it is not installed its column says so.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

import hpcring
import hpcring.jax
from hpcring.units import parse_size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1K,64K,1M", help="bytes per rank (float32)")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    try:
        import mpi4jax
    except ImportError as error:
        mpi4jax, missing = None, str(error)
    calls = {
        "hpcring.jax in jit": lambda: jax.jit(lambda a: hpcring.jax.allreduce(a)),
        "hpcring outside jit": lambda: lambda a: hpcring.allreduce(a),
    }
    if mpi4jax is not None:
        calls["mpi4jax in jit"] = lambda: jax.jit(lambda a: mpi4jax.allreduce(a, op=MPI.SUM, comm=comm))
    if comm.rank == 0:
        print(f"# {comm.size} ranks, float32, median of {args.iters} calls (slowest rank), us per call")
        print("| bytes | " + " | ".join(calls) + ("" if mpi4jax else " | mpi4jax in jit") + " |")
        print("| --- " * (len(calls) + 1 + (0 if mpi4jax else 1)) + "|")
    for size in args.sizes.split(","):
        n = parse_size(size) // 4
        x = jnp.ones(n, jnp.float32) * (comm.rank + 1)
        row = []
        for name, make in calls.items():
            f = make()
            want = np.full(n, comm.size * (comm.size + 1) / 2, np.float32)
            assert np.array_equal(np.asarray(f(x)), want), name  # warm, and right
            times = []
            for _ in range(args.iters):
                comm.Barrier()
                start = time.perf_counter()
                jax.block_until_ready(f(x))
                times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
            row.append(f"{1e6 * statistics.median(times):.0f}")
        if mpi4jax is None:
            row.append(f"not installed ({missing})")
        if comm.rank == 0:
            print(f"| {size} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
