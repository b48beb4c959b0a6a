"""The MPI library's own MPI_Allreduce: the baseline every other algorithm is measured against.

Cost: the library's choice (recursive doubling, Rabenseifner, ring... by size and G).
It needs a datatype the library knows, so it cannot reduce dtypes MPI has no type for.
"""

from __future__ import annotations

from typing import Any

from ..channel import Channel
from ..ops import Op


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src)."""
    ch.allreduce(src, dst, op.mpi_op())


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> None:
    """Unknown: what MPI_Allreduce sends is the library's business."""
    return None


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """hpcring allocates nothing for it (the library may)."""
    return 0
