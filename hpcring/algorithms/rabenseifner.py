"""Rabenseifner: recursive-halving reduce-scatter, recursive-doubling all-gather, and the
all-reduce that is both.

Cost (Thakur, Rabenseifner & Gropp 2005), for G a power of two: each half takes
log2(G)·alpha + (G-1)/G·n·beta (the reduce-scatter also (G-1)/G·n·gamma), so the all-reduce
takes 2·log2(G)·alpha + 2(G-1)/G·n·beta + (G-1)/G·n·gamma: the ring's bandwidth with log2(G)
instead of G-1 latency steps, so it wins where alpha matters (small n, large G).

G not a power of two: with p = 2^floor(log2 G) and r = G - p, the first 2r ranks pair up; each
even one hands its data to its odd partner, which stands in for both in the power-of-two core,
and gets its share back at the end. That adds 2·alpha and up to 2·n·beta on those ranks (the
simple variant of the paper, not its half-swap, which saves n·beta but needs two more
messages per pair).

The buffer is cut into G parts (numpy.array_split's for the reduce-scatter and the all-reduce;
the G rows of the gathered array for the all-gather), and core rank q's segment is the parts
of the ranks it stands for, so the reduce-scatter ends with every rank holding its own part.
Every element is reduced on exactly one rank of the core and then only copied, so all ranks end
with the same bits; the lower-numbered side is always the left operand, so the bits of an
element depend only on the rank count, not on where the parts are cut.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..partition import segment_bounds
from .base import Phase, Spec, Split, no_scratch, same_memory

if TYPE_CHECKING:
    from ..channel import Channel
    from ..ops import Op


@dataclass(frozen=True)
class Step:
    """One exchange with ``partner``: keep (and reduce) ``keep``, hand over ``give``."""

    partner: int
    keep: slice
    give: slice
    lower: bool  # this rank is the lower of the pair: its data is the left operand


@dataclass(frozen=True)
class Schedule:
    folded_into: int | None  # even rank of a fold pair: the odd partner that works for it
    folded_from: int | None  # odd rank of a fold pair: the even partner it works for
    steps: tuple[Step, ...]  # the halving steps; the doubling runs them backwards
    mine: slice  # this rank's own part
    theirs: slice | None  # the folded partner's part (odd rank of a fold pair)
    scratch: int  # elements of scratch for the largest incoming buffer


@functools.lru_cache(maxsize=64)  # pure, and asked for on every call (and by the memory guard)
def build(size: int, rank: int, count: int, rows: bool = False) -> Schedule:
    """This rank's schedule over the G parts of ``count`` elements (numpy.array_split's), or,
    with ``rows``, over G rows of ``count`` (an all-gather's)."""
    bounds = [(r * count, (r + 1) * count) for r in range(size)] if rows else segment_bounds(count, size)
    core = 1 << (size.bit_length() - 1)  # largest power of two <= size
    extra = size - core
    count = bounds[-1][1]
    mine = slice(*bounds[rank])
    if rank < 2 * extra and rank % 2 == 0:
        return Schedule(rank + 1, None, (), mine, None, 0)
    folded_from = rank - 1 if rank < 2 * extra else None
    me = rank // 2 if rank < 2 * extra else rank - extra  # rank within the core

    def real(core_rank: int) -> int:
        return 2 * core_rank + 1 if core_rank < extra else core_rank + extra

    def first(core_rank: int) -> int:  # the lowest rank core rank q stands for
        return 2 * core_rank if core_rank < extra else core_rank + extra

    # Core segment q is the parts of the ranks core rank q stands for. Halving starts from
    # segments [0, core); at distance d (core/2, core/4, ..., 1) the partner is me XOR d, both
    # hold the same range, and the one whose d bit is 0 keeps the lower half. After the last
    # step the range is the single segment numbered `me`, complete.
    def elements(lo: int, hi: int) -> slice:
        return slice(bounds[first(lo)][0], bounds[first(hi) - 1][1] if hi < core else count)

    steps, lo, hi, distance = [], 0, core, core // 2
    while distance:
        mid, lower = (lo + hi) // 2, not me & distance
        keep, give = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        steps.append(Step(real(me ^ distance), elements(*keep), elements(*give), lower))
        lo, hi = keep
        distance //= 2
    largest = max((step.keep.stop - step.keep.start for step in steps), default=0)
    theirs = None if folded_from is None else slice(*bounds[folded_from])
    return Schedule(
        None, folded_from, tuple(steps), mine, theirs, count if folded_from is not None else largest
    )


def _halving(ch: Channel, plan: Schedule, src: Any, dst: Any, op: Op) -> None:
    """Recursive halving: afterwards ``dst`` (``src``'s length; may be ``src``) holds, at the
    segment this rank ends with, the reduction over every rank (a folded even rank: nothing)."""
    if plan.folded_into is not None:
        ch.step += 1
        ch.send(src, plan.folded_into)
        return
    xp, incoming = ch.xp, ch.scratch("rabenseifner", plan.scratch, dst.dtype)
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
    for step in plan.steps:
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


def _doubling(ch: Channel, plan: Schedule, dst: Any) -> None:
    """Recursive doubling: every rank's finished segment of ``dst`` copied everywhere."""
    for step in reversed(plan.steps):
        ch.step += 1
        ch.sendrecv(dst[step.keep], step.partner, dst[step.give], step.partner)


def _segment(plan: Schedule) -> slice:
    """The core segment this rank holds complete after the halving."""
    return plan.steps[-1].keep if plan.steps else slice(0, 0)


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src): the halving, then the doubling."""
    ch.step = 0  # exchanges begun in this call: the flight record's step (`hpcring.flight`)
    plan = build(ch.size, ch.rank, src.size)
    _halving(ch, plan, src, dst, op)
    if plan.folded_into is not None:
        ch.step += 1
        ch.recv(dst, plan.folded_into)
        return
    ch.as_sent(dst[_segment(plan)])  # wire=: the finished segment, as the others get it
    _doubling(ch, plan, dst)
    if plan.folded_from is not None:
        ch.step += 1
        ch.send(dst, plan.folded_from)


def split(ch: Channel, n: int) -> Split:
    """The all-reduce of ``n`` elements as its two phases (`Split`): the halving, and the doubling
    with the folds' hand-back (a folded even rank owns nothing and receives the whole result)."""
    ch.step = 0
    plan = build(ch.size, ch.rank, n)
    folded = plan.folded_into is not None

    def reduce_scatter(c: Channel, src: Any, dst: Any, op: Op) -> None:
        _halving(c, plan, src, dst, op)

    def all_gather(c: Channel, dst: Any) -> None:
        if folded:
            c.step += 1
            c.recv(dst, plan.folded_into)
            return
        _doubling(c, plan, dst)
        if plan.folded_from is not None:
            c.step += 1
            c.send(dst, plan.folded_from)

    def owners() -> tuple[tuple[int, slice], ...]:
        plans = (build(ch.size, rank, n) for rank in range(ch.size))
        return tuple(
            (rank, slice(0, 0) if p.folded_into is not None else _segment(p)) for rank, p in enumerate(plans)
        )

    return Split(slice(0, 0) if folded else _segment(plan), reduce_scatter, all_gather, owners=owners)


