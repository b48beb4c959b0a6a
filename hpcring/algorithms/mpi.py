"""The MPI library's own collectives: the baselines every other algorithm is measured against.

Cost: the library's choice (recursive doubling, Rabenseifner, ring, trees... by size and G).
A reduction needs a datatype the library knows. MPI has none for bfloat16: there the words
travel as MPI_UINT16_T and a user-defined op (mpi4py's `MPI.Op.Create`) applies the op to them
as bfloat16, which is what an MPI program does for a type of its own. The all-gather, the
broadcast and the all-to-all (MPI_Alltoall, MPI_Alltoallv for uneven blocks) move raw bytes, so
every dtype travels. Each is one blocking library call, so the
watchdog covers a rank frozen inside it (`hpcring.watchdog`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ..partition import segment_bounds
from .base import Layout, Spec, no_scratch, same_memory

if TYPE_CHECKING:
    from ..channel import Channel
    from ..ops import Op


def _typed(op: Op, src: Any, dst: Any) -> tuple[Any, Any, Any]:
    """(src, dst, MPI op) as MPI reduces them: bfloat16 as 16-bit words under a user-defined op."""
    if src.dtype.name != "bfloat16":
        return src, dst, op.mpi_op()
    words = src.view("uint16")
    return words, words if dst is src else dst.view("uint16"), user_op(op, src.dtype)


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src), by MPI_Allreduce."""
    ch.allreduce(*_typed(op, src, dst))


def reduce_scatter(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- this rank's part of op over all ranks of src, by MPI_Reduce_scatter with the parts'
    counts (the library may not alias its input and output: in place, or an empty part whose
    view points into the input, which MPICH refuses as aliased, through scratch)."""
    counts = [stop - start for start, stop in segment_bounds(src.size, ch.size)]
    start = sum(counts[: ch.rank])
    into = dst
    if not dst.size or same_memory(dst, src[start : start + counts[ch.rank]]):
        into = ch.scratch("mpi", dst.size, dst.dtype)
    send, recv, mpi_op = _typed(op, src, into)
    ch.reduce_scatter(send, recv, counts, mpi_op)
    if into is not dst:
        dst[...] = into


def allgather(ch: Channel, src: Any, dst: Any) -> None:
    """dst <- every rank's src in rank order, by MPI_Allgather (MPI_IN_PLACE where src is this
    rank's row of dst)."""
    m = src.size
    ch.allgather(None if same_memory(src, dst[ch.rank * m : (ch.rank + 1) * m]) else src, dst)


def broadcast(ch: Channel, buf: Any, root: int) -> None:
    """buf <- the root's buf, by MPI_Bcast."""
    ch.broadcast(buf, root)


def alltoall(ch: Channel, src: Any, dst: Any, layout: Layout) -> None:
    """dst <- every rank's block for this rank, by MPI_Alltoall (equal blocks) or MPI_Alltoallv."""
    if layout.equal:
        ch.alltoall(src, dst)
        return
    ch.alltoallv(src, layout.send_counts, layout.send_displs, dst, layout.recv_counts, layout.recv_displs)


def persistent(ch: Channel, src: Any, dst: Any, op: Op) -> Any:
    """MPI-4's persistent all-reduce on these buffers (`hpcring.plan`), where the library has it."""
    return ch.allreduce_init(*_typed(op, src, dst))


@functools.cache
def user_op(op: Op, dtype: Any) -> Any:
    """An MPI op over words of ``dtype``'s size that applies ``op`` to them read as ``dtype``
    (commutative: sum, max, min and prod all are): how an MPI program reduces a type the
    library has no datatype for (bfloat16 here; the bench's bare row uses it too).

    Commutative to the bit: a library may apply it as f(a, b) on one rank and f(b, a) on another
    (MPICH's recursive doubling does), and NumPy's maximum and minimum return their first
    argument where the two compare equal, so -0 and +0 would come out differently. Here, as
    IEEE 754-2019's maximum and minimum, max(-0, +0) is +0 and min(-0, +0) is -0."""
    import numpy as np
    from mpi4py import MPI

    ufunc = getattr(np, op.ufunc)
    ties = {"maximum": np.bitwise_and, "minimum": np.bitwise_or}.get(op.ufunc)  # on the sign bit
    words = np.dtype(f"uint{8 * np.dtype(dtype).itemsize}")

    def apply(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        inout, other = np.frombuffer(inoutbuf, dtype=dtype), np.frombuffer(inbuf, dtype=dtype)
        if ties is None:
            ufunc(other, inout, out=inout)
            return
        zeros = (other == 0) & (inout == 0)  # a -0 and a +0 compare equal
        mine = inout.view(words)[zeros]  # a copy: these words as they were
        ufunc(other, inout, out=inout)
        if mine.size:
            inout.view(words)[zeros] = ties(other.view(words)[zeros], mine)

    return MPI.Op.Create(apply, commute=True)


def unknown(count: int, itemsize: int, size: int, rank: int, root: int = 0) -> None:
    """Unknown: what the library's collectives send is its business."""
    return None


def reduce_scatter_scratch(count: int, itemsize: int, size: int, rank: int) -> int:
    """In place: this rank's part, received apart."""
    return -(-count // size) * itemsize if size > 1 else 0


# The cost model prices the library's all-reduce as the cheaper of the two it chooses between by size.
ALLREDUCE = Spec(
    run=allreduce,
    bytes_sent=unknown,
    scratch_bytes=no_scratch,
    blocking=True,
    persistent=persistent,
    rides=True,
    modelled_as=("ring", "rabenseifner"),
)
REDUCE_SCATTER = Spec(
    run=reduce_scatter,
    bytes_sent=unknown,
    scratch_bytes=reduce_scatter_scratch,
    blocking=True,
    modelled_as=("ring", "rabenseifner"),
)
ALLGATHER = Spec(
    run=allgather,
    bytes_sent=unknown,
    scratch_bytes=no_scratch,
    blocking=True,
    modelled_as=("ring", "rabenseifner"),
)
ALLTOALL = Spec(
    run=alltoall,
    bytes_sent=unknown,
    scratch_bytes=no_scratch,
    blocking=True,
    modelled_as=("pairwise", "bruck"),
)
BROADCAST = Spec(
    run=broadcast,
    bytes_sent=unknown,
    scratch_bytes=no_scratch,
    blocking=True,
    modelled_as=("binomial", "ring"),
)
