"""Naive: every rank sends straight to every rank that needs its data, no forwarding.

All-reduce: every rank sends its whole buffer to every other rank, then sums the G copies in
rank order, which makes the result bitwise identical everywhere. Cost: (G-1)·alpha +
(G-1)·n·beta + (G-1)·n·gamma per rank, G(G-1)·n bytes in all. The G-1 exchanges are shifted
(at step s, rank r sends to r+s and receives from r-s), so every link is busy at once.

Reduce-scatter: every rank sends each part straight to its owner, which sums the G parts in
rank order: (G-1)·alpha + (G-1)/G·n·beta, the ring's bytes in one step's latency per peer.
All-gather: every rank sends its buffer to every other rank: (G-1)·alpha + (G-1)·n·beta.
Broadcast: the root sends the whole buffer to each rank in turn (flat from the root, what the
parameter server's second half does): (G-1)·(alpha + n·beta) at the root.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..partition import segment_bounds
from ..tracing import local_copy
from .base import Phase, Spec, no_scratch, same_memory

if TYPE_CHECKING:
    from ..channel import Channel
    from ..ops import Op


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src)."""
    size, rank, n = ch.size, ch.rank, src.size
    copies = ch.scratch("naive", size * n, src.dtype).reshape(size, n)  # row r: rank r's buffer
    copies[rank] = src
    local_copy(copies[rank], src)
    ch.as_sent(copies[rank])  # wire=: sum the copy the others receive, so every rank agrees
    for step in range(1, size):
        ch.sendrecv(copies[rank], (rank + step) % size, copies[(rank - step) % size], (rank - step) % size)
    dst[...] = copies[0]
    local_copy(dst, copies[0])
    for row in range(1, size):
        op.reduce(ch.xp, dst, copies[row])


def reduce_scatter(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- this rank's part of op over all ranks of src, summed in rank order."""
    size, rank = ch.size, ch.rank
    parts = segment_bounds(src.size, size)
    start, stop = parts[rank]
    m = stop - start
    copies = ch.scratch("naive", size * m, src.dtype).reshape(size, m)  # row r: rank r's part
    copies[rank] = src[start:stop]
    local_copy(copies[rank], src[start:stop])
    for step in range(1, size):
        to, frm = (rank + step) % size, (rank - step) % size
        ch.sendrecv(src[slice(*parts[to])], to, copies[frm], frm)
    dst[...] = copies[0]
    local_copy(dst, copies[0])
    for row in range(1, size):
        op.reduce(ch.xp, dst, copies[row])


def allgather(ch: Channel, src: Any, dst: Any) -> None:
    """dst <- every rank's src in rank order, each received straight into its row."""
    size, rank, m = ch.size, ch.rank, src.size
    rows = dst.reshape(size, m)
    if not same_memory(src, rows[rank]):
        rows[rank] = src
        local_copy(rows[rank], src)
    for step in range(1, size):
        ch.sendrecv(src, (rank + step) % size, rows[(rank - step) % size], (rank - step) % size)


def broadcast(ch: Channel, buf: Any, root: int) -> None:
    """buf <- the root's buf, sent by the root to every rank in turn."""
    if ch.rank != root:
        ch.recv(buf, root)
        return
    for step in range(1, ch.size):
        ch.send(buf, (root + step) % ch.size)


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> int:
    """All-reduce and all-gather: the whole buffer to each of the G-1 others."""
    return (size - 1) * count * itemsize if size > 1 else 0


def reduce_scatter_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """Every part but this rank's own, to its owner."""
    if size == 1:
        return 0
    start, stop = segment_bounds(count, size)[rank]
    return (count - (stop - start)) * itemsize


def broadcast_bytes(count: int, itemsize: int, size: int, rank: int, root: int = 0) -> int:
    """The root sends the whole buffer to each of the G-1 others."""
    return (size - 1) * count * itemsize if rank == root else 0


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """All G copies, G·n."""
    return size * count * itemsize if size > 1 else 0


def reduce_scatter_scratch(count: int, itemsize: int, size: int, rank: int) -> int:
    """G copies of this rank's part."""
    return size * -(-count // size) * itemsize if size > 1 else 0


COPIES = 2  # whole-buffer copies every rank makes besides reducing (into the scratch, out of it)


def allreduce_steps(n: float, p: int) -> list[Phase]:
    """Step s: every rank sends its whole buffer to r+s; then each rank reduces p copies.

    Two copies of n on every rank as well (its own buffer into the p-row scratch, and row 0
    into the result): a copy is one memory-bound pass like a reduction, so it costs gamma.
    """
    if p == 1:
        return []
    exchanges = [Phase(1, n, 0.0, s, "shift") for s in range(1, p)]
    return [*exchanges, Phase(0, 0.0, (p - 1) * n + COPIES * n, 0, "local")]


def reduce_scatter_steps(n: float, p: int) -> list[Phase]:
    if p == 1:
        return []
    exchanges = [Phase(1, n / p, 0.0, s, "shift") for s in range(1, p)]
    return [*exchanges, Phase(0, 0.0, (p - 1) * n / p + COPIES * n / p, 0, "local")]


def allgather_steps(n: float, p: int) -> list[Phase]:
    return [Phase(1, n, 0.0, s, "shift") for s in range(1, p)]


def broadcast_steps(n: float, p: int) -> list[Phase]:
    return [Phase(1, n, 0.0, d, "single") for d in range(1, p)]


def picture(index: int, steps: int, size: int) -> str:
    extra = "; then each rank sums all copies" if index == steps else ""
    return f"naive step {index}/{steps}: rank r sends its whole buffer to r+{index}{extra}"


ALLREDUCE = Spec(
    run=allreduce,
    bytes_sent=bytes_sent,
    scratch_bytes=scratch_bytes,
    phases=allreduce_steps,
    narrowings=lambda size, per_node: 1,  # each input once; the sum is done wide, in rank order
    picture=picture,
)
REDUCE_SCATTER = Spec(
    run=reduce_scatter,
    bytes_sent=reduce_scatter_bytes,
    scratch_bytes=reduce_scatter_scratch,
    phases=reduce_scatter_steps,
)
ALLGATHER = Spec(run=allgather, bytes_sent=bytes_sent, scratch_bytes=no_scratch, phases=allgather_steps)
BROADCAST = Spec(run=broadcast, bytes_sent=broadcast_bytes, scratch_bytes=no_scratch, phases=broadcast_steps)
