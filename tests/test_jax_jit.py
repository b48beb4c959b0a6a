"""hpcring.jax: the collectives inside jax.jit, bitwise what the same call outside jit gives, in
program order, and jax.grad through them as the math of data parallelism says. Skipped where JAX
is not installed (pip install -e '.[jax]' in hpcring's clone)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere
from mpi4py import MPI

import hpcring

jax = pytest.importorskip("jax", reason="needs JAX: pip install -e '.[jax]' in hpcring's clone")
jnp = pytest.importorskip("jax.numpy")
import hpcring.jax as hj  # noqa: E402  (after the skip: it imports jax)

jax.config.update("jax_enable_x64", True)
WORLD = MPI.COMM_WORLD
G, RANK = WORLD.size, WORLD.rank
N = 37  # odd: uneven reduce-scatter parts


def values(rank: int, dtype: str, n: int = N) -> np.ndarray:
    """Every rank's input: small integers plus a rank-dependent fraction (sums round in float32)."""
    return (((np.arange(n) + 2 * rank) % 3 + 1) + 0.1 * (rank + 1)).astype(dtype)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "mpi"])
def test_allreduce_inside_jit_is_the_call_outside(algorithm: str) -> None:
    failures = []
    for dtype in ("float32", "float64"):
        for op in ("sum", "mean", "max", "min", "prod"):
            x = jnp.asarray(values(RANK, dtype))
            inside = jax.jit(lambda a, op=op: hj.allreduce(a, op=op, algorithm=algorithm))(x)
            outside = hpcring.allreduce(x, op=op, algorithm=algorithm)
            same = inside.dtype == x.dtype and np.array_equal(np.asarray(inside), np.asarray(outside))
            if not (same and identical_everywhere(WORLD, np.asarray(inside))):
                failures.append((dtype, op))
    assert everywhere(WORLD, not failures), failures


@pytest.mark.mpi
def test_the_other_collectives_inside_jit() -> None:
    x = jnp.asarray(values(RANK, "float64"))
    part = jax.jit(hj.reduce_scatter)(x)
    assert everywhere(WORLD, np.array_equal(np.asarray(part), hpcring.reduce_scatter(np.asarray(x))))
    rows = jax.jit(hj.allgather)(x)
    want = np.stack([values(r, "float64") for r in range(G)])
    assert everywhere(WORLD, rows.shape == (G, N) and np.array_equal(np.asarray(rows), want))
    for root in range(G):
        got = jax.jit(lambda a, root=root: hj.broadcast(a, root=root))(x)
        assert everywhere(WORLD, np.array_equal(np.asarray(got), values(root, "float64")))


@pytest.mark.mpi
def test_a_program_of_several_collectives_runs_them_in_order() -> None:
    """Ordered callbacks: the ranks' collectives meet in program order (an unordered pair, one rank
    running them the other way round, would disagree and raise)."""

    @jax.jit
    def program(a: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        total = hj.allreduce(a)
        first = hj.broadcast(a * 2, root=0)
        rows = hj.allgather(total - first)
        return total, first, rows

    for _ in range(3):
        total, first, rows = program(jnp.asarray(values(RANK, "float64")))
    expect_total = hpcring.allreduce(values(RANK, "float64"))
    ok = np.array_equal(np.asarray(total), expect_total)
    ok &= np.array_equal(np.asarray(first), 2 * values(0, "float64"))
    ok &= np.array_equal(np.asarray(rows), np.stack([expect_total - 2 * values(0, "float64")] * G))
    assert everywhere(WORLD, bool(ok))


@pytest.mark.mpi
def test_grad_is_what_the_math_says() -> None:
    """The objective is the sum of every rank's loss L_r = sum(w_r * f(x_r, ...)), w_r = r + 1."""
    x = jnp.asarray(values(RANK, "float64", 8))
    w = float(RANK + 1)
    weights = sum(range(1, G + 1))  # sum over ranks of w_r
    # y = sum_r x_r on every rank: d/dx_r sum_r' w_r' sum(y) = sum_r' w_r'
    grad = jax.jit(jax.grad(lambda a: w * jnp.sum(hj.allreduce(a))))(x)
    assert everywhere(WORLD, np.allclose(np.asarray(grad), weights))
    mean = jax.grad(lambda a: w * jnp.sum(hj.allreduce(a, op="mean")))(x)
    assert everywhere(WORLD, np.allclose(np.asarray(mean), weights / G))
    # rows[k] = x_k: d/dx_k sum_r' w_r' (k + 1) sum(rows[k]) = (k + 1) sum_r' w_r'
    scale = jnp.arange(1.0, G + 1)[:, None]
    gathered = jax.grad(lambda a: w * jnp.sum(hj.allgather(a) * scale))(x)
    assert everywhere(WORLD, np.allclose(np.asarray(gathered), (RANK + 1) * weights))
    # part_r = (sum_k x_k)[part r]: d/dx_k sum_r' w_r' sum(part_r') = w_r' on part r'
    even = jnp.asarray(values(RANK, "float64", 4 * G))
    scattered = jax.grad(lambda a: w * jnp.sum(hj.reduce_scatter(a)))(even)
    assert everywhere(WORLD, np.allclose(np.asarray(scattered), np.repeat(np.arange(1.0, G + 1), 4)))
    # y_r = x_root: d/dx_root = sum_r' w_r', 0 elsewhere
    broadcast = jax.grad(lambda a: w * jnp.sum(hj.broadcast(a, root=0)))(x)
    assert everywhere(WORLD, np.allclose(np.asarray(broadcast), weights if RANK == 0 else 0.0))
    with pytest.raises(NotImplementedError, match=r"jax\.grad goes through op 'sum' and 'mean'"):
        jax.grad(lambda a: jnp.sum(hj.allreduce(a, op="max")))(x)
