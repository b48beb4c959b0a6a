"""Reduction operators: their names, the dtypes they apply to, and how to apply them.

`mean` is `sum` followed by a division by the number of ranks, done by the caller,
so every algorithm only ever sees sum, max, min or prod.

bfloat16 is ml_dtypes' (the type JAX and TensorFlow hand to NumPy), on NumPy arrays:
NumPy has no such dtype, and ml_dtypes gives it NumPy's add, maximum, minimum and multiply.
ml_dtypes is imported when a call needs bfloat16 (`bfloat16`), never by ``import hpcring``: its
extension module takes up to half a second to load (version 0.7), which a code that never touches
bfloat16 should not pay. A bfloat16 array can only exist once ml_dtypes is loaded, so recognizing
one (`code`) costs nothing.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import kernels
from .tracing import reduction

# The dtypes hpcring reduces, in the agreement's order (`code`).
NAMES = ("float16", "float32", "float64", "int32", "int64", "complex64", "complex128", "bfloat16")
# The narrow dtypes a wire= call's data may travel as (hpcring.wire), in the agreement's order:
# wire=None is 0, then these. Here, not in hpcring.wire, which a call without wire= never loads.
WIRE_NAMES = ("bfloat16", "float16")
_NUMPY: dict[np.dtype, int] = {np.dtype(name): k for k, name in enumerate(NAMES[:-1])}
_BFLOAT16: list[np.dtype] = []  # ml_dtypes' bfloat16, once a call needed it


def bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, imported on first use (and the compiled kernels told of it)."""
    if not _BFLOAT16:
        import ml_dtypes

        made = np.dtype(ml_dtypes.bfloat16)
        kernels.add_bfloat16(made)
        _BFLOAT16.append(made)
    return _BFLOAT16[0]


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16 (only an array of it can hold one: importing
    ml_dtypes here costs nothing, it is loaded already)."""
    return (
        dtype.name == "bfloat16"
        and getattr(dtype.type, "__module__", "") == "ml_dtypes"
        and dtype == bfloat16()
    )


def code(dtype: Any) -> int:
    """``dtype``'s position in `NAMES`, or -1 where hpcring does not reduce it."""
    found = _NUMPY.get(dtype)
    if found is not None:
        return found
    return len(NAMES) - 1 if isinstance(dtype, np.dtype) and is_bfloat16(dtype) else -1


def supported(dtype: Any) -> bool:
    """Whether hpcring reduces ``dtype`` (a NumPy dtype)."""
    return code(dtype) >= 0


def dtypes() -> tuple[np.dtype, ...]:
    """Every dtype hpcring reduces, in `NAMES`' order (imports ml_dtypes: for tests and tables)."""
    return (*_NUMPY, bfloat16())


def __getattr__(name: str) -> Any:
    """``DTYPES`` and ``BFLOAT16`` import ml_dtypes: they are made when asked for (tests, the
    bench), never by hpcring's own modules."""
    if name == "BFLOAT16":
        return bfloat16()
    if name == "DTYPES":
        return dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def kind(dtype: np.dtype) -> str:
    """NumPy's kind letter (f float, i int, c complex), with bfloat16 a float: NumPy calls
    every dtype it does not know "V", void."""
    return "f" if dtype.kind == "V" and is_bfloat16(dtype) else dtype.kind


class Op:
    """One reduction: ``ufunc`` names the element-wise function in NumPy and CuPy alike. Equal
    and hashed by its fields, as a frozen record (a plain class: a dataclass costs every process
    its creation at the first call, and a NamedTuple would not let the tracer hook `reduce`)."""

    __slots__ = ("kinds", "mpi_name", "name", "ufunc")

    def __init__(self, name: str, ufunc: str, mpi_name: str, kinds: str) -> None:
        self.name, self.ufunc, self.mpi_name = name, ufunc, mpi_name
        self.kinds = kinds  # numpy dtype kinds it applies to: f float, i int, c complex

    def _fields(self) -> tuple[str, str, str, str]:
        return self.name, self.ufunc, self.mpi_name, self.kinds

    def __eq__(self, other: object) -> bool:
        return type(other) is Op and self._fields() == other._fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"Op{self._fields()!r}"

    @reduction
    def reduce(self, xp: Any, acc: Any, other: Any) -> None:
        """acc <- acc (op) other, element-wise, in place."""
        if xp is np and kernels.combine(self.ufunc, acc, other, acc):
            return  # the compiled kernel did it, bitwise as NumPy would
        getattr(xp, self.ufunc)(acc, other, out=acc)

    @reduction
    def combine(self, xp: Any, left: Any, right: Any, out: Any) -> None:
        """out <- left (op) right, element-wise; ``out`` may be ``left`` or ``right``."""
        if xp is np and kernels.combine(self.ufunc, left, right, out):
            return  # the compiled kernel did it, bitwise as NumPy would
        getattr(xp, self.ufunc)(left, right, out=out)

    def mpi_op(self) -> Any:
        """mpi4py's op (looked up once: the mpi algorithm asks on every call)."""
        return _mpi_op(self.mpi_name)