def reduce_scatter(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- this rank's part of op over all ranks of src: the halving alone. In place (``dst``
    is that part of ``src``) the rest of ``src`` holds partial sums afterwards; out of place
    they go to scratch the length of ``src``."""
    ch.step = 0
    plan = build(ch.size, ch.rank, src.size)
    in_place = same_memory(dst, src[plan.mine])
    work = src if in_place else ch.scratch("rabenseifner-work", src.size, src.dtype)
    _halving(ch, plan, src, work, op)
    if plan.folded_into is not None:
        ch.step += 1
        ch.recv(dst, plan.folded_into)
        return
    if plan.theirs is not None:
        ch.step += 1
        ch.send(work[plan.theirs], plan.folded_from)
    if not in_place:
        dst[...] = work[plan.mine]


def allgather(ch: Channel, src: Any, dst: Any) -> None:
    """dst <- every rank's src in rank order: the doubling alone, from each rank's own row."""
    ch.step = 0
    plan = build(ch.size, ch.rank, src.size, rows=True)
    if not same_memory(src, dst[plan.mine]):
        dst[plan.mine] = src
    if plan.folded_into is not None:
        ch.step += 1
        ch.send(src, plan.folded_into)
        ch.step += 1
        ch.recv(dst, plan.folded_into)
        return
    if plan.theirs is not None:
        ch.step += 1
        ch.recv(dst[plan.theirs], plan.folded_from)
    _doubling(ch, plan, dst)
    if plan.folded_from is not None:
        ch.step += 1
        ch.send(dst, plan.folded_from)


# ---- formulas and traits ----------------------------------------------------------------------


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> int:
    """All-reduce: what this rank's halving gives away and its doubling passes back; a fold pair
    adds its whole buffer once each way. 2(G-1)/G·n for G a power of two."""
    if size == 1 or count == 0:
        return 0
    plan = build(size, rank, count)
    if plan.folded_into is not None:
        return count * itemsize
    moved = sum(step.give.stop - step.give.start + step.keep.stop - step.keep.start for step in plan.steps)
    return (moved + (count if plan.folded_from is not None else 0)) * itemsize


def split_sent(count: int, size: int, rank: int) -> tuple[int, int]:
    """The elements `bytes_sent` counts, by phase: (the halving's and a fold's hand-over, the
    doubling's and a fold's hand-back)."""
    if size == 1 or count == 0:
        return 0, 0
    plan = build(size, rank, count)
    if plan.folded_into is not None:
        return count, 0
    given = sum(step.give.stop - step.give.start for step in plan.steps)
    kept = sum(step.keep.stop - step.keep.start for step in plan.steps)
    return given, kept + (count if plan.folded_from is not None else 0)


def reduce_scatter_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """Reduce-scatter: what the halving gives away; a folded rank sends its whole buffer, its
    partner sends the folded rank's part back."""
    if size == 1 or count == 0:
        return 0
    plan = build(size, rank, count)
    if plan.folded_into is not None:
        return count * itemsize
    given = sum(step.give.stop - step.give.start for step in plan.steps)
    back = 0 if plan.theirs is None else plan.theirs.stop - plan.theirs.start
    return (given + back) * itemsize


