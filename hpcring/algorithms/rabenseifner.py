"""Rabenseifner all-reduce: recursive-halving reduce-scatter, then recursive-doubling all-gather.

Cost (Thakur, Rabenseifner & Gropp 2005), for G a power of two:
2·log2(G)·alpha + 2(G-1)/G·n·beta + (G-1)/G·n·gamma. The ring's bandwidth with
log2(G) instead of G-1 latency steps, so it wins where alpha matters (small n, large G).

G not a power of two: with p = 2^floor(log2 G) and r = G - p, the first 2r ranks pair
up; each even one sends its whole buffer to its odd partner, which reduces it and then
stands in for both in the power-of-two core, and the result is sent back at the end.
That adds 2·alpha + 2·n·beta + n·gamma on those ranks (the simple variant of the paper,
not its half-swap, which saves n·beta but needs two more messages per pair).

Every element is reduced on exactly one rank of the core and then only copied, so all
ranks end with the same bits; the lower-numbered side is always the left operand.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..channel import Channel
from ..ops import Op
from ..partition import segment_bounds
from ..wire import gathering, round_owned


@dataclass(frozen=True)
class Step:
    """One exchange with ``partner``: keep (and reduce) ``keep``, hand over ``give``."""

    partner: int
    keep: slice
    give: slice
    lower: bool  # this rank is the lower of the pair: its data is the left operand


@dataclass(frozen=True)
class Plan:
    folded_into: int | None  # even rank of a fold pair: the odd partner that works for it
    folded_from: int | None  # odd rank of a fold pair: the even partner it works for
    steps: tuple[Step, ...]  # the halving steps; the doubling runs them backwards
    scratch: int  # elements of scratch for the largest incoming buffer


@functools.lru_cache(maxsize=64)  # pure, and asked for on every call by the memory guard
def _build(size: int, rank: int, count: int) -> Plan:
    core = 1 << (size.bit_length() - 1)  # largest power of two <= size
    extra = size - core
    if rank < 2 * extra and rank % 2 == 0:
        return Plan(folded_into=rank + 1, folded_from=None, steps=(), scratch=0)
    folded_from = rank - 1 if rank < 2 * extra else None
    me = rank // 2 if rank < 2 * extra else rank - extra  # rank within the core

    def real(core_rank: int) -> int:
        return 2 * core_rank + 1 if core_rank < extra else core_rank + extra

    # The buffer is cut into `core` segments. Halving starts from segments [0, core); at
    # distance d (core/2, core/4, ..., 1) the partner is me XOR d, both hold the same
    # range, and the one whose d bit is 0 keeps the lower half. After the last step the
    # range is the single segment numbered `me`, complete. Ranges of segments map to
    # elements through the segment bounds, so uneven counts (and count < core) just work.
    bounds = segment_bounds(count, core)

    def elements(lo: int, hi: int) -> slice:
        return slice(bounds[lo][0], bounds[hi - 1][1])

    steps, lo, hi, distance = [], 0, core, core // 2
    while distance:
        mid, lower = (lo + hi) // 2, not me & distance
        keep, give = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        steps.append(Step(real(me ^ distance), elements(*keep), elements(*give), lower))
        lo, hi = keep
        distance //= 2
    largest = max(step.keep.stop - step.keep.start for step in steps)
    return Plan(None, folded_from, tuple(steps), count if folded_from is not None else largest)


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src)."""
    size, n = ch.size, src.size
    ch.step = 0  # exchanges begun in this call: the flight record's step (`hpcring.flight`)
    plan = ch.plan(("rabenseifner", src.dtype, n, dst is src), lambda: _build(size, ch.rank, n))
    # ch.step counts the exchanges begun (the flight record's step, `hpcring.flight`).
    if plan.folded_into is not None:
        ch.step += 1
        ch.send(src, plan.folded_into)
        ch.step += 1
        ch.recv(dst, plan.folded_into)
        return
    xp, incoming = ch.xp, ch.scratch("rabenseifner", plan.scratch, src.dtype)

    # `current` holds this rank's partial result: src until the first reduction writes
    # dst, so an out-of-place call never copies src first. Until then, out of place, what
    # arrives lands straight in dst and is reduced there (as the ring does, and for the
    # same gain: no scratch pass, and the reduction writes memory just brought in).
    current = src
    if plan.folded_from is not None:
        theirs = dst if dst is not src else incoming
        ch.step += 1
        ch.recv(theirs, plan.folded_from)
        op.combine(xp, theirs, src, dst)
        current = dst
    for step in plan.steps:  # reduce-scatter by recursive halving
        direct = current is src and dst is not src
        theirs = dst[step.keep] if direct else incoming[: step.keep.stop - step.keep.start]
        ch.step += 1
        ch.sendrecv(current[step.give], step.partner, theirs, step.partner)
        mine = current[step.keep]
        if step.lower:
            op.combine(xp, mine, theirs, dst[step.keep])
        else:
            op.combine(xp, theirs, mine, dst[step.keep])
        current = dst
    round_owned(ch, dst[plan.steps[-1].keep])  # wire=: the finished segment, as the others get it
    with gathering(ch):  # wire=: owned or received values only, on the wire grid
        for step in reversed(plan.steps):  # all-gather by recursive doubling: copies only
            ch.step += 1
            ch.sendrecv(dst[step.keep], step.partner, dst[step.give], step.partner)
        if plan.folded_from is not None:
            ch.step += 1
            ch.send(dst, plan.folded_from)


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> int:
    """Bytes this rank hands to MPI: what its halving gives away and its doubling passes back.

    2(G-1)/G·n for G a power of two; a fold pair adds its whole buffer once each way.
    """
    if size == 1 or count == 0:
        return 0
    plan = _build(size, rank, count)
    if plan.folded_into is not None:
        return count * itemsize
    moved = sum(step.give.stop - step.give.start + step.keep.stop - step.keep.start for step in plan.steps)
    return (moved + (count if plan.folded_from is not None else 0)) * itemsize


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """Scratch this rank needs: half the buffer, or all of it on a rank that takes a fold."""
    return _build(size, rank, count).scratch * itemsize if size > 1 and count else 0
