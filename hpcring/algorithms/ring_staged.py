"""The ring through pinned host memory: CuPy buffers where MPI is not CUDA-aware.

Cost: the ring's (`hpcring.algorithms.ring`), plus a device-to-host and a host-to-device copy
of every piece, overlapped with MPI when staging streams. Not an algorithm of its own: the
ring runs this where device memory must be staged, on the same schedule and neighbours.

Host staging (CuPy buffers, MPI not CUDA-aware) can stream: each segment travels as equal
pieces of at most HPCRING_STAGING_CHUNK_BYTES (the same on every rank), so the device-to-host
copy of piece i+1 and the host-to-device copy and reduction of piece i-1 run on the GPU
while MPI moves piece i. Off by default (STAGING_CHUNK_BYTES None: one blocking Sendrecv per
segment, staged whole) until it has been measured on a GPU: the blocking staged ring is the
one measured on an H200 (docs/gpu.md). Its schedule is tested on every (G, n, pieces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import config
from ..partition import segment, segment_bounds

if TYPE_CHECKING:
    from ..channel import Channel
    from ..config import Config
    from ..ops import Op

STAGING_CHUNK_BYTES: int | None = None


@dataclass(frozen=True)
class Item:
    """One message of the staged ring: send ``out`` (of src or dst), receive into ``into``."""

    out: slice
    from_src: bool
    into: slice
    reduce: bool  # reduce-scatter (combine with src) or all-gather (copy)
    after: int  # the item whose device work wrote ``out`` (-1: none, it is the input)


@dataclass(frozen=True)
class StagedPlan:
    left: int
    right: int
    items: tuple[Item, ...]
    piece: int  # elements in the largest piece: one device scratch slot
    slots: int  # device scratch slots (2, or 1 when a segment is one piece)
    staging: Any  # the backend's Staging: pinned slots, streams, events


def staged_items(size: int, rank: int, count: int, pieces: int) -> list[Item]:
    """The ring's 2(G-1) steps, each segment cut into ``pieces`` equal pieces (so every rank's
    k-th send meets its right neighbour's k-th receive, whatever the segment lengths).

    Every item but those of reduce-scatter step 0 sends what item i - pieces wrote: the
    segment a rank sends at a step is the one it received (and reduced) at the step before.
    """
    segments = segment_bounds(count, size)

    def piece(index: int, k: int) -> slice:
        start, stop = segments[index % size]
        lo, hi = segment(stop - start, pieces, k)
        return slice(start + lo, start + hi)

    items: list[Item] = []
    for step in range(size - 1):  # reduce-scatter
        for k in range(pieces):
            after = -1 if step == 0 else len(items) - pieces
            items.append(Item(piece(rank - step, k), step == 0, piece(rank - step - 1, k), True, after))
    for step in range(size - 1):  # all-gather
        for k in range(pieces):
            after = len(items) - pieces
            items.append(Item(piece(rank + 1 - step, k), False, piece(rank - step, k), False, after))
    return items


def staging_chunk_bytes(settings: Config | None = None) -> int | None:
    """Largest piece of streamed host staging: HPCRING_STAGING_CHUNK_BYTES of ``settings``
    (default `config.current()`), else STAGING_CHUNK_BYTES; None when staging does not
    stream (whole segments)."""
    limit = (settings or config.current()).staging_chunk_bytes
    return STAGING_CHUNK_BYTES if limit is None else limit


def pieces(count: int, size: int, itemsize: int, settings: Config | None = None) -> int | None:
    """Pieces per segment for streamed host staging; None when staging does not stream."""
    limit = staging_chunk_bytes(settings)
    if limit is None:
        return None
    largest = -(-count // size) * itemsize
    return max(1, -(-largest // limit))


def build(
    ch: Channel, count: int, itemsize: int, pieces: int, position: int, left: int, right: int
) -> StagedPlan:
    """The plan of this rank, at ``position`` in the ring between ``left`` and ``right``."""
    items = staged_items(ch.size, position, count, pieces)
    piece = max(max(it.out.stop - it.out.start, it.into.stop - it.into.start) for it in items)
    return StagedPlan(
        left=left,
        right=right,
        items=tuple(items),
        piece=piece,
        slots=min(2, pieces),
        staging=ch.adapter.staging(piece * itemsize, pieces + 1),
    )


def run(ch: Channel, plan: StagedPlan, src: Any, dst: Any, op: Op) -> None:
    """The ring through pinned host memory, with the GPU copies overlapped with MPI.

    MPI only ever sees a send slot whose copy has landed and a receive slot the device
    has finished reading. A piece is copied out only after the device work of the item
    that wrote it (`Item.after`), enforced on the GPU by an event, not by the host.
    """
    st, items, itemsize = plan.staging, plan.items, dst.dtype.itemsize
    scratch = ch.scratch("ring", plan.slots * plan.piece, dst.dtype)

    def copy_out(i: int) -> None:
        item = items[i]
        st.to_host(i, (src if item.from_src else dst)[item.out], item.after)

    st.begin()
    copy_out(0)
    queued = 1  # items whose device-to-host copy is queued
    for i, item in enumerate(items):
        if queued == i + 1 < len(items) and items[i + 1].after < i:
            copy_out(i + 1)  # overlaps this item's MPI transfer
            queued += 1
        into = item.into.stop - item.into.start
        send = st.sent(i, (item.out.stop - item.out.start) * itemsize)
        ch.sendrecv_host(send, plan.right, st.received(i, into * itemsize), plan.left)
        if item.reduce:
            slot = (i % plan.slots) * plan.piece
            landed = scratch[slot : slot + into]
            st.to_device(i, landed)
            with st.compute:
                op.combine(ch.xp, src[item.into], landed, dst[item.into])
        else:
            st.to_device(i, dst[item.into])
        st.mark(i)
        if queued == i + 1 < len(items):  # it needed this item's result
            copy_out(i + 1)
            queued += 1
    st.finish()
