"""Reproducible sums against the plain ring: time per call and bytes on the wire.

    mpiexec -n 4 python tools/time_exact.py [--runs 7] [--sizes 1,16,64] [--calls 3]

Prints, on rank 0, one line per (dtype, size): the median over runs of the time per call (each
run: the max over ranks of the mean of ``--calls`` calls) of the plain ring, the reproducible
ring, and, to price the binned alternative, the ring on the integer words alone and on twice as
many (one more word per element); the time of the local conversion alone; and the bytes this
rank handed to MPI per call, beside the formula. Variants are interleaved run by run, so a
noisy machine slows them alike; compare ratios from one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import hpcring
from hpcring import algorithms, exact
from hpcring.arrays import NUMPY
from hpcring.comm import state_of
from hpcring.ops import OPS


def timed(comm: MPI.Intracomm, call: Callable[[], object], calls: int) -> float:
    call()  # warm: plans, scratch
    comm.Barrier()
    began = time.perf_counter()
    for _ in range(calls):
        call()
    mine = (time.perf_counter() - began) / calls
    return comm.allreduce(mine, op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--sizes", default="1,16,64", help="MiB of the float array")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    channel = state_of(comm).channel(NUMPY)
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"# {comm.size} ranks, median of {args.runs} runs x {args.calls} calls, ms; bytes per rank per call")
    say("# dtype  MiB  plain  exact  ratio | words-only  words+1  convert | bytes plain  exact (formula)")
    for dtype in (np.float32, np.float64):
        for mib in map(float, args.sizes.split(",")):
            say(row(comm, channel, np.dtype(dtype), mib, args.runs, args.calls), flush=True)


def row(comm: MPI.Intracomm, channel: Any, dtype: np.dtype, mib: float, runs: int, calls: int) -> str:
    """One line of the table: every variant timed ``runs`` times, interleaved."""
    size, rank = comm.size, comm.rank
    ring, fmt = algorithms.spec(algorithms.ALLREDUCE, "ring").run, exact.FORMATS[dtype]
    alone = _Alone(channel)
    n = int(mib * (1 << 20)) // dtype.itemsize
    x = np.random.default_rng(rank).standard_normal(n).astype(dtype)
    work = x.copy()
    words = np.zeros(fmt.words * n, np.int64)
    more = np.zeros((fmt.words + 1) * n, np.int64)
    variants = {
        "plain": lambda: hpcring.allreduce(x, out=work, algorithm="ring"),
        "exact": lambda: hpcring.allreduce(x, out=work, algorithm="ring", reproducible=True),
        "words": lambda: ring(channel, words, words, OPS["sum"]),
        "more": lambda: ring(channel, more, more, OPS["sum"]),
        "convert": lambda: exact.run(alone, lambda buf, op: None, [x], work, "sum"),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(runs):
        for name, call in variants.items():
            times[name].append(timed(comm, call, calls))
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    sent = {}
    for name in ("plain", "exact"):
        before = channel.bytes_sent
        variants[name]()
        sent[name] = channel.bytes_sent - before
    code = algorithms.bytes_sent("ring", n, fmt.code.itemsize, size, rank)
    formula = code + algorithms.bytes_sent("ring", fmt.words * n, 8, size, rank)
    return (
        f"{dtype.name:8s} {mib:4g} {med['plain']:7.2f} {med['exact']:7.2f} "
        f"{med['exact'] / med['plain']:5.2f}x | {med['words']:7.2f} {med['more']:7.2f} "
        f"{med['convert']:7.2f} | {sent['plain']:>11,} {sent['exact']:>11,} ({formula:,})"
    )


class _Alone:
    """The channel seen as one rank: exact.run converts and rounds, and moves nothing."""

    def __init__(self, channel: Any) -> None:
        self.xp, self.size, self.scratch = np, 1, channel.scratch  # the same reused scratch


if __name__ == "__main__":
    main()
