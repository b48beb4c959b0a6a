"""hpcring.jax where the XLA FFI target is not there: the collectives as ordered io_callbacks.

`hpcring.jax` calls these when ``hpcring._jax_ffi`` did not build or load, or where
``HPCRING_JAX=callback`` asks for them (``hpcring.info()["jax"]`` says which path runs). Each is an
ordered ``jax.experimental.io_callback``: XLA calls back into Python at that point of the compiled
program, with a NumPy copy of the operand, and hpcring's collective runs on it; ``ordered`` keeps
every rank's collectives in program order, which the ranks' agreement needs. The results are the
bits the FFI path and `hpcring.allreduce` outside ``jit`` give; ``jax.grad`` goes through them by
the same rules (`hpcring.jax` says which). CPU arrays only; ``comm`` defaults to COMM_WORLD.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from mpi4py import MPI

from . import collectives
from .comm import intracomm
from .partition import segment

LINEAR = ("sum", "mean")  # the ops jax.grad goes through


def _host(function: Any, x: Any, result: jax.ShapeDtypeStruct) -> Any:
    """``function(numpy copy of x)`` on the host, at this point of the program, in program order."""

    def run(value: np.ndarray) -> np.ndarray:
        return np.asarray(function(np.array(value, copy=True)), dtype=result.dtype).reshape(result.shape)

    return io_callback(run, result, x, ordered=True)


def _size(comm: MPI.Intracomm | None) -> tuple[int, int]:
    comm = intracomm(comm, "hpcring.jax")
    return comm.Get_size(), comm.Get_rank()


# -- all-reduce ---------------------------------------------------------------------------------------


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _allreduce(x: Any, op: str, algorithm: str, comm: Any, reproducible: bool) -> Any:
    run = partial(collectives.allreduce, op=op, algorithm=algorithm, comm=comm, reproducible=reproducible)
    return _host(run, x, jax.ShapeDtypeStruct(x.shape, x.dtype))


def _allreduce_forward(x: Any, op: str, algorithm: str, comm: Any, reproducible: bool) -> tuple[Any, None]:
    return _allreduce(x, op, algorithm, comm, reproducible), None


def _allreduce_backward(
    op: str, algorithm: str, comm: Any, reproducible: bool, _: None, ct: Any
) -> tuple[Any]:
    if op not in LINEAR:
        raise NotImplementedError(
            f"hpcring.jax.allreduce: jax.grad goes through op 'sum' and 'mean', not {op!r}"
        )
    return (_allreduce(ct, op, algorithm, comm, reproducible),)


_allreduce.defvjp(_allreduce_forward, _allreduce_backward)


def allreduce(
    x: Any,
    *,
    op: str = "sum",
    algorithm: str = "ring",
    comm: MPI.Intracomm | None = None,
    reproducible: bool = False,
) -> jax.Array:
    """`hpcring.allreduce` of ``x`` over ``comm``, inside ``jit`` or outside: a new array."""
    return _allreduce(jnp.asarray(x), op, algorithm, comm, reproducible)


# -- reduce-scatter and all-gather: each the other's transpose -----------------------------------------


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _reduce_scatter(x: Any, op: str, algorithm: str, comm: Any) -> Any:
    size, rank = _size(comm)
    start, stop = segment(int(np.prod(x.shape, dtype=np.int64)), size, rank)
    run = partial(collectives.reduce_scatter, op=op, algorithm=algorithm, comm=comm)
    return _host(run, x, jax.ShapeDtypeStruct((stop - start,), x.dtype))


def _reduce_scatter_forward(x: Any, op: str, algorithm: str, comm: Any) -> tuple[Any, tuple[int, ...]]:
    return _reduce_scatter(x, op, algorithm, comm), x.shape


def _reduce_scatter_backward(
    op: str, algorithm: str, comm: Any, shape: tuple[int, ...], ct: Any
) -> tuple[Any]:
    size, _ = _size(comm)
    if op not in LINEAR or int(np.prod(shape, dtype=np.int64)) % size:
        raise NotImplementedError(
            "hpcring.jax.reduce_scatter: jax.grad goes through op 'sum' and 'mean' with equal parts "
            f"(a size divisible by {size}), not op {op!r} over {shape}"
        )
    gathered = _allgather(ct, algorithm, comm)
    return ((gathered / size if op == "mean" else gathered).reshape(shape),)


_reduce_scatter.defvjp(_reduce_scatter_forward, _reduce_scatter_backward)


def reduce_scatter(
    x: Any, *, op: str = "sum", algorithm: str = "ring", comm: MPI.Intracomm | None = None
) -> jax.Array:
    """`hpcring.reduce_scatter`: this rank's part (numpy.array_split's) of the reduction of ``x``."""
    return _reduce_scatter(jnp.asarray(x), op, algorithm, comm)


@partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _allgather(x: Any, algorithm: str, comm: Any) -> Any:
    size, _ = _size(comm)
    run = partial(collectives.allgather, algorithm=algorithm, comm=comm)
    return _host(run, x, jax.ShapeDtypeStruct((size, *x.shape), x.dtype))


def _allgather_forward(x: Any, algorithm: str, comm: Any) -> tuple[Any, None]:
    return _allgather(x, algorithm, comm), None


def _allgather_backward(algorithm: str, comm: Any, _: None, ct: Any) -> tuple[Any]:
    part = _reduce_scatter(ct, "sum", algorithm, comm)  # row r of every rank's cotangent, summed
    return (part.reshape(ct.shape[1:]),)


_allgather.defvjp(_allgather_forward, _allgather_backward)


def allgather(x: Any, *, algorithm: str = "ring", comm: MPI.Intracomm | None = None) -> jax.Array:
    """`hpcring.allgather`: every rank's ``x``, stacked in rank order, shape ``(G, *x.shape)``."""
    return _allgather(jnp.asarray(x), algorithm, comm)


# -- broadcast ------------------------------------------------------------------------------------------


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _broadcast(x: Any, root: int, algorithm: str, comm: Any) -> Any:
    run = partial(collectives.broadcast, root=root, algorithm=algorithm, comm=comm)
    return _host(run, x, jax.ShapeDtypeStruct(x.shape, x.dtype))


def _broadcast_forward(x: Any, root: int, algorithm: str, comm: Any) -> tuple[Any, None]:
    return _broadcast(x, root, algorithm, comm), None


def _broadcast_backward(root: int, algorithm: str, comm: Any, _: None, ct: Any) -> tuple[Any]:
    total = _allreduce(ct, "sum", algorithm, comm, False)
    _, rank = _size(comm)
    return (total if rank == root else jnp.zeros_like(total),)


_broadcast.defvjp(_broadcast_forward, _broadcast_backward)


def broadcast(
    x: Any, *, root: int = 0, algorithm: str = "ring", comm: MPI.Intracomm | None = None
) -> jax.Array:
    """`hpcring.broadcast`: the root's ``x`` on every rank (a new array)."""
    return _broadcast(jnp.asarray(x), root, algorithm, comm)


__all__ = ["allgather", "allreduce", "broadcast", "reduce_scatter"]
