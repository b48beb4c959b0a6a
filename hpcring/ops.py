"""Reduction operators: their names, the dtypes they apply to, and how to apply them.

`mean` is `sum` followed by a division by the number of ranks, done by the caller,
so every algorithm only ever sees sum, max, min or prod.

bfloat16 is ml_dtypes' (the type JAX and TensorFlow hand to NumPy), on NumPy arrays:
NumPy has no such dtype, and ml_dtypes gives it NumPy's add, maximum, minimum and multiply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .trace import reduction

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_NUMPY_NAMES = ("float16", "float32", "float64", "int32", "int64", "complex64", "complex128")
DTYPES: tuple[np.dtype, ...] = (*(np.dtype(name) for name in _NUMPY_NAMES), BFLOAT16)


def kind(dtype: np.dtype) -> str:
    """NumPy's kind letter (f float, i int, c complex), with bfloat16 a float: NumPy calls
    every dtype it does not know "V", void."""
    return "f" if dtype == BFLOAT16 else dtype.kind


@dataclass(frozen=True)
class Op:
    """One reduction: ``ufunc`` names the element-wise function in NumPy and CuPy alike."""

    name: str
    ufunc: str
    mpi_name: str
    kinds: str  # numpy dtype kinds it applies to: f float, i int, c complex

    @reduction
    def reduce(self, xp: Any, acc: Any, other: Any) -> None:
        """acc <- acc (op) other, element-wise, in place."""
        getattr(xp, self.ufunc)(acc, other, out=acc)

    @reduction
    def combine(self, xp: Any, left: Any, right: Any, out: Any) -> None:
        """out <- left (op) right, element-wise; ``out`` may be ``left`` or ``right``."""
        getattr(xp, self.ufunc)(left, right, out=out)

    def mpi_op(self) -> Any:
        from mpi4py import MPI

        return getattr(MPI, self.mpi_name)


OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op("sum", "add", "SUM", "fic"),
        Op("mean", "add", "SUM", "fc"),  # an integer mean would have to round: refuse it
        Op("max", "maximum", "MAX", "fi"),  # complex numbers are not ordered (nor in MPI)
        Op("min", "minimum", "MIN", "fi"),
        Op("prod", "multiply", "PROD", "fic"),
    )
}


def check_op(op: Op, dtype: np.dtype) -> None:
    """TypeError when ``op`` does not apply to ``dtype``."""
    if kind(dtype) not in op.kinds:
        raise TypeError(f"hpcring.allreduce: op={op.name!r} does not apply to dtype {dtype.name}")
