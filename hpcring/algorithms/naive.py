"""Naive all-reduce: every rank sends its whole buffer to every other rank.

Cost: (G-1)·alpha + (G-1)·n·beta + (G-1)·n·gamma per rank, G(G-1)·n bytes in all.
The G-1 exchanges are shifted (at step s, rank r sends to r+s and receives from r-s),
so every link is busy at once; then each rank sums the G copies in rank order, which
makes the result bitwise identical everywhere.
"""

from __future__ import annotations

from typing import Any

from ..channel import Channel
from ..ops import Op
from ..tracing import local_copy
from ..wire import round_owned


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src)."""
    size, rank, n = ch.size, ch.rank, src.size
    copies = ch.scratch("naive", size * n, src.dtype).reshape(size, n)  # row r: rank r's buffer
    copies[rank] = src
    local_copy(copies[rank], src)
    round_owned(ch, copies[rank])  # wire=: sum the copy the others receive, so every rank agrees
    for step in range(1, size):
        ch.sendrecv(src, (rank + step) % size, copies[(rank - step) % size], (rank - step) % size)
    dst[...] = copies[0]
    local_copy(dst, copies[0])
    for row in range(1, size):
        op.reduce(ch.xp, dst, copies[row])


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> int:
    """Bytes this rank hands to MPI: its whole buffer to each of the G-1 others."""
    return (size - 1) * count * itemsize if size > 1 else 0


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """Scratch this rank needs: all G copies, G·n."""
    return size * count * itemsize if size > 1 else 0
