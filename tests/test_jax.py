"""JAX arrays through hpcring.allreduce, outside jit: a new array back, bitwise the NumPy result.
Skipped where JAX is not installed (pip install -e '.[jax]' in hpcring's clone)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring.algorithms import PORTABLE

jax = pytest.importorskip("jax", reason="needs JAX: pip install -e '.[jax]' in hpcring's clone")
jnp = pytest.importorskip("jax.numpy")

WORLD = MPI.COMM_WORLD
ALGORITHMS = list(PORTABLE)
OPS = ["sum", "mean", "max", "min", "prod"]
DTYPES = ["float32", "float64", "bfloat16"]
N = 37

jax.config.update("jax_enable_x64", True)  # float64 arrays stay float64


def values(rank: int, dtype: str) -> np.ndarray:
    """Small integers (1..3): exact in bfloat16 in every order, even as a product over 4 ranks."""
    return ((np.arange(N) + 2 * rank) % 3 + 1).astype(jnp.dtype(dtype))


def test_a_new_array_on_one_rank() -> None:
    x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    result = hpcring.allreduce(x, op="mean", comm=MPI.COMM_SELF)
    assert isinstance(result, jax.Array) and result is not x and result.shape == (2, 3)
    assert np.array_equal(np.asarray(result), np.asarray(x)) and result.devices() == x.devices()
    assert hpcring.allreduce(x, out=x, comm=MPI.COMM_SELF) is not x  # out=x: in place, still a new array


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_matrix_bitwise_numpy(algorithm: str) -> None:
    failures = []
    for dtype in DTYPES:
        for op in OPS:
            reference = values(WORLD.rank, dtype)
            hpcring.allreduce(reference, op=op, algorithm=algorithm)
            x = jnp.asarray(values(WORLD.rank, dtype))
            result = hpcring.allreduce(x, op=op, algorithm=algorithm)
            got = np.asarray(result)
            ok = (
                isinstance(result, jax.Array)
                and result.dtype == x.dtype
                and np.array_equal(got, reference)
                and np.array_equal(np.asarray(x), values(WORLD.rank, dtype))  # x as it was
            )
            if not (ok and identical_everywhere(WORLD, got)):
                failures.append((dtype, op))
    assert everywhere(WORLD, not failures), failures


@pytest.mark.mpi
def test_refusals_on_every_rank() -> None:
    x = jnp.ones(8, jnp.float32)
    raises_everywhere(
        ValueError, "out= cannot be a jax.Array", lambda: hpcring.allreduce(x, out=jnp.zeros(8, jnp.float32))
    )
    raises_everywhere(
        TypeError, "dtype int8 is not supported", lambda: hpcring.allreduce(jnp.ones(8, jnp.int8))
    )
    bad = jnp.ones(8, jnp.int8) if WORLD.rank == WORLD.size - 1 else x  # one rank's mistake
    raises_everywhere(TypeError, "dtype int8 is not supported", lambda: hpcring.allreduce(bad))
    deleted = jnp.ones(8, jnp.float32)
    deleted.delete()
    raises_everywhere(ValueError, "x was deleted", lambda: hpcring.allreduce(deleted))
    if WORLD.size > 1:
        mixed = x if WORLD.rank else np.ones(8, np.float32)
        raises_everywhere(ValueError, "jax.Array", lambda: hpcring.allreduce(mixed))


@pytest.mark.mpi
def test_inside_jit_is_refused_in_words() -> None:
    step = jax.jit(lambda a: hpcring.allreduce(a) * 2)
    raises_everywhere(ValueError, "use hpcring.jax.allreduce inside jit", lambda: step(jnp.ones(4)))
