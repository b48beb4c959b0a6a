"""Parameter server: Gather every buffer to a root, reduce there, Bcast the result.

Cost: the root receives (G-1)·n and sends (G-1)·n bytes over its one link, so time grows
linearly with G: 2(G-1)·n·beta + (G-1)·n·gamma at the root (with linear Gather and Bcast).
"""

from __future__ import annotations

from typing import Any

from ..channel import Channel
from ..ops import Op
from ..tracing import local_copy

ROOT = 0


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src)."""
    size, n = ch.size, src.size
    if ch.rank == ROOT:
        stack = ch.scratch("ps", size * n, src.dtype).reshape(size, n)
        stack[ROOT] = src
        local_copy(stack[ROOT], src)
        ch.gather(None, stack, ROOT)
        dst[...] = stack[0]  # summed in rank order, as every algorithm here does
        local_copy(dst, stack[0])
        for row in range(1, size):
            op.reduce(ch.xp, dst, stack[row])
    else:
        ch.gather(src, None, ROOT)
    ch.bcast(dst, ROOT)


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> int:
    """Bytes this rank hands to MPI: the root broadcasts to G-1 ranks, the others send one row."""
    if size == 1:
        return 0
    return (size - 1) * count * itemsize if rank == ROOT else count * itemsize


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """Scratch this rank needs: the root holds all G rows, the others nothing."""
    return size * count * itemsize if rank == ROOT and size > 1 else 0
