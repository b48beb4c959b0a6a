"""The two cores agree on whole all-reduces, bit for bit, at any rank count: every algorithm,
dtype, op and size, in and out of place, with ``reproducible=True`` and with ``wire=``.

Every rank switches the same way (``hpcring.kernels.using``), runs the call under the compiled
kernels and under the pure-Python path, and compares; the inputs are edge values (NaN pairs left
out: there NumPy's own bits depend on the element's position, see tests/test_kernels.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import everywhere, identical_everywhere
from mpi4py import MPI

import hpcring
from hpcring import exact, kernels, wire
from hpcring.ops import DTYPES

WORLD = MPI.COMM_WORLD
BF16 = np.dtype(ml_dtypes.bfloat16)
SIZES = [0, 1, 7, 1001]
needs_c = pytest.mark.skipif(kernels.COMPILED is None, reason=f"no compiled kernels: {kernels.REASON}")
pytestmark = [pytest.mark.mpi, needs_c, pytest.mark.filterwarnings("ignore::RuntimeWarning")]


def inputs(dtype: np.dtype, n: int, seed: int) -> np.ndarray:
    """This rank's input: edge values (signed zeros, subnormals, extremes, and on rank 0 Infs and
    NaNs too: so no element meets two NaNs, not even one made of Inf - Inf) and ordinary ones."""
    values = kernels._edge_values(dtype, n, seed * 31 + WORLD.rank)
    if WORLD.rank != 0 and dtype.kind not in "iu":
        wide = values.astype(np.complex128 if dtype.kind == "c" else np.float64)
        values[~np.isfinite(wide)] = 1
    return values


def both(**kwargs: object) -> tuple[np.ndarray, np.ndarray]:
    """(Python core's result, compiled core's) of hpcring.allreduce(**kwargs), out of place."""
    x = kwargs.pop("x")
    results = []
    # A first call of `auto` has not settled its choice when the ranks agree, so its data moves
    # after the agreement; later calls' ride in it (on 3-4 ranks the exchange groups the terms,
    # not MPI's tree). Compare like with like: both cores after that first call.
    hpcring.allreduce(x, out=np.empty_like(x), **kwargs)
    for core in ("python", "c"):
        with kernels.using(core):
            results.append(hpcring.allreduce(x, out=np.empty_like(x), **kwargs))
    return results[0], results[1]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.tobytes() == b.tobytes()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("algorithm", hpcring.ALGORITHMS)
def test_every_algorithm_dtype_op_and_size_agrees(algorithm: str, dtype: np.dtype) -> None:
    ops = ["sum", "prod"] if dtype.kind == "c" else ["sum", "max", "min", "prod"]
    if dtype.kind in "fc":
        ops.append("mean")
    for op in ops:
        for n in SIZES:
            x = inputs(dtype, n, len(op) + n)
            want, got = both(x=x, op=op, algorithm=algorithm)
            assert everywhere(WORLD, same_bits(want, got)), (algorithm, dtype, op, n)
            assert identical_everywhere(WORLD, got)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", list(exact.FORMATS), ids=str)
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "naive", "mpi"])
def test_reproducible_sums_agree(algorithm: str, dtype: np.dtype) -> None:
    for op in ("sum", "mean"):
        for n in SIZES:
            x = inputs(dtype, n, n)
            want, got = both(x=x, op=op, algorithm=algorithm, reproducible=True)
            assert everywhere(WORLD, same_bits(want, got)), (algorithm, dtype, op, n)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("wire_name", list(wire.WIRES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "naive", "ps", "hierarchical"])
def test_wire_compression_agrees(algorithm: str, dtype: str, wire_name: str) -> None:
    for n in SIZES:
        x = (np.random.default_rng(WORLD.rank + n).standard_normal(n) * 1e3).astype(dtype)
        want, got = both(x=x, algorithm=algorithm, wire=wire_name)
        assert everywhere(WORLD, same_bits(want, got)), (algorithm, dtype, wire_name, n)


@pytest.mark.timeout(120)
def test_the_bare_call_through_the_mpi_core_is_mpi_allreduce() -> None:
    """hpcring._core.allreduce (the MPI-linked extension) gives comm.Allreduce's bits."""
    from hpcring.core import mpi_core

    module, why = mpi_core()
    if module is None:
        pytest.skip(why)
    for dtype in ("float32", "float64", "int32", "int64", "complex64", "complex128"):
        x = inputs(np.dtype(dtype), 1001, 5)
        if np.dtype(dtype).kind in "fc":
            x[np.isnan(x)] = 0  # MPI's NaN choice is the library's
        for name, code in kernels.OP_CODES.items():
            if np.dtype(dtype).kind == "c" and name in ("maximum", "minimum"):
                continue
            mpi = {"add": MPI.SUM, "maximum": MPI.MAX, "minimum": MPI.MIN, "multiply": MPI.PROD}[name]
            want, got = np.empty_like(x), np.empty_like(x)
            WORLD.Allreduce(x, want, op=mpi)
            assert module.allreduce(WORLD, x, got, kernels.DTYPE_CODES[x.dtype], code) == MPI.SUCCESS
            assert everywhere(WORLD, same_bits(want, got)), (dtype, name)
        inplace = x.copy()
        module.allreduce(WORLD, inplace, inplace, kernels.DTYPE_CODES[x.dtype], kernels.OP_CODES["add"])
        WORLD.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        assert everywhere(WORLD, same_bits(inplace, x))
