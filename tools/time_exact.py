"""Reproducible sums against the plain ring: time per call, the floor their bytes set, and bytes.

    mpiexec -n 4 python tools/time_exact.py [--runs 7] [--sizes 1,16,64] [--calls 3] [-a ring]

Prints, on rank 0, one line per (dtype, size): the median over runs of the time per call (each
run: the max over ranks of the mean of ``--calls`` calls, check=False) of

- ``plain``: the plain all-reduce (``-a``: ring or rabenseifner);
- ``exact``: ``reproducible=True``, converted inside the algorithm's steps (`hpcring.exact.fused`);
- ``accum``: an `hpcring.ExactSum` holding the same array as its one contribution, its
  ``allreduce`` (the adds not timed);
- ``whole``: the same sum the way it ran before, converting whole arrays around two whole
  all-reduces (`hpcring.exact.run`: codes, MAX, words, sum, rounding);
- ``floor``: the bytes the format moves, through the same algorithm with plain reductions and no
  conversion: an all-reduce (MAX) of one small integer per element (uint8; uint16 for float64),
  a reduce-scatter of the 8-byte words (16 for float64) summed as float64, an all-gather of the
  results in the dtype (`hpcring.allreduce`, `reduce_scatter`, `allgather`, check=False): the
  floor of reducing the words along the algorithm's steps. Where `hpcring.exact.gathers` holds
  (one node, or up to 3 ranks), ``exact`` gathers the contributions to their owners unreduced
  instead and moves the plain all-reduce's bytes: its floor is ``plain`` plus the owner's
  conversions;

their ratios to ``plain``, and the bytes this rank handed to MPI per call beside the formula.
Variants are interleaved run by run, so a noisy machine slows them alike: compare ratios from
one run, not figures across runs.
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
from hpcring import algorithms, core, exact, program
from hpcring.arrays import NUMPY
from hpcring.comm import state_of
from hpcring.ops import OPS, Op
from hpcring.partition import segment_bounds


def timed(comm: MPI.Intracomm, call: Callable[[], object], calls: int) -> float:
    call()  # warm: plans, scratch, the compiled program
    call()
    comm.Barrier()
    began = time.perf_counter()
    for _ in range(calls):
        call()
    mine = (time.perf_counter() - began) / calls
    return comm.allreduce(mine, op=MPI.MAX)


_PROGRAMS: dict[tuple[Any, ...], Any] = {}


def compiled(
    channel: Any, collective: str, name: str, src: np.ndarray, dst: np.ndarray, op: Op | None
) -> None:
    """``name``'s ``collective`` of src into dst run as the engine runs a warm call: its recorded
    step table in the compiled core (the words and codes are dtypes the front ends do not take)."""
    key = (collective, name, src.ctypes.data, dst.ctypes.data, src.nbytes, dst.nbytes, op)
    made = _PROGRAMS.get(key)
    spec = algorithms.spec(collective, name)
    if made is None:
        form = "gathering" if op is None else "reducing"
        run = (
            (lambda: spec.run(channel, src, dst)) if op is None else (lambda: spec.run(channel, src, dst, op))
        )
        run()  # the schedules, as the engine's first call makes them
        made = _PROGRAMS[key] = core.program(program.record(spec, form, channel, src, dst, op), src, dst)[0]
    assert made is not None and made.run(src, dst, None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--sizes", default="1,16,64", help="MiB of the float array")
    parser.add_argument("-a", "--algorithm", default="ring", choices=("ring", "rabenseifner"))
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    channel = state_of(comm).channel(NUMPY)
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"# {comm.size} ranks, {args.algorithm}, median of {args.runs} runs x {args.calls} calls, ms;")
    say("# ratios to plain; bytes this rank handed to MPI per call")
    say(
        "# dtype   MiB   plain   exact   accum   whole   floor | exact  accum  whole  floor "
        "| bytes plain  exact (formula)"
    )
    for dtype in (np.float32, np.float64):
        for mib in map(float, args.sizes.split(",")):
            say(row(comm, channel, args.algorithm, np.dtype(dtype), mib, args.runs, args.calls), flush=True)


def row(
    comm: MPI.Intracomm, channel: Any, name: str, dtype: np.dtype, mib: float, runs: int, calls: int
) -> str:
    """One line of the table: every variant timed ``runs`` times, interleaved."""
    size, rank = comm.size, comm.rank
    spec = algorithms.spec(algorithms.ALLREDUCE, name)
    fmt = exact.format_of(dtype)
    n = int(mib * (1 << 20)) // dtype.itemsize
    x = np.random.default_rng(rank).standard_normal(n).astype(dtype)
    work = x.copy()
    # the floor's arrays: what travels, as arrays a plain reduction sums
    code = np.zeros(n, fmt.code)
    wide = np.float64 if fmt.words == 1 else np.complex128  # two float64 words summed as one complex
    words = np.zeros(n, wide)
    mine = segment_bounds(n, size)[rank]
    shard, part = np.empty(mine[1] - mine[0], wide), np.zeros(n // size, dtype)
    gathered = np.empty(size * (n // size), dtype)
    acc = hpcring.ExactSum(like=x)
    acc.add(x)

    def reduce(buf: np.ndarray, op: str) -> None:
        compiled(channel, algorithms.ALLREDUCE, name, buf, buf, OPS[op])

    def whole() -> None:  # the sum as it ran before: whole arrays converted around two all-reduces
        exact.run(channel, reduce, [x], work, "sum")

    def floor() -> None:  # the same bytes through the same algorithm, plain reductions, no conversion
        compiled(channel, algorithms.ALLREDUCE, name, code, code, OPS["max"])
        compiled(channel, algorithms.REDUCE_SCATTER, name, words, shard, OPS["sum"])
        compiled(channel, algorithms.ALLGATHER, name, part, gathered, None)

    variants = {
        "plain": lambda: hpcring.allreduce(x, out=work, algorithm=name, check=False),
        "exact": lambda: hpcring.allreduce(x, out=work, algorithm=name, check=False, reproducible=True),
        "accum": lambda: acc.allreduce(out=work, algorithm=name, check=False),
        "whole": whole,
        "floor": floor,
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(runs):
        for key, call in variants.items():
            times[key].append(timed(comm, call, calls))
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    sent = {}
    for key in ("plain", "exact"):
        before = channel.bytes_sent
        variants[key]()
        sent[key] = channel.bytes_sent - before
    position = channel.topology().order.index(rank) if spec.ring_order else rank

    def by_formula(count: int, itemsize: int) -> int | None:
        return algorithms.bytes_sent(name, count, itemsize, size, position)

    assert spec.split_sent is not None
    gathered = exact.gathers(size, channel.topology().nodes)
    formula = exact.bytes_sent(by_formula, n, dtype, spec.split_sent(n, size, position), gathered=gathered)
    ratio = " ".join(f"{med[k] / med['plain']:5.2f}x" for k in ("exact", "accum", "whole", "floor"))
    return (
        f"{dtype.name:8s} {mib:4g} "
        + " ".join(f"{med[k]:7.2f}" for k in ("plain", "exact", "accum", "whole", "floor"))
        + f" | {ratio} | {sent['plain']:>11,} {sent['exact']:>11,} ({formula:,})"
    )


if __name__ == "__main__":
    main()
