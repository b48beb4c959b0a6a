"""``--framework torch``: one collective timed four ways side by side, so what the torch backend adds
to hpcring's own call is a number, and gloo is the peer.

- ``hpcring``: hpcring's blocking call (`hpcring.allreduce` ...) on the process group's
  communicator, the tensor itself;
- ``hpcring i``: its non-blocking form waited for at once (`hpcring.iallreduce(...).wait()`), the
  call the backend makes (on the group's progress thread);
- ``torch:hpcring``: ``torch.distributed`` on the default group, hpcring's (``dist.all_reduce``,
  ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``broadcast``, ``all_to_all_single``);
- ``torch:gloo``: the same call on a gloo group of the same ranks.

Each row is the median over iterations of the slowest rank's time; "over i" is what the backend
adds to the non-blocking call it makes (torch's Python, the Work, the wait), "over blocking" the
same against the blocking call.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import algorithms
from ..units import format_size
from .data import sweep

WAYS = ("hpcring", "hpcring i", "torch:hpcring", "torch:gloo")
COLLECTIVES = (
    algorithms.ALLREDUCE,
    algorithms.REDUCE_SCATTER,
    algorithms.ALLGATHER,
    algorithms.BROADCAST,
    algorithms.ALLTOALL,
)


def calls(collective: str, x: Any, out: Any, algorithm: str, gloo: Any) -> dict[str, Callable[[], Any]]:
    """The four ways of one collective on ``x`` (and ``out``)."""
    import torch.distributed as dist

    import hpcring

    pg = dist.group.WORLD
    comm = pg.comm  # the group's communicator: the backend's calls run on it
    common = {"algorithm": algorithm, "comm": comm}
    g = comm.Get_size()
    if collective == algorithms.ALLREDUCE:
        return {
            "hpcring": lambda: hpcring.allreduce(x, **common),
            "hpcring i": lambda: hpcring.iallreduce(x, **common).wait(),
            "torch:hpcring": lambda: dist.all_reduce(x),
            "torch:gloo": lambda: dist.all_reduce(x, group=gloo),
        }
    if collective == algorithms.REDUCE_SCATTER:
        return {
            "hpcring": lambda: hpcring.reduce_scatter(x, out=out, **common),
            "hpcring i": lambda: hpcring.ireduce_scatter(x, out=out, **common).wait(),
            "torch:hpcring": lambda: dist.reduce_scatter_tensor(out, x),
            "torch:gloo": lambda: dist.reduce_scatter_tensor(out, x, group=gloo),
        }
    if collective == algorithms.ALLGATHER:
        rows = out.view(g, -1)
        return {
            "hpcring": lambda: hpcring.allgather(x, out=rows, **common),
            "hpcring i": lambda: hpcring.iallgather(x, out=rows, **common).wait(),
            "torch:hpcring": lambda: dist.all_gather_into_tensor(out, x),
            "torch:gloo": lambda: dist.all_gather_into_tensor(out, x, group=gloo),
        }
    if collective == algorithms.BROADCAST:
        return {
            "hpcring": lambda: hpcring.broadcast(x, **common),
            "hpcring i": lambda: hpcring.ibroadcast(x, **common).wait(),
            "torch:hpcring": lambda: dist.broadcast(x, 0),
            "torch:gloo": lambda: dist.broadcast(x, 0, group=gloo),
        }
    return {
        "hpcring": lambda: hpcring.alltoall(x, out=out, **common),
        "hpcring i": lambda: hpcring.ialltoall(x, out=out, **common).wait(),
        "torch:hpcring": lambda: dist.all_to_all_single(out, x),
        "torch:gloo": lambda: dist.all_to_all_single(out, x, group=gloo),
    }


def timed(comm: MPI.Intracomm, call: Callable[[], Any], warmup: int, iters: int) -> float:
    """Median seconds of ``call`` over ``iters`` (each the slowest rank's), after ``warmup``."""
    for _ in range(warmup):
        call()
    times = np.empty(iters)
    comm.Barrier()
    for i in range(iters):
        began = MPI.Wtime()
        call()
        times[i] = MPI.Wtime() - began
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return statistics.median(times.tolist())


def main(args: argparse.Namespace, comm: MPI.Intracomm) -> int:
    """The side-by-side table for ``args.collective`` over the sizes of -b/-e/-f (``args.passes``
    passes; per cell the median of the passes)."""
    import torch
    import torch.distributed as dist

    import hpcring.torch

    collective, g = args.collective, comm.Get_size()
    default = hpcring.torch.Options().algorithms()[collective]
    algorithm = default if args.default_algorithms else args.algorithms[0]
    torch.set_num_threads(1)
    hpcring.torch.init_process_group(algorithm={collective: algorithm})
    gloo = dist.new_group(backend="gloo")
    dtype = getattr(torch, args.dtype.name)
    itemsize = args.dtype.itemsize
    sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor, itemsize * g)
    if comm.rank == 0:
        print(
            f"# hpcring.bench --framework torch: {collective}, {g} ranks, {args.dtype.name}, algorithm "
            f"{algorithm!r}; median of {args.iters} iterations (the slowest rank's each) after "
            f"{args.warmup}, median of {args.passes} pass(es); size = the whole buffer, as the bench's"
        )
        print(
            f"# {'size':>8} "
            + " ".join(f"{w + ' us':>16}" for w in WAYS)
            + f" {'over i us':>10} {'over blocking':>13}"
        )
    for nbytes in sizes:
        count = nbytes // itemsize
        if collective == algorithms.ALLGATHER:
            x, out = torch.zeros(count // g, dtype=dtype), torch.zeros(count, dtype=dtype)
        elif collective == algorithms.REDUCE_SCATTER:
            x, out = torch.zeros(count, dtype=dtype), torch.zeros(count // g, dtype=dtype)
        else:
            x, out = torch.zeros(count, dtype=dtype), torch.zeros(count, dtype=dtype)
        ways = calls(collective, x, out, algorithm, gloo)
        passes = [
            {w: timed(comm, call, args.warmup, args.iters) for w, call in ways.items()}
            for _ in range(args.passes)
        ]
        us = {w: 1e6 * statistics.median(p[w] for p in passes) for w in WAYS}
        if comm.rank == 0:
            over_i = us["torch:hpcring"] - us["hpcring i"]
            over = us["torch:hpcring"] - us["hpcring"]
            print(
                f"  {format_size(nbytes):>8} "
                + " ".join(f"{us[w]:16.1f}" for w in WAYS)
                + f" {over_i:10.1f} {over:13.1f}",
                flush=True,
            )
    hpcring.torch.destroy_process_group()
    return 0


__all__ = ["COLLECTIVES", "WAYS", "main"]
