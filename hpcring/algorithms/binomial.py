"""Binomial-tree broadcast: in round s every rank that has the data sends it to the rank 2^s
further on (counted from the root), so the data reaches all G ranks in ceil(log2 G) rounds.

Cost: ceil(log2 G)·(alpha + n·beta): the fewest rounds, each a whole buffer. It wins where
alpha matters (small n, large G); for large n the ring's pipelined chain approaches n·beta.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .base import Phase, Spec, no_scratch

if TYPE_CHECKING:
    from ..channel import Channel


def broadcast(ch: Channel, buf: Any, root: int) -> None:
    """buf <- the root's buf. A rank at distance d from the root (d = rank - root mod G) gets the
    data in the round of d's highest bit, from d minus that bit, and then sends it on to d + 2^s
    for every later round s."""
    size = ch.size
    parent, children = _parent_and_children((ch.rank - root) % size, size)
    ch.step = 0
    if parent is not None:
        ch.step += 1
        ch.recv(buf, (root + parent) % size)
    for child in children:
        ch.step += 1
        ch.send(buf, (root + child) % size)


def _parent_and_children(distance: int, size: int) -> tuple[int | None, list[int]]:
    """(the distance this one receives from, the distances it sends to, in order)."""
    if distance == 0:
        parent, high = None, 0
    else:
        high = 1 << (distance.bit_length() - 1)
        parent = distance - high
    children = []
    bit = 1 if distance == 0 else high << 1
    while distance + bit < size:
        children.append(distance + bit)
        bit <<= 1
    return parent, children


def bytes_sent(count: int, itemsize: int, size: int, rank: int, root: int = 0) -> int:
    """The whole buffer to each child in the tree."""
    return len(_parent_and_children((rank - root) % size, size)[1]) * count * itemsize


def steps(n: float, p: int) -> list[Phase]:
    """ceil(log2 p) rounds of one whole buffer; in the early ones most ranks only wait."""
    rounds = range(math.ceil(math.log2(p))) if p > 1 else range(0)
    return [Phase(1, n, 0.0, 1 << s, "xor", 2 * min(1 << s, p - (1 << s)) < p) for s in rounds]


BROADCAST = Spec(run=broadcast, bytes_sent=bytes_sent, scratch_bytes=no_scratch, phases=steps, stepped=True)
