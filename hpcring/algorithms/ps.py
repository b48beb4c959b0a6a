"""Parameter server: Gather every buffer to a root, reduce there, Bcast the result.

Cost: the root receives (G-1)·n and sends (G-1)·n bytes over its one link, so time grows
linearly with G: 2(G-1)·n·beta + (G-1)·n·gamma at the root (with linear Gather and Bcast).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..tracing import local_copy
from .base import Phase, Spec

if TYPE_CHECKING:
    from ..channel import Channel
    from ..ops import Op

ROOT = 0
COPIES = 2  # whole-buffer copies the root makes besides reducing (into the stack, out of it)


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


def steps(n: float, p: int, bcast: str = "binomial") -> list[Phase]:
    """Gather: the root receives p-1 buffers one at a time over its link; reduce; Bcast back
    (``bcast``: the library's tree, "binomial", or "linear", one rank after another)."""
    if p == 1:
        return []
    gather = [Phase(1, n, 0.0, d, "single") for d in range(1, p)]
    reduce = [Phase(0, 0.0, (p - 1) * n + COPIES * n, 0, "root")]  # and the root's two copies
    if bcast == "linear":
        back = [Phase(1, n, 0.0, d, "single") for d in range(1, p)]
    else:  # binomial tree: at step s every rank that has the data sends to r + 2^s, where there is one
        rounds = range(math.ceil(math.log2(p)))
        back = [Phase(1, n, 0.0, 1 << s, "xor", 2 * min(1 << s, p - (1 << s)) < p) for s in rounds]
    return gather + reduce + back


ALLREDUCE = Spec(
    run=allreduce,
    bytes_sent=bytes_sent,
    scratch_bytes=scratch_bytes,
    phases=steps,
    library_steps=True,  # MPI_Gather and MPI_Bcast: their messages are the library's
    narrowings=lambda size, per_node: 2,  # each input on its way to the root, the sum on the way back
)
