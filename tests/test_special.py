"""Special values: NaN and Inf propagate as in IEEE arithmetic (and MPI), integers wrap as in NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere
from mpi4py import MPI

import hpcring

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD


@pytest.mark.parametrize("algorithm", hpcring.ALGORITHMS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_nan_and_inf_propagate(algorithm: str, dtype) -> None:
    last = WORLD.size - 1
    x = np.ones(6, dtype=dtype)
    if WORLD.rank == last:  # one rank holds the special values
        x[:3] = [np.nan, np.inf, -np.inf]
    if WORLD.rank == 0:
        x[3] = np.inf
        x[4] = -np.inf if WORLD.size > 1 else np.inf
    reference = np.empty_like(x)
    WORLD.Allreduce(x, reference, MPI.SUM)
    result = hpcring.allreduce(x.copy(), algorithm=algorithm)
    same = np.array_equal(result, reference, equal_nan=True)
    ok = np.isnan(result[0]) and result[1] == np.inf and same
    same_everywhere = identical_everywhere(WORLD, result)  # collective: call it on every rank
    assert everywhere(WORLD, ok and same_everywhere)
    if algorithm in ("mpi", "auto"):
        return  # MPI's MAX/MIN on NaN is the library's business (and auto may choose mpi)
    for op in ("max", "min"):  # NaN wins, as in numpy.maximum/minimum
        result = hpcring.allreduce(x.copy(), op=op, algorithm=algorithm)
        same_everywhere = identical_everywhere(WORLD, result)
        assert everywhere(WORLD, bool(np.isnan(result[0])) and same_everywhere)


@pytest.mark.parametrize("algorithm", hpcring.ALGORITHMS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_overflow_wraps(algorithm: str, dtype) -> None:
    big = np.iinfo(dtype).max
    x = np.full(5, big, dtype=dtype)
    reference = np.empty_like(x)
    WORLD.Allreduce(x, reference, MPI.SUM)
    with np.errstate(over="ignore"):
        want = np.full(5, big, dtype=dtype) * dtype(WORLD.size)  # wraps modulo 2**bits
    result = hpcring.allreduce(x, algorithm=algorithm)
    assert everywhere(WORLD, np.array_equal(result, want) and np.array_equal(result, reference))
