"""What one small all-reduce costs with warm caches and right after a large copy evicted them:
bare MPI, hpcring on a NumPy view, hpcring on the tensor, and ``torch.distributed`` on hpcring's
group (docs/strategies.md, "Why more at 1 MiB").

    mpiexec -n 2 python tools/torch_cold.py [--iters 400] [--copy-mib 16] [--runs 1]

Each call is timed alone after an ``MPI_Barrier``; "cold" runs a copy of ``--copy-mib`` MiB
before the barrier, outside the timed part. Rank 0 prints the medians in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import hpcring
import hpcring.torch


def medians(
    ways: dict[str, Callable[[], Any]], iters: int, before: Callable[[], Any] | None
) -> dict[str, float]:
    """Median microseconds per way, the ways taking turns call by call."""
    world = MPI.COMM_WORLD
    times: dict[str, list[float]] = {name: [] for name in ways}
    for call in ways.values():
        for _ in range(20):
            call()
    for _ in range(iters):
        for name, call in ways.items():
            if before is not None:
                before()
            world.Barrier()
            began = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - began)
    return {name: statistics.median(values) * 1e6 for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=400)
    parser.add_argument("--copy-mib", type=int, default=16, help="the copy that evicts the caches")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hpcring.torch.init_process_group()
    comm = dist.group.WORLD.comm
    tensor = torch.ones(2)
    view = tensor.numpy()
    ways = {
        "bare": lambda: comm.Allreduce(MPI.IN_PLACE, view),
        "view": lambda: hpcring.allreduce(view, comm=comm),
        "tensor": lambda: hpcring.allreduce(tensor, comm=comm),
        "dist": lambda: dist.all_reduce(tensor),
    }
    source = np.ones(args.copy_mib << 17)  # float64: MiB * 2^20 / 8
    target = np.empty_like(source)
    for _ in range(args.runs):
        for label, before in (("warm", None), ("cold", lambda: np.copyto(target, source))):
            got = medians(ways, args.iters, before)
            if MPI.COMM_WORLD.rank == 0:
                cells = "  ".join(f"{name} {value:.1f}" for name, value in got.items())
                print(f"{label}  {cells}  dist-tensor {got['dist'] - got['tensor']:.1f} us", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
