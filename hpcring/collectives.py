"""The collectives: `allreduce`, `reduce_scatter`, `allgather`, `broadcast` and `alltoall`.

Each is a thin front end: it names its collective and hands its arguments to the engine
(`hpcring.engine`), which validates them, agrees across ranks, runs the algorithm and
records the call, the same way for all four. What each promises is in its docstring; what
they share is here:

- ``comm`` is any mpi4py intracommunicator (default COMM_WORLD); hpcring duplicates it once,
  so its messages never meet the user's.
- Arrays: NumPy or CuPy arrays, torch tensors, jax.Arrays (`hpcring.arrays`), C-contiguous, any
  shape; float16, bfloat16, float32, float64, int32, int64, complex64, complex128.
- With ``check`` (the default) the ranks first agree on what each one called (count, dtype,
  op, algorithm, root, placement), so a mismatch or a bad argument on any rank raises on every
  rank before any data moves, and a rank that does not arrive within ``timeout`` seconds
  (default `HPCRING_TIMEOUT`, 300; 0 waits forever) makes the others raise `hpcring.StallError`
  naming it. Without it nothing is compared, but every wait is still bounded.
- Every rank ends with bitwise the same result. A reduce-scatter's part is reduced once, by one
  schedule: `naive` and `rabenseifner` give the bits their all-reduce gives there, the ring
  starts each part's sum one rank later than its all-reduce does, so it may round differently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from .algorithms import ALLGATHER, ALLREDUCE, BROADCAST, REDUCE_SCATTER
from .engine import call, front


def allreduce(
    x: Any,
    *,
    op: str | MPI.Op = "sum",
    algorithm: str = "ring",
    comm: MPI.Intracomm | None = None,
    out: Any = None,
    check: bool = True,
    timeout: float | None = None,
    reproducible: bool = False,
    wire: str | None = None,
) -> Any:
    """Reduce ``x`` over all ranks of ``comm`` and return the result on every rank.

    In place unless ``out`` is given (then ``x`` is left as it was; ``out=x`` is in place, the same
    call as none); a jax.Array comes back as
    a new array. ``op`` is one of sum, mean, max, min, prod (or mpi4py's MPI.SUM, MAX, MIN,
    PROD); ``algorithm`` one of `hpcring.ALGORITHMS` (docs/choosing.md says which when).

    ``reproducible=True`` (op sum or mean, float16, bfloat16, float32, float64): the result's
    bits depend only on the multiset of the ranks' arrays, not on the rank count, their order,
    the algorithm or its chunking (docs/reproducibility.md gives the error bound and the cost,
    about 2.25x the bytes). With integers, max and min it changes nothing: those are
    reproducible already.

    ``wire="bfloat16"`` or ``"float16"`` (float32 and float64 ``x``; the algorithms that move
    data themselves, and auto): what travels is narrowed to that dtype, half the bytes of
    float32, while every reduction stays in ``x``'s dtype; every rank still ends with the same
    bits (docs/compression.md gives the error bound and when it pays).
    """
    return call(ALLREDUCE, x, out, op, algorithm, comm, check, timeout, 0, reproducible, wire)


def reduce_scatter(
    x: Any,
    *,
    op: str | MPI.Op = "sum",
    algorithm: str = "ring",
    comm: MPI.Intracomm | None = None,
    out: Any = None,
    check: bool = True,
    timeout: float | None = None,
) -> Any:
    """This rank's part of the reduction of ``x`` over all ranks: the ring's first phase.

    The flattened ``x`` is cut into G parts as ``numpy.array_split`` cuts a range (the first
    ``len % G`` parts one element longer), and rank r gets part r reduced over every rank: with
    equal parts, MPI_Reduce_scatter_block. The result is a new 1-D array unless ``out`` (that
    many elements, ``x``'s dtype) is given; ``out`` may be this rank's own part of ``x`` itself
    (in place: ``x``'s other parts then hold partial sums). Sharded training reduces its
    gradients so: each rank then updates only its own shard. Algorithms: ring, naive (every
    part straight to its owner), rabenseifner (recursive halving), mpi (MPI_Reduce_scatter),
    auto.
    """
    # every argument given: the compiled core's front door takes a warm call only so
    return call(REDUCE_SCATTER, x, out, op, algorithm, comm, check, timeout, 0, False, None)


def allgather(
    x: Any,
    *,
    algorithm: str = "ring",
    comm: MPI.Intracomm | None = None,
    out: Any = None,
    check: bool = True,
    timeout: float | None = None,
) -> Any:
    """Every rank's ``x``, stacked in rank order: an array of shape ``(G, *x.shape)``, the ring's
    second phase.

    Every rank's ``x`` has the same shape and dtype. The result is a new array unless ``out``
    (that shape and dtype) is given; ``x`` may be this rank's own row of ``out`` (in place).
    Sharded training gathers its parameters so after each rank updated its shard.
    Algorithms: ring, naive (every rank to every rank), rabenseifner (recursive doubling), mpi
    (MPI_Allgather), auto.
    """
    # every argument given: the compiled core's front door takes a warm call only so
    return call(ALLGATHER, x, out, None, algorithm, comm, check, timeout, 0, False, None)


def broadcast(
    x: Any,
    *,
    root: int = 0,
    algorithm: str = "ring",
    comm: MPI.Intracomm | None = None,
    check: bool = True,
    timeout: float | None = None,
) -> Any:
    """The root's ``x`` on every rank, in place; returns ``x`` (a jax.Array: a new array).

    Every rank passes an array of the same shape and dtype. Algorithms: ring (a pipelined chain
    from the root, in chunks: about the time of sending the buffer once, for large buffers),
    binomial (a tree: ceil(log2 G) rounds of the whole buffer, for small ones), naive (the root
    sends to each rank in turn, as the parameter server's second half does), mpi (MPI_Bcast),
    auto.
    """
    # every argument given: the compiled core's front door takes a warm call only so
    return call(BROADCAST, x, None, None, algorithm, comm, check, timeout, root, False, None)


def alltoall(
    x: Any,
    *,
    send_splits: Sequence[int] | None = None,
    recv_splits: Sequence[int] | None = None,
    algorithm: str = "auto",
    comm: MPI.Intracomm | None = None,
    out: Any = None,
    check: bool = True,
    timeout: float | None = None,
) -> Any:
    """Each rank's blocks of ``x``, one to every rank: block i goes to rank i, and the result
    holds the blocks every rank sent this one, in rank order.

    Without splits ``x``'s first axis is cut into G equal blocks (MPI_Alltoall) and the result
    has ``x``'s shape: the transpose of a distributed array (FFT codes), the token exchange of
    equal experts. With ``send_splits`` (G counts of ``x``'s rows, its first axis: elements of a
    1-D array) the blocks are uneven (MPI_Alltoallv): particles leaving for their new owners,
    tokens routed to their experts. ``recv_splits`` (the rows from each rank) is learnt by one
    small exchange where it is not given, and checked against what the senders send where it
    is; `alltoall_splits` gives it beforehand. The result is a new array of ``sum(recv_splits)``
    rows unless ``out`` (that shape, ``x``'s dtype, apart from ``x``) is given.

    With ``check`` the ranks agree on the call before any data moves, the splits included, so
    a mismatch raises the same ValueError on every rank, with the arrays untouched. Algorithms:
    pairwise (G-1 steps, one partner each way: large blocks), bruck (ceil(log2 G) steps of packed
    blocks: small ones; equal blocks only), mpi (MPI_Alltoall / MPI_Alltoallv), auto.
    """
    run = _EXCHANGE[0] if _EXCHANGE else _exchange()
    return run(x, out, algorithm, comm, check, timeout, send_splits, recv_splits)


_EXCHANGE: list[Any] = []  # hpcring.exchange.run, once loaded: an import statement per call costs 0.25 us


def _exchange() -> Any:
    """hpcring.exchange.run, loaded at the first all-to-all: a code that never calls it never loads it."""
    from . import exchange

    _EXCHANGE[:] = [exchange.run]
    return exchange.run


def alltoall_splits(
    send_splits: Sequence[int],
    *,
    comm: MPI.Intracomm | None = None,
    check: bool = True,
    timeout: float | None = None,
) -> list[int]:
    """The ``recv_splits`` that ``send_splits`` on every rank make: what each rank will send this
    one (an all-to-all of G integers), to size an ``out=`` before `alltoall`, or to know which
    rows of its result came from which rank."""
    counts = np.asarray(send_splits, dtype=np.int64)
    return [int(v) for v in alltoall(counts, algorithm="auto", comm=comm, check=check, timeout=timeout)]


# The front ends that hand x and keywords straight on to the engine, with what each passes for the
# engine's arguments it does not take: `hpcring.<name>` is each behind the compiled core's front
# door (`public`).
FRONTS: dict[str, tuple[str, dict[str, Any]]] = {
    "allreduce": (ALLREDUCE, {}),
    "reduce_scatter": (REDUCE_SCATTER, {}),
    "allgather": (ALLGATHER, {"op": None}),
    "broadcast": (BROADCAST, {"out": None, "op": None}),
}


def public(name: str) -> Any:
    """What ``hpcring.<name>`` is: the function, behind the compiled core's front door where it is
    one of `FRONTS` and the core runs here (`hpcring.engine.front`: a warm NumPy call then enters
    C without the function's Python frame, 0.15 us of a 1 us call at 8 B)."""
    function = globals()[name]
    if name not in FRONTS:
        return function
    collective, given = FRONTS[name]
    return front(function, collective, **given)


__all__ = ["allgather", "allreduce", "alltoall", "alltoall_splits", "broadcast", "reduce_scatter"]
