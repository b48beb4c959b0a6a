"""Pairwise exchange: the all-to-all in G-1 steps, one partner each way per step.

At step s rank r sends its block for rank r+s and receives rank r-s's block for it, straight
from the input into the output (no scratch, no copies but its own block): every link is busy
at every step, and each rank has one message in flight each way, so a large exchange never
floods a receiver with G-1 at once (what the linear "post everything, wait for all" does).
It runs equal blocks and uneven ones alike (MPI_Alltoall and MPI_Alltoallv): a block of zero
elements is still a message, so sender and receiver meet at every step.

Cost: (G-1)·alpha + (G-1)/G·n·beta per rank for equal blocks of n bytes in all; the bytes are
the least an all-to-all can move, so it is the algorithm for large blocks (Thakur, Rabenseifner
& Gropp 2005: MPICH's choice from 32 KiB per block).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..tracing import local_copy
from .base import Layout, Phase, Spec, no_scratch

if TYPE_CHECKING:
    from ..channel import Channel


def alltoall(ch: Channel, src: Any, dst: Any, layout: Layout) -> None:
    """dst <- every rank's block for this rank, at the layout's places, in G-1 shifted steps; the
    first step's messages in flight while this rank copies its own block (where MPI takes the
    arrays as they are: host memory, CUDA-aware MPI)."""
    size, rank = ch.size, ch.rank
    sc, sd, rc, rd = layout.send_counts, layout.send_displs, layout.recv_counts, layout.recv_displs

    def copy_own() -> None:
        if rc[rank]:
            own, mine = dst[rd[rank] : rd[rank] + rc[rank]], src[sd[rank] : sd[rank] + sc[rank]]
            own[...] = mine
            local_copy(own, mine)

    overlap = ch.adapter.direct
    if not overlap:
        copy_own()
    for step in range(1, size):
        to, frm = (rank + step) % size, (rank - step) % size
        ch.step = step
        send, recv = src[sd[to] : sd[to] + sc[to]], dst[rd[frm] : rd[frm] + rc[frm]]
        if not overlap:
            ch.sendrecv(send, to, recv, frm)
            continue
        received = ch.irecv(recv, frm)
        sent = ch.isend(send, to)
        if step == 1:
            copy_own()
        ch.wait(received)
        ch.wait(sent)


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> int:
    """Equal blocks: every block but this rank's own, once, to its owner: (G-1)/G of the input."""
    return (size - 1) * (count // size) * itemsize if size > 1 else 0


def steps(n: float, p: int) -> list[Phase]:
    """Step s: every rank sends one block (n/p bytes) to r+s."""
    return [Phase(1, n / p, 0.0, s, "shift") for s in range(1, p)]


def picture(index: int, steps: int, size: int) -> str:
    return f"pairwise step {index}/{steps}: rank r sends its block for r+{index} to it"


ALLTOALL = Spec(
    run=alltoall,
    bytes_sent=bytes_sent,
    scratch_bytes=no_scratch,
    phases=steps,
    stepped=True,
    picture=picture,
)
