"""The ring: reduce-scatter and all-gather around a ring of G ranks, the all-reduce that is both,
and the broadcast that pipelines down the same ring.

Cost (Thakur, Rabenseifner & Gropp 2005): the reduce-scatter and the all-gather each take
(G-1)·alpha + (G-1)/G·n·beta (plus (G-1)/G·n·gamma to reduce), so the all-reduce takes
2(G-1)·alpha + 2(G-1)/G·n·beta + (G-1)/G·n·gamma: each rank sends 2(G-1)/G·n bytes whatever G
is, the bandwidth-optimal all-reduce. The pipelined broadcast takes (G-2+k)·(alpha + n/k·beta)
for k chunks: about n·beta once k is large, the bandwidth-optimal broadcast.

One schedule serves every collective: the buffer is cut into G segments, and ``owned[p]`` names
the segment the rank at position p of the ring holds complete after the reduce-scatter (and
starts the all-gather with). The all-reduce uses owned[p] = p + 1 on the G parts of its buffer;
the public reduce-scatter and all-gather use the rank's own part (numpy.array_split's, or its row
of the gathered array). So `allreduce` is literally `reduce_scatter_phase` then
`all_gather_phase`, the pieces `reduce_scatter` and `allgather` run alone.

With ``HPCRING_CHUNK_BYTES`` set (the communicator's `Channel.config`; every rank must use the
same value), segments larger than that travel as chunks of that size; otherwise, and by default
(see CHUNK_BYTES), each step is one Sendrecv of a whole segment, except that a ring spanning
several nodes streams in chunks of NETWORK_CHUNK_BYTES. Chunks are received a few ahead into a
small reused scratch, so while chunk k is being reduced chunk k+1 is already on its way, and a
reduced chunk is sent on at once instead of waiting for its whole segment. Out of place, step 0
sends straight from the input and the first reduction writes the output, so the input is never
copied; the all-gather receives straight into the output.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import config
from ..partition import chunk_bounds, segment_bounds
from ..records import Record
from .base import Phase, Spec, Split, no_scratch, same_memory

if TYPE_CHECKING:
    from ..channel import Channel
    from ..config import Config
    from ..ops import Op

# Default: no chunking, by measurement. On this project's 2-core machine (Open MPI wheel,
# shared memory, float32 sum, --no-agree, median of 5 runs of 5 iterations) whole
# segments beat every chunk size tried: at G=2 the ring reached 1.16x / 1.94x / 1.69x
# MPI_Allreduce's busbw at 16 / 64 / 256 MiB unchunked, 0.97x / 1.50x / 1.21x with 4 MiB
# chunks and 1.29x at 256 MiB with 32 MiB chunks; smaller chunks were 2-12x slower
# (tools/time_ring.py). Every extra message costs a scheduler round trip when ranks share
# cores. Machines with a core per rank, a real network or GPUs may gain from streaming:
# set HPCRING_CHUNK_BYTES (the same on every rank) and measure with the bench.
CHUNK_BYTES: int | None = None
# Across nodes the default is 60 KiB chunks, by measurement: over Open MPI's TCP transport,
# large messages with both directions of a link busy are erratic (likely: above the eager
# limit, btl_tcp_eager_limit = 64 KiB with the header, a rendezvous handshake queues behind
# the other direction's data on the one TCP connection per pair). On the emulated cluster
# (1 Gbit/s, float32, 16 MiB) the ring over 4 hosts x 1 rank took 569 ms whole-segment and
# 223 ms in 32 KiB chunks (link bound 201-229 ms); hierarchical on 2 x 2 took 248 ms in
# 1 MiB chunks, 199 in 128 KiB, 155 in 64 KiB and 153 in 32 KiB; on 4 x 2, 666 ms in 1 MiB
# and 260-282 ms in 16-60 KiB (docs/multinode.md). A fabric with RDMA (UCX, verbs) moves
# large messages differently: set HPCRING_CHUNK_BYTES there and measure.
NETWORK_CHUNK_BYTES = 60 << 10
# The broadcast has nothing to overlap without chunks (each rank would wait for the whole
# buffer before passing it on): it always streams, in chunks of HPCRING_CHUNK_BYTES, else these.
BROADCAST_CHUNK_BYTES = 512 << 10
UNCHUNKED = 1 << 62  # elements per "chunk" when nothing is chunked: every segment is one piece
DEPTH = 4  # at most: receives posted ahead, and sends in flight


class Stream(Record):
    """One phase of the ring as a stream of chunks (all slices of the flat buffer).

    The rank first sends ``first`` (a segment it already holds), then every incoming
    chunk in turn, once it has arrived (and been reduced), except those of the last segment.
    """

    first: tuple[slice, ...]
    incoming: tuple[slice, ...]
    forward: int  # how many incoming chunks are passed on to the right


class Schedule(Record):
    """The ring of one call shape, as this rank runs it."""

    position: int  # this rank's place in the ring
    left: int
    right: int
    segments: tuple[slice, ...]  # the G segments of the flat buffer, by segment number
    owned: tuple[int, ...]  # owned[p]: the segment position p holds complete after the reduce-scatter
    pipelined: bool  # some segment is more than one chunk: worth streaming
    reduce_scatter: Stream
    all_gather: Stream
    chunk: int  # elements per chunk, and per scratch slot
    depth: int  # receives posted ahead and sends in flight: DEPTH, or fewer if segments are short

    def segment(self, offset: int) -> slice:
        """The segment owned by the position ``offset`` places from this one (mod G)."""
        return self.segments[self.owned[(self.position + offset) % len(self.owned)]]


def around(size: int, rank: int, order: tuple[int, ...] | None) -> tuple[int, int, int]:
    """(position, left, right) of ``rank`` in a ring of ``size`` that runs in ``order``
    (the ranks grouped by node, `Topology.order`; None: rank order)."""
    ranks = order or range(size)
    position = ranks.index(rank)
    return position, ranks[(position - 1) % size], ranks[(position + 1) % size]


def build(
    size: int,
    rank: int,
    bounds: list[tuple[int, int]],
    owned: tuple[int, ...],
    chunk: int,
    order: tuple[int, ...] | None = None,
) -> Schedule:
    """This rank's schedule over segments ``bounds``, position p ending with segment ``owned[p]``.

    Reduce-scatter: the partial sum of segment owned[o] starts at position o + 1 and travels
    right, each position adding its own contribution, until position o adds the last one; so
    at step s position p sends its partial sum of owned[p - 1 - s] and receives the left
    neighbour's partial sum of owned[p - 2 - s], which it reduces and sends on at step s + 1.
    All-gather: position p starts with owned[p] and receives owned[p - 1], owned[p - 2], ...,
    passing each on, straight into place: no reduction, so every rank ends with the very
    bits the segment's owner computed.
    """
    position, left, right = around(size, rank, order)
    segments = tuple(slice(*b) for b in bounds)

    def chunks(offset: int) -> tuple[slice, ...]:
        start, stop = bounds[owned[(position + offset) % size]]
        return tuple(slice(*b) for b in chunk_bounds(start, stop, chunk))

    def stream(first: int, incoming: list[int]) -> Stream:
        pieces = [chunks(offset) for offset in incoming]
        return Stream(chunks(first), sum(pieces, ()), sum(map(len, pieces[:-1])))

    longest = max(stop - start for start, stop in bounds)
    return Schedule(
        position=position,
        left=left,
        right=right,
        segments=segments,
        owned=owned,
        pipelined=longest > chunk,
        reduce_scatter=stream(-1, [-2 - step for step in range(size - 1)]),
        all_gather=stream(0, [-1 - step for step in range(size - 1)]),
        chunk=chunk,
        # Scratch is depth chunks: never much more than one segment, as unpipelined.
        depth=max(1, min(DEPTH, -(-longest // chunk))),
    )


def _stream(
    ch: Channel,
    plan: Schedule,
    phase: Stream,
    base: Any,
    dst: Any,
    op: Op | None,
    nap: float = 0.0,
    on_final: Callable[[slice], None] | None = None,
) -> None:
    """Run one phase: reduce ``base`` (op given) or copy (op None) the incoming chunks into ``dst``.

    Chunk k of the outgoing stream is sent just before incoming chunk k is waited for: it
    is either part of ``first`` or an incoming chunk < k, already complete. Receives go
    ``depth`` ahead, into scratch slot k % depth when reducing (the slot's last reader, the
    reduction of chunk k - depth, has run), else straight into ``dst``. At most ``depth``
    sends are in flight; all are finished before returning, so the next phase may receive
    into memory that these sends read (write-after-read). ``nap``: as `Channel.wait`.
    ``on_final`` (all-gather only) hears of every piece of ``dst`` that holds its final value:
    the segment owned, at once, then each incoming chunk as it lands.
    """
    incoming, first, depth = phase.incoming, phase.first, plan.depth
    # In place, a reduction needs the rank's own data where the chunk lands: scratch slots.
    # Out of place the chunk lands in the output and is reduced there (see `_reduce_scatter`).
    slots = None
    if op and base is dst:
        slots = ch.scratch("ring", depth * plan.chunk, dst.dtype).reshape(depth, plan.chunk)
    sends: deque[Any] = deque()
    receives: deque[Any] = deque()

    def target(k: int) -> Any:
        piece = incoming[k]
        return dst[piece] if slots is None else slots[k % depth, : piece.stop - piece.start]

    def send(k: int) -> None:
        if len(sends) == depth:
            ch.wait(sends.popleft(), nap)
        piece = base[first[k]] if k < len(first) else dst[incoming[k - len(first)]]
        sends.append(ch.isend(piece, plan.right))

    for k in range(min(depth, len(incoming))):
        receives.append(ch.irecv(target(k), plan.left))
    if on_final is not None:
        for piece in first:
            on_final(piece)
    outgoing = len(first) + phase.forward
    for k in range(len(incoming)):
        ch.step += 1  # the flight record's step: chunks received, both phases
        if k < outgoing:
            send(k)
        ch.wait(receives.popleft(), nap)
        if op:
            piece = incoming[k]
            op.combine(ch.xp, base[piece], target(k), dst[piece])
        elif on_final is not None:
            on_final(incoming[k])
        if k + depth < len(incoming):
            receives.append(ch.irecv(target(k + depth), plan.left))
    for k in range(len(incoming), outgoing):
        send(k)
    ch.waitall(sends, nap)


def _reduce_scatter(ch: Channel, plan: Schedule, src: Any, dst: Any, op: Op) -> None:
    """The reduce-scatter, one Sendrecv per step: afterwards ``dst`` at ``plan.segment(0)``
    holds the reduction over the ring.

    Step 0 sends from ``src`` and each reduction reads ``src`` and writes ``dst``: every
    segment is reduced at most once per rank, and sent only after that, so out of place needs
    no copy. Out of place, the incoming segment lands straight in ``dst`` (nothing has written
    that segment of ``dst`` yet, and no send reads it) and is reduced there, operands in the
    same order as from scratch, so the same bits. That saves a scratch segment's worth of
    cache, and the reduction writes memory the receive has just brought in: at 2 ranks
    the ring took 15-25% less time from 1 to 256 MiB (16 MiB: 2645 -> 2040 us). In place, the
    incoming segment lands in scratch (``dst`` still holds this rank's data there).
    """
    size, first = len(plan.owned), plan.segments[0]  # the first part is the longest (array_split's)
    incoming = None if dst is not src else ch.scratch("ring", first.stop - first.start, dst.dtype)
    for step in range(size - 1):
        ch.step += 1  # the flight record's step (`hpcring.flight`): exchanges begun this call
        out_seg, in_seg = plan.segment(-1 - step), plan.segment(-2 - step)
        buf = dst[in_seg] if incoming is None else incoming[: in_seg.stop - in_seg.start]
        ch.sendrecv((src if step == 0 else dst)[out_seg], plan.right, buf, plan.left)
        op.combine(ch.xp, src[in_seg], buf, dst[in_seg])


def _all_gather(ch: Channel, plan: Schedule, dst: Any, on_final: Callable[[slice], None] | None) -> None:
    """The all-gather, one Sendrecv per step, each segment received straight into place."""
    if on_final is not None:
        on_final(plan.segment(0))
    for step in range(len(plan.owned) - 1):
        ch.step += 1  # the flight record's step: G-1 of the reduce-scatter, then these
        in_seg = plan.segment(-1 - step)
        ch.sendrecv(dst[plan.segment(-step)], plan.right, dst[in_seg], plan.left)
        if on_final is not None:
            on_final(in_seg)


def reduce_scatter_phase(ch: Channel, plan: Schedule, src: Any, dst: Any, op: Op) -> None:
    """Phase 1: afterwards ``dst`` (``src``'s length; may be ``src``) holds, at the segment this
    rank owns (``plan.segment(0)``), the reduction over every rank; elsewhere partial sums."""
    # Non-blocking MPI needs the array's own memory for the life of the request. A staged
    # device buffer (CuPy without CUDA-aware MPI) is a shared pinned copy valid for one
    # blocking call only, so that case keeps the blocking ring.
    if plan.pipelined and ch.adapter.direct:
        _stream(ch, plan, plan.reduce_scatter, src, dst, op, wait_nap(ch.config))
    else:
        _reduce_scatter(ch, plan, src, dst, op)


def all_gather_phase(
    ch: Channel, plan: Schedule, dst: Any, on_final: Callable[[slice], None] | None = None
) -> None:
    """Phase 2: every rank's owned segment of ``dst`` passed around until every rank has all.

    ``on_final(piece)`` hears of every slice of ``dst`` once it holds its final value."""
    if plan.pipelined and ch.adapter.direct:
        _stream(ch, plan, plan.all_gather, dst, dst, None, wait_nap(ch.config), on_final)
    else:
        _all_gather(ch, plan, dst, on_final)


def wait_nap(settings: Config | None = None) -> float:
    """Seconds to sleep between polls while a pipelined ring waits: ``HPCRING_WAIT_SLEEP_US``
    (microseconds) of ``settings`` (default `config.current()`), else 0, MPI's own wait,
    which spins.

    Where ranks outnumber cores (the emulated cluster: 8 ranks of 4 "hosts" on 2 cores) a
    spinning rank takes the core from the ranks with work and from the kernel's network
    processing: there 50 us naps took the flat ring at 4 x 2, 16 MiB, from 425-441 to
    282-301 ms and hierarchical from 251 to 244 ms (link bound 235 ms). With a core per
    rank, spinning answers soonest: leave it unset.
    """
    return (settings or config.current()).wait_sleep_us * 1e-6


def chunk_elements(itemsize: int, default: int | None = None, settings: Config | None = None) -> int:
    """Elements per chunk: ``HPCRING_CHUNK_BYTES`` of ``settings`` (default `config.current()`),
    else ``default``, else CHUNK_BYTES, over the item size."""
    limit = (settings or config.current()).chunk_bytes or default or CHUNK_BYTES
    return max(1, limit // itemsize) if limit else UNCHUNKED


def successors(size: int) -> tuple[int, ...]:
    """The all-reduce's owned segments: position p ends its reduce-scatter with segment p + 1."""
    return tuple((p + 1) % size for p in range(size))


def schedule(
    ch: Channel, n: int, itemsize: int, *, own: bool, rows: bool = False, chunk_bytes: int | None = None
) -> Schedule:
    """The cached schedule of ``ch`` for ``n`` elements cut into G parts (numpy.array_split's),
    or, with ``rows``, for G rows of ``n`` (an all-gather's). ``own`` gives each rank its own
    part (the public reduce-scatter and all-gather), else the all-reduce's owned[p] = p + 1.
    Chunks are sized by what travels (``ch.travel_itemsize``: 60 KiB messages stay under the
    eager limit on the wire too); ``chunk_bytes`` is the default chunking."""
    size = ch.size
    topo = ch.topology()
    order = topo.ring  # neighbours share a node wherever placement allows
    if chunk_bytes is None and topo.nodes > 1:
        chunk_bytes = NETWORK_CHUNK_BYTES  # the ring crosses a network
    chunk = chunk_elements(ch.travel_itemsize(itemsize), chunk_bytes, ch.config)

    def make() -> Schedule:
        bounds = [(r * n, (r + 1) * n) for r in range(size)] if rows else segment_bounds(n, size)
        ranks = order or tuple(range(size))
        owned = ranks if own else successors(size)
        return build(size, ch.rank, bounds, owned, chunk, order)

    return ch.schedule(("ring", n, rows, own, chunk, order), make)


def allreduce(
    ch: Channel,
    src: Any,
    dst: Any,
    op: Op,
    chunk_bytes: int | None = None,
    on_final: Callable[[slice], None] | None = None,
) -> None:
    """dst <- op over all ranks of src (dst may be src): the reduce-scatter, then the all-gather.

    ``chunk_bytes``: the default chunking. ``on_final(piece)`` is called for every slice of
    ``dst`` once it holds its final value (all of them, each once, in the order they
    complete), so a caller can pass results on while the all-gather still runs; not on the
    staged (host-copy) path.
    """
    size, n = ch.size, src.size
    ch.step = 0  # exchanges begun in this call: the flight record's step (`hpcring.flight`)
    wait_nap(ch.config)  # read (and refused if bad) before anything moves, on every path
    order = ch.topology().ring
    pieces = None
    if ch.adapter.device:
        from . import ring_staged  # device memory only: a NumPy caller's first call never loads it

        pieces = ring_staged.pieces(n, size, src.dtype.itemsize, ch.config)
    if pieces is not None and not ch.adapter.direct:
        if on_final is not None:
            raise RuntimeError("ring.allreduce: on_final needs memory MPI reads directly, not staging")
        key = ("ring-staged", src.dtype, n, dst is src, pieces, order, ch.adapter.current_device())
        staged = ch.schedule(
            key, lambda: ring_staged.build(ch, n, src.dtype.itemsize, pieces, *around(size, ch.rank, order))
        )
        ring_staged.run(ch, staged, src, dst, op)
        return
    plan = schedule(ch, n, src.dtype.itemsize, own=False, chunk_bytes=chunk_bytes)
    reduce_scatter_phase(ch, plan, src, dst, op)
    ch.as_sent(dst[plan.segment(0)])  # wire=: keep what the others will receive
    all_gather_phase(ch, plan, dst, on_final)


def split(ch: Channel, n: int) -> Split:
    """The all-reduce of ``n`` elements as its two phases (`Split`): the owned segment is complete
    after the reduce-scatter, whose last step reduces each of its elements once. Each phase is
    scheduled for the dtype it moves (chunks are sized by bytes; the segments are the same)."""
    ch.step = 0
    wait_nap(ch.config)  # read (and refused if bad) before anything moves

    def plan(itemsize: int) -> Schedule:
        return schedule(ch, n, itemsize, own=False)

    def reduce_scatter(c: Channel, src: Any, dst: Any, op: Op) -> None:
        reduce_scatter_phase(c, plan(dst.dtype.itemsize), src, dst, op)

    def all_gather(c: Channel, dst: Any) -> None:
        all_gather_phase(c, plan(dst.dtype.itemsize), dst)

    def owners() -> tuple[tuple[int, slice], ...]:
        whole = plan(1)
        ranks = ch.topology().ring or tuple(range(ch.size))  # by position: neighbours first
        return tuple((ranks[p], whole.segments[whole.owned[p]]) for p in range(ch.size))

    return Split(plan(1).segment(0), reduce_scatter, all_gather, once=True, owners=owners)


def reduce_scatter(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- this rank's part of op over all ranks of src: phase 1 alone, ending with each rank
    owning its own part. In place (``dst`` is that part of ``src``) the rest of ``src`` holds
    partial sums afterwards; out of place they go to scratch the length of ``src``."""
    ch.step = 0
    wait_nap(ch.config)
    plan = schedule(ch, src.size, src.dtype.itemsize, own=True)
    mine = plan.segment(0)
    in_place = same_memory(dst, src[mine])
    work = src if in_place else ch.scratch("ring-work", src.size, src.dtype)
    reduce_scatter_phase(ch, plan, src, work, op)
    if not in_place:
        dst[...] = work[mine]


def allgather(ch: Channel, src: Any, dst: Any) -> None:
    """dst <- every rank's src, in rank order: phase 2 alone, from each rank's own row."""
    ch.step = 0
    wait_nap(ch.config)
    plan = schedule(ch, src.size, src.dtype.itemsize, own=True, rows=True)
    mine = plan.segment(0)
    if not same_memory(src, dst[mine]):
        dst[mine] = src
    all_gather_phase(ch, plan, dst)


def broadcast(ch: Channel, buf: Any, root: int) -> None:
    """buf <- the root's buf: a chain from the root around the ring in rank order, in chunks,
    each rank passing chunk k on to the right while chunk k + 1 arrives from the left."""
    size, n = ch.size, buf.size
    position = (ch.rank - root) % size  # the root is the chain's head, position 0
    left, right = (ch.rank - 1) % size, (ch.rank + 1) % size
    receive, forward = position > 0, position < size - 1
    chunk = chunk_elements(buf.dtype.itemsize, BROADCAST_CHUNK_BYTES, ch.config)
    pieces = [slice(*b) for b in chunk_bounds(0, n, chunk)]
    ch.step = 0
    if not ch.adapter.direct:  # staged device memory: blocking messages, one after another
        for piece in pieces:
            ch.step += 1
            if receive:
                ch.recv(buf[piece], left)
            if forward:
                ch.send(buf[piece], right)
        return
    nap = wait_nap(ch.config)
    receives = deque(ch.irecv(buf[piece], left) for piece in pieces[:DEPTH]) if receive else deque()
    sends: deque[Any] = deque()
    for k, piece in enumerate(pieces):
        ch.step += 1
        if receive:
            ch.wait(receives.popleft(), nap)
            if k + DEPTH < len(pieces):
                receives.append(ch.irecv(buf[pieces[k + DEPTH]], left))
        if forward:
            if len(sends) == DEPTH:
                ch.wait(sends.popleft(), nap)
            sends.append(ch.isend(buf[piece], right))
    ch.waitall(sends, nap)


# ---- formulas and traits ----------------------------------------------------------------------


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> int:
    """All-reduce: every segment but r+1 in the reduce-scatter, but r+2 in the all-gather.

    That is 2(G-1)/G·n exactly when G divides n, and within a couple of elements otherwise.
    """
    if size == 1 or count == 0:
        return 0
    bounds = segment_bounds(count, size)
    skipped = sum(stop - start for start, stop in (bounds[(rank + 1) % size], bounds[(rank + 2) % size]))
    return (2 * count - skipped) * itemsize


def split_sent(count: int, size: int, rank: int) -> tuple[int, int]:
    """The elements `bytes_sent` counts, by phase: (the reduce-scatter's, the all-gather's)."""
    if size == 1 or count == 0:
        return 0, 0
    bounds = segment_bounds(count, size)
    (a, b), (c, d) = bounds[(rank + 1) % size], bounds[(rank + 2) % size]
    return count - (b - a), count - (d - c)


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """Scratch this rank needs in place: about one segment, n/G (a few chunks when pipelined);
    out of place it receives into the output and needs none, which this bound ignores."""
    return -(-count // size) * itemsize if size > 1 else 0


def reduce_scatter_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """Reduce-scatter: every segment but this rank's own, once: (G-1)/G·n."""
    if size == 1 or count == 0:
        return 0
    start, stop = segment_bounds(count, size)[rank]
    return (count - (stop - start)) * itemsize


def reduce_scatter_scratch(count: int, itemsize: int, size: int, rank: int) -> int:
    """The partial sums of the whole buffer (out of place) and one incoming segment."""
    return (count + -(-count // size)) * itemsize if size > 1 else 0


def allgather_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """All-gather of ``count`` elements per rank: G-1 rows passed on: (G-1)·n."""
    return (size - 1) * count * itemsize if size > 1 else 0


def broadcast_bytes(count: int, itemsize: int, size: int, rank: int, root: int = 0) -> int:
    """Broadcast: every rank but the chain's tail (the root's left neighbour) passes n on once."""
    return 0 if size == 1 or (rank - root) % size == size - 1 else count * itemsize


def reduce_scatter_steps(n: float, p: int) -> list[Phase]:
    """p-1 steps of one n/p segment to the right neighbour, each added into the local copy."""
    return [Phase(p - 1, n / p, (p - 1) / p * n)] if p > 1 else []


def all_gather_steps(n: float, p: int) -> list[Phase]:
    """p-1 steps passing complete n/p segments to the right neighbour, no arithmetic."""
    return [Phase(p - 1, n / p, 0.0)] if p > 1 else []


def allreduce_steps(n: float, p: int) -> list[Phase]:
    return reduce_scatter_steps(n, p) + all_gather_steps(n, p)


def allgather_steps(n: float, p: int) -> list[Phase]:
    """All-gather of n bytes per rank: the all-gather phase of a buffer p times as large."""
    return all_gather_steps(n * p, p)


def broadcast_steps(n: float, p: int, chunk: float = BROADCAST_CHUNK_BYTES) -> list[Phase]:
    """G-2+k messages of n/k bytes one after another down the chain, k = n / chunk."""
    if p == 1:
        return []
    k = max(1, -(-int(n) // int(chunk)))
    return [Phase(p - 2 + k, n / k, 0.0)]


def picture(index: int, steps: int, size: int) -> str:
    phase = "reduce-scatter" if index <= size - 1 else "all-gather"
    what = "adds it in" if phase == "reduce-scatter" else "keeps it"
    return f"ring {phase}, step {index}/{steps}: each rank sends one segment right, the receiver {what}"


ALLREDUCE = Spec(
    run=allreduce,
    bytes_sent=bytes_sent,
    scratch_bytes=scratch_bytes,
    phases=allreduce_steps,
    narrowings=lambda size, per_node: size,  # G-1 hops of partial sums, then the owner's rounding
    stepped=True,
    ring_order=True,
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
BROADCAST = Spec(
    run=broadcast, bytes_sent=broadcast_bytes, scratch_bytes=no_scratch, phases=broadcast_steps, stepped=True
)
