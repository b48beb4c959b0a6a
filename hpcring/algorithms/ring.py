"""Ring all-reduce: reduce-scatter, then all-gather, around a ring of G ranks.

Cost (Thakur, Rabenseifner & Gropp 2005): 2(G-1)·alpha + 2(G-1)/G·n·beta + (G-1)/G·n·gamma.
Each rank sends 2(G-1)/G·n bytes, whatever G is: the bandwidth-optimal all-reduce.
"""

from __future__ import annotations

from typing import Any

from ..channel import Channel
from ..ops import Op
from ..partition import segment_bounds


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src)."""
    if dst is not src:
        dst[...] = src
    size, rank = ch.size, ch.rank
    if size == 1 or dst.size == 0:
        return
    seg = [slice(start, stop) for start, stop in segment_bounds(dst.size, size)]
    right, left = (rank + 1) % size, (rank - 1) % size
    incoming = ch.scratch("ring", seg[0].stop - seg[0].start, dst.dtype)  # segment 0 is largest

    # Reduce-scatter. At step s rank r sends its partial sum of segment (r - s) to the
    # right and adds the left neighbour's partial sum of segment (r - s - 1) into its own.
    # After G-1 steps rank r holds the complete sum of segment (r + 1) mod G.
    for step in range(size - 1):
        out_seg, in_seg = seg[(rank - step) % size], seg[(rank - step - 1) % size]
        buf = incoming[: in_seg.stop - in_seg.start]
        ch.sendrecv(dst[out_seg], right, buf, left)
        op.reduce(ch.xp, dst[in_seg], buf)

    # All-gather. At step s rank r passes on the complete segment (r + 1 - s) and
    # receives segment (r - s) straight into place: no reduction, so every rank ends
    # with the very bits its owner computed.
    for step in range(size - 1):
        out_seg, in_seg = seg[(rank + 1 - step) % size], seg[(rank - step) % size]
        ch.sendrecv(dst[out_seg], right, dst[in_seg], left)
