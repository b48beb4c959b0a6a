"""Bruck: the all-to-all in ceil(log2 G) steps, for small blocks, where latency decides.

Bruck, Ho, Kipnis, Upfal & Weathersby (1997), as MPICH runs it for short messages: each rank
first rotates its blocks so that block i is the one for rank r+i; at step k (distance 2^k) it
sends every block whose index has bit k set to rank r+2^k, packed into one message, and puts
what rank r-2^k sends into the same places; after the last step block i holds what rank r-i
sent this rank, and an inverse rotation puts the blocks in rank order. A block travels once per
bit set in its distance, so about half the data crosses each step.

Cost: ceil(log2 G)·alpha + ceil(log2 G)·n/2·beta per rank for n bytes in all, plus three local
passes over n (rotate, pack and unpack, rotate back): fewer messages than pairwise's G-1, more
bytes. Equal blocks only (MPI_Alltoall): an uneven exchange (send_splits=) is refused for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..tracing import local_copy
from .base import Layout, Phase, Spec

if TYPE_CHECKING:
    from ..channel import Channel


def _moving(size: int, distance: int) -> list[int]:
    """The block indexes with the bit of ``distance`` set: what one step sends."""
    return [i for i in range(size) if i & distance]


def alltoall(ch: Channel, src: Any, dst: Any, layout: Layout) -> None:
    """dst <- every rank's block for this rank, in ceil(log2 G) steps of packed blocks."""
    size, rank, m = ch.size, ch.rank, layout.block
    work = ch.scratch("bruck", size * m, src.dtype).reshape(size, m)  # block i: for rank r+i
    blocks = src.reshape(size, m)
    for i in range(size):  # rotate: block i is the one for rank r+i
        work[i] = blocks[(rank + i) % size]
        local_copy(work[i], blocks[(rank + i) % size])
    half = (size + 1) // 2
    outgoing = ch.scratch("bruck-send", half * m, src.dtype).reshape(half, m)
    incoming = ch.scratch("bruck-recv", half * m, src.dtype).reshape(half, m)
    distance, step = 1, 0
    while distance < size:
        moving = _moving(size, distance)
        for j, i in enumerate(moving):
            outgoing[j] = work[i]
            local_copy(outgoing[j], work[i])
        step += 1
        ch.step = step
        k = len(moving)
        to, frm = (rank + distance) % size, (rank - distance) % size
        ch.sendrecv(outgoing[:k].reshape(-1), to, incoming[:k].reshape(-1), frm)
        for j, i in enumerate(moving):
            work[i] = incoming[j]
            local_copy(work[i], incoming[j])
        distance <<= 1
    rows = dst.reshape(size, m)
    for i in range(size):  # block i came from rank r-i: into its row, in rank order
        rows[(rank - i) % size] = work[i]
        local_copy(rows[(rank - i) % size], work[i])


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> int:
    """At each distance 2^k, the blocks whose index has that bit set."""
    if size == 1:
        return 0
    block = count // size * itemsize
    sent, distance = 0, 1
    while distance < size:
        sent += len(_moving(size, distance)) * block
        distance <<= 1
    return sent


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """The rotated blocks (n) and one step's packed blocks each way (about n/2 each)."""
    if size == 1:
        return 0
    block = count // size * itemsize
    return (size + 2 * ((size + 1) // 2)) * block


PASSES = 3  # local passes over the whole buffer: the rotation, the packing and unpacking, the rotation back


def steps(n: float, p: int) -> list[Phase]:
    """Step k: every rank sends the blocks with bit k set (about n/2) to r+2^k; and the local passes."""
    if p == 1:
        return []
    phases, distance = [], 1
    while distance < p:
        phases.append(Phase(1, len(_moving(p, distance)) * n / p, 0.0, distance, "shift"))
        distance <<= 1
    return [*phases, Phase(0, 0.0, PASSES * n, 0, "local")]


def picture(index: int, steps: int, size: int) -> str:
    distance = 1 << (index - 1)
    return f"bruck step {index}/{steps}: rank r sends its blocks with bit {distance} set to r+{distance}"


ALLTOALL = Spec(
    run=alltoall,
    bytes_sent=bytes_sent,
    scratch_bytes=scratch_bytes,
    phases=steps,
    stepped=True,
    picture=picture,
    equal_only=True,
)