def allgather_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """All-gather of ``count`` per rank: what the doubling passes on; a folded rank sends its
    row, its partner the whole gathered array back."""
    if size == 1 or count == 0:
        return 0
    plan = build(size, rank, count, rows=True)
    if plan.folded_into is not None:
        return count * itemsize
    kept = sum(step.keep.stop - step.keep.start for step in plan.steps)
    return (kept + (size * count if plan.folded_from is not None else 0)) * itemsize


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """Scratch this rank needs: half the buffer, or all of it on a rank that takes a fold."""
    if size == 1 or count == 0:
        return 0
    return build(size, rank, count).scratch * itemsize


def reduce_scatter_scratch(count: int, itemsize: int, size: int, rank: int) -> int:
    """The all-reduce's, plus the partial sums of the whole buffer (out of place)."""
    return scratch_bytes(count, itemsize, size, rank) + (count * itemsize if size > 1 else 0)


def log2_floor(p: int) -> int:
    """floor(log2 p): 2**this is the power-of-two core of p ranks."""
    return p.bit_length() - 1


def _halving_steps(n: float, p: int) -> list[Phase]:
    k = log2_floor(p)
    fold = (1 << k) != p
    return [Phase(1, n / 2 ** (s + 1), n / 2 ** (s + 1), 1 << s, "xor", fold) for s in range(k)]


def _doubling_steps(n: float, p: int) -> list[Phase]:
    k = log2_floor(p)
    fold = (1 << k) != p
    return [Phase(1, n / 2 ** (s + 1), 0.0, 1 << s, "xor", fold) for s in reversed(range(k))]


def allreduce_steps(n: float, p: int) -> list[Phase]:
    """Recursive halving + recursive doubling, with the pre/post steps for p not a power of two:
    the whole buffer to the odd partner (reduced there) and the whole result back. Then every
    step has ranks that only wait."""
    if p == 1:
        return []
    steps = _halving_steps(n, p) + _doubling_steps(n, p)
    if (1 << log2_floor(p)) == p:
        return steps
    return [Phase(1, n, n, 1, "xor", True), *steps, Phase(1, n, 0.0, 1, "xor", True)]


def reduce_scatter_steps(n: float, p: int) -> list[Phase]:
    if p == 1:
        return []
    steps = _halving_steps(n, p)
    if (1 << log2_floor(p)) == p:
        return steps
    return [Phase(1, n, n, 1, "xor", True), *steps, Phase(1, n / p, 0.0, 1, "xor", True)]


def allgather_steps(n: float, p: int) -> list[Phase]:
    """All-gather of n bytes per rank: the doubling of a buffer p times as large."""
    if p == 1:
        return []
    steps = _doubling_steps(n * p, p)
    if (1 << log2_floor(p)) == p:
        return steps
    return [Phase(1, n, 0.0, 1, "xor", True), *steps, Phase(1, n * p, 0.0, 1, "xor", True)]


def narrowings(size: int, per_node: int) -> int:
    """Halving steps, the owner's rounding, and a fold."""
    core = 1 << log2_floor(size)
    return log2_floor(core) + 1 + (size != core)


def picture(index: int, steps: int, size: int) -> str | None:
    if size & (size - 1):
        return None
    halving = index <= steps // 2
    what = (
        "recursive halving: swap half the range with a partner, add the half kept"
        if halving
        else "recursive doubling: swap the complete ranges back"
    )
    return f"rabenseifner step {index}/{steps}, {what}"


ALLREDUCE = Spec(
    run=allreduce,
    bytes_sent=bytes_sent,
    scratch_bytes=scratch_bytes,
    phases=allreduce_steps,
    narrowings=narrowings,
    stepped=True,
    split=split,
    split_sent=split_sent,
    picture=picture,
)
REDUCE_SCATTER = Spec(
    run=reduce_scatter,
    bytes_sent=reduce_scatter_bytes,
    scratch_bytes=reduce_scatter_scratch,
    phases=reduce_scatter_steps,
    stepped=True,
)
ALLGATHER = Spec(
    run=allgather, bytes_sent=allgather_bytes, scratch_bytes=no_scratch, phases=allgather_steps, stepped=True
)
