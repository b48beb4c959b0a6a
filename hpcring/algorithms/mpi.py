"""The MPI library's own MPI_Allreduce: the baseline every other algorithm is measured against.

Cost: the library's choice (recursive doubling, Rabenseifner, ring... by size and G).
It needs a datatype the library knows. MPI has none for bfloat16: there the words travel
as MPI_UINT16_T and a user-defined op (mpi4py's `MPI.Op.Create`) adds them as bfloat16,
which is what an MPI program does for a type of its own.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from mpi4py import MPI

from ..channel import Channel
from ..ops import BFLOAT16, Op


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src)."""
    if src.dtype == BFLOAT16:
        words = src.view(np.uint16)
        ch.allreduce(words, words if dst is src else dst.view(np.uint16), user_op(op, BFLOAT16))
        return
    ch.allreduce(src, dst, op.mpi_op())


def persistent(ch: Channel, src: Any, dst: Any, op: Op) -> MPI.Prequest | None:
    """MPI-4's persistent all-reduce on these buffers (`hpcring.plan`), where the library has it."""
    if src.dtype == BFLOAT16:
        words = src.view(np.uint16)
        return ch.allreduce_init(words, words if dst is src else dst.view(np.uint16), user_op(op, BFLOAT16))
    return ch.allreduce_init(src, dst, op.mpi_op())


@functools.cache
def user_op(op: Op, dtype: np.dtype) -> MPI.Op:
    """An MPI op over words of ``dtype``'s size that applies ``op`` to them read as ``dtype``
    (commutative: sum, max, min and prod all are): how an MPI program reduces a type the
    library has no datatype for (bfloat16 here; the bench's bare row uses it too)."""
    ufunc = getattr(np, op.ufunc)

    def apply(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        inout = np.frombuffer(inoutbuf, dtype=dtype)
        ufunc(np.frombuffer(inbuf, dtype=dtype), inout, out=inout)

    return MPI.Op.Create(apply, commute=True)


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> None:
    """Unknown: what MPI_Allreduce sends is the library's business."""
    return None


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """hpcring allocates nothing for it (the library may)."""
    return 0
