"""Ring all-reduce: reduce-scatter, then all-gather, around a ring of G ranks, optionally pipelined.

Cost (Thakur, Rabenseifner & Gropp 2005): 2(G-1)·alpha + 2(G-1)/G·n·beta + (G-1)/G·n·gamma.
Each rank sends 2(G-1)/G·n bytes, whatever G is: the bandwidth-optimal all-reduce.

With ``HPCRING_CHUNK_BYTES`` set (the communicator's `Channel.config`; every rank must use the same value),
segments larger than that travel as chunks of that size; otherwise, and by default
(see CHUNK_BYTES), each step is one Sendrecv of a whole segment, except that a ring
spanning several nodes streams in chunks of NETWORK_CHUNK_BYTES. Chunks
are received a few ahead into a small reused scratch, so while chunk k is being reduced
chunk k+1 is already on its way, and a reduced chunk is sent on at once instead of
waiting for its whole segment. Out of place, step 0 sends straight from the input and
the first reduction writes the output, so the input is never copied; the all-gather
receives straight into the output.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import config, topology
from ..channel import Channel
from ..config import Config
from ..ops import Op
from ..partition import chunk_bounds, segment_bounds
from ..wire import WireChannel, gathering, round_owned
from . import ring_staged

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
UNCHUNKED = 1 << 62  # elements per "chunk" when nothing is chunked: every segment is one piece
DEPTH = 4  # at most: receives posted ahead, and sends in flight
RING_ORDER = True  # runs in `Topology.order`: bytes_sent's rank is the position in that order


@dataclass(frozen=True)
class Phase:
    """One half of the ring as a stream of chunks (all slices of the flat buffer).

    The rank first sends ``first`` (a segment it already holds), then every incoming
    chunk in turn, once it has arrived (and been reduced), except those of the last segment.
    """

    first: tuple[slice, ...]
    incoming: tuple[slice, ...]
    forward: int  # how many incoming chunks are passed on to the right


@dataclass(frozen=True)
class Plan:
    rank: int
    left: int
    right: int
    segments: tuple[slice, ...]
    pipelined: bool  # some segment is more than one chunk: worth streaming
    reduce_scatter: Phase
    all_gather: Phase
    chunk: int  # elements per chunk, and per scratch slot
    depth: int  # receives posted ahead and sends in flight: DEPTH, or fewer if segments are short


def _around(size: int, rank: int, order: tuple[int, ...] | None) -> tuple[int, int, int]:
    """(position, left, right) of ``rank`` in a ring of ``size`` that runs in ``order``
    (the ranks grouped by node, `Topology.order`; None: rank order)."""
    ranks = order or range(size)
    position = ranks.index(rank)
    return position, ranks[(position - 1) % size], ranks[(position + 1) % size]


def _build(size: int, rank: int, count: int, chunk: int, order: tuple[int, ...] | None = None) -> Plan:
    # The schedule below runs on positions in ``order``, so "rank" is this rank's position.
    rank, left, right = _around(size, rank, order)
    segments = segment_bounds(count, size)

    def chunks(segment: int) -> tuple[slice, ...]:
        return tuple(slice(*b) for b in chunk_bounds(*segments[segment % size], chunk))

    def phase(first: int, incoming: list[int]) -> Phase:
        pieces = [chunks(segment) for segment in incoming]
        return Phase(chunks(first), sum(pieces, ()), sum(map(len, pieces[:-1])))

    # Reduce-scatter: at step s rank r sends its partial sum of segment r - s and receives
    # the left neighbour's partial sum of segment r - s - 1, which it reduces and sends on
    # at step s + 1. After G-1 steps rank r holds the complete segment r + 1.
    # All-gather: rank r starts with segment r + 1 and receives r, r - 1, ..., r - G + 2,
    # passing each on, straight into place: no reduction, so every rank ends with the very
    # bits the segment's owner computed.
    return Plan(
        rank=rank,
        left=left,
        right=right,
        segments=tuple(slice(*b) for b in segments),
        pipelined=segments[0][1] - segments[0][0] > chunk,
        reduce_scatter=phase(rank, [rank - step - 1 for step in range(size - 1)]),
        all_gather=phase(rank + 1, [rank - step for step in range(size - 1)]),
        chunk=chunk,
        # Scratch is depth chunks: never much more than one segment, as unpipelined.
        depth=min(DEPTH, -(-(segments[0][1] - segments[0][0]) // chunk)),
    )


def _stream(
    ch: Channel,
    plan: Plan,
    phase: Phase,
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
    # Out of place the chunk lands in the output and is reduced there (see `_blocking`).
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


def _blocking(
    ch: Channel, plan: Plan, src: Any, dst: Any, op: Op, on_final: Callable[[slice], None] | None = None
) -> None:
    """One Sendrecv per step, whole segments: the ring when there is nothing to pipeline.

    Same schedule as the streams above with one chunk per segment. Step 0 sends from
    ``src`` and each reduction reads ``src`` and writes ``dst``: every segment is reduced
    at most once per rank, and sent only after that, so out of place needs no copy.

    Out of place, the incoming segment lands straight in ``dst`` (nothing has written that
    segment of ``dst`` yet, and no send reads it) and is reduced there, operands in the
    same order as from scratch, so the same bits. That saves a scratch segment's worth of
    cache, and the reduction writes memory the receive has just brought in: at 2 ranks
    the ring took 15-25% less time from 1 to 256 MiB (16 MiB: 2645 -> 2040 us).
    """
    size, rank, seg = len(plan.segments), plan.rank, plan.segments
    incoming = None if dst is not src else ch.scratch("ring", seg[0].stop - seg[0].start, dst.dtype)
    reduce_scatter(ch, seg, rank, plan.left, plan.right, src, dst, op, incoming)
    round_owned(ch, dst[seg[(rank + 1) % size]])  # wire=: keep what the others will receive
    if on_final is not None:
        on_final(seg[(rank + 1) % size])
    with gathering(ch):  # wire=: what is passed on now is on the wire grid
        for step in range(size - 1):
            ch.step += 1  # the flight record's step: G-1 of the reduce-scatter, then these
            out_seg, in_seg = seg[(rank + 1 - step) % size], seg[(rank - step) % size]
            ch.sendrecv(dst[out_seg], plan.right, dst[in_seg], plan.left)
            if on_final is not None:
                on_final(in_seg)


def reduce_scatter(
    ch: Channel,
    segments: tuple[slice, ...],
    position: int,
    left: int,
    right: int,
    src: Any,
    dst: Any,
    op: Op,
    incoming: Any = None,
) -> None:
    """The ring's reduce-scatter, one Sendrecv per step: afterwards ``dst`` at segment
    ``position + 1`` holds the sum over the ring (``left``/``right``: the neighbours).

    ``incoming`` is scratch of the largest segment, needed in place (``dst`` still holds
    this rank's data where a segment arrives); out of place (None) each segment lands in
    ``dst`` and is reduced there (see `_blocking`). Also `hierarchical`'s step inside a node.
    """
    size = len(segments)
    for step in range(size - 1):
        ch.step += 1  # the flight record's step (`hpcring.flight`): exchanges begun this call
        out_seg, in_seg = segments[(position - step) % size], segments[(position - step - 1) % size]
        buf = dst[in_seg] if incoming is None else incoming[: in_seg.stop - in_seg.start]
        ch.sendrecv((src if step == 0 else dst)[out_seg], right, buf, left)
        op.combine(ch.xp, src[in_seg], buf, dst[in_seg])


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


def allreduce(
    ch: Channel,
    src: Any,
    dst: Any,
    op: Op,
    chunk_bytes: int | None = None,
    on_final: Callable[[slice], None] | None = None,
) -> None:
    """dst <- op over all ranks of src (dst may be src); ``chunk_bytes``: the default chunking.

    ``on_final(piece)`` is called for every slice of ``dst`` once it holds its final value
    (all of them, each once, in the order they complete), so a caller can pass results on
    while the all-gather still runs; not on the staged (host-copy) path.
    """
    size, n, settings = ch.size, src.size, ch.config
    ch.step = 0  # exchanges begun in this call: the flight record's step (`hpcring.flight`)
    nap = wait_nap(settings)  # read (and refused if bad) before anything moves, on every path
    topo = topology.of(ch.comm, ch)
    order = topo.ring  # neighbours share a node wherever placement allows
    if chunk_bytes is None and topo.nodes > 1:
        chunk_bytes = NETWORK_CHUNK_BYTES  # the ring crosses a network
    pieces = ring_staged.pieces(n, size, src.dtype.itemsize, settings) if ch.backend.device else None
    if pieces is not None and not ch.backend.direct:
        if on_final is not None:
            raise RuntimeError("ring.allreduce: on_final needs memory MPI reads directly, not staging")
        key = ("ring-staged", src.dtype, n, dst is src, pieces, order, ch.backend.current_device())
        staged = ch.plan(
            key, lambda: ring_staged.build(ch, n, src.dtype.itemsize, pieces, *_around(size, ch.rank, order))
        )
        ring_staged.run(ch, staged, src, dst, op)
        return
    # wire=: chunks are sized by what travels (60 KiB messages stay under the eager limit)
    itemsize = ch.wire.itemsize if isinstance(ch, WireChannel) else src.dtype.itemsize
    chunk = chunk_elements(itemsize, chunk_bytes, settings)
    plan = ch.plan(
        ("ring", src.dtype, n, dst is src, chunk, order), lambda: _build(size, ch.rank, n, chunk, order)
    )
    # Non-blocking MPI needs the array's own memory for the life of the request. A staged
    # device buffer (CuPy without CUDA-aware MPI) is a shared pinned copy valid for one
    # blocking call only, so that case keeps the blocking ring.
    if plan.pipelined and ch.backend.direct:
        _stream(ch, plan, plan.reduce_scatter, src, dst, op, nap)
        round_owned(ch, dst[plan.segments[(plan.rank + 1) % size]])
        with gathering(ch):  # wire=: owned or received values only, on the wire grid
            _stream(ch, plan, plan.all_gather, dst, dst, None, nap, on_final)
    else:
        _blocking(ch, plan, src, dst, op, on_final)


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> int:
    """Bytes this rank hands to MPI: every segment but r+1 in the reduce-scatter, but r+2 after.

    That is 2(G-1)/G·n exactly when G divides n, and within a couple of elements otherwise.
    """
    if size == 1 or count == 0:
        return 0
    bounds = segment_bounds(count, size)
    skipped = sum(stop - start for start, stop in (bounds[(rank + 1) % size], bounds[(rank + 2) % size]))
    return (2 * count - skipped) * itemsize


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """Scratch this rank needs in place: about one segment, n/G (a few chunks when pipelined);
    out of place it receives into the output and needs none, which this bound ignores."""
    return -(-count // size) * itemsize if size > 1 else 0