@functools.cache
def _mpi_op(name: str) -> Any:
    from mpi4py import MPI  # only now: importing hpcring.ops needs no MPI

    return getattr(MPI, name)


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
        raise TypeError(f"op={op.name!r} does not apply to dtype {dtype.name}")


# mpi4py's predefined ops that hpcring computes itself, by their names in mpi4py.MPI. Every other
# MPI op (LAND, BAND, MAXLOC, REPLACE, a user's MPI.Op.Create...) is MPI's business alone:
# `hpcring.Intracomm` hands those to the wrapped communicator unchanged.
MPI_OPS: dict[str, str] = {"SUM": "sum", "MAX": "max", "MIN": "min", "PROD": "prod"}
_OTHER_MPI_OPS = ("LAND", "BAND", "LOR", "BOR", "LXOR", "BXOR", "MAXLOC", "MINLOC", "REPLACE", "NO_OP")


_MPI_OP_OBJECTS: list[tuple[Any, str]] = []  # (mpi4py's op, its name here), made on first use


def mpi_op_name(op: Any) -> str | None:
    """hpcring's name for mpi4py's ``MPI.SUM``, ``MAX``, ``MIN`` or ``PROD`` (compared by handle, so
    ``MPI.Op(MPI.SUM)`` counts); None for anything else. mpi4py's ops are unhashable, hence no dict;
    the constants themselves are found by identity first (tens of ns, on every wrapped call)."""
    if not _MPI_OP_OBJECTS:
        from mpi4py import MPI  # only now: importing hpcring.ops needs no MPI

        _MPI_OP_OBJECTS[:] = [(getattr(MPI, mpi_name), name) for mpi_name, name in MPI_OPS.items()]
    for mpi_op, name in _MPI_OP_OBJECTS:
        if op is mpi_op:
            return name
    from mpi4py import MPI

    if isinstance(op, MPI.Op):
        for mpi_op, name in _MPI_OP_OBJECTS:
            if op == mpi_op:
                return name
    return None


def op_name(op: Any, caller: str | None = None) -> Any:
    """The op name hpcring works with, for what the user passed as ``op``.

    A string comes back as it is (an unknown one is reported where ops are validated, as
    before); mpi4py's ``MPI.SUM``, ``MAX``, ``MIN`` and ``PROD`` become "sum", "max", "min" and
    "prod", so the agreement compares names and ``MPI.SUM`` on one rank agrees with "sum" on
    another. Any other MPI op is a ValueError naming it and the ones accepted.
    """
    if isinstance(op, str):
        return op
    name = mpi_op_name(op)
    if name is not None:
        return name
    from mpi4py import MPI

    if not isinstance(op, MPI.Op):
        return op  # not an op at all: the caller's validation says so, in its words
    known = [f"MPI.{n}" for n in (*MPI_OPS, *_OTHER_MPI_OPS, "OP_NULL") if op == getattr(MPI, n, None)]
    what = known[0] if known else "a predefined MPI.Op" if op.is_predefined else "a user-defined MPI.Op"
    accepted = ", ".join(f"MPI.{n}" for n in MPI_OPS)
    raise ValueError(
        f"{caller + ': ' if caller else ''}{what} is not a supported op; use one of {accepted} or "
        f"{', '.join(map(repr, OPS))} (hpcring.Intracomm passes any other op to MPI)"
    )
