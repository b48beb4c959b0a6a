"""`allreduce`: validation, agreement across ranks, dispatch by name, and mean.

Validation happens in one place, here. With ``check=True`` every rank's local verdict
and its (count, dtype, op, algorithm, array kind, placement) go to rank 0, which answers
every rank (`agreement`), before any data moves, so a mistake on one rank becomes an
exception on every rank instead of a hang, and the user's buffers are untouched when it
is raised.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from mpi4py import MPI

from . import algorithms
from .agreement import agree
from .backend import Backend, backend_for
from .channel import Channel
from .comm import Exclusive, intracomm, state_of
from .ops import DTYPES, OPS, Op, check_op, op_name
from .trace import call_begin, call_end, local_copy
from .units import format_bytes


def _validate(x: Any, out: Any, op: str, algorithm: str) -> tuple[Backend, Op, bool]:
    """Local checks, no communication. Returns (backend, op, in place) or raises."""
    backend = backend_for(x)
    if op not in OPS:
        raise ValueError(f"hpcring.allreduce: unknown op {op!r}; choose one of {', '.join(OPS)}")
    if x.dtype not in DTYPES:
        names = ", ".join(d.name for d in DTYPES)
        raise TypeError(f"hpcring.allreduce: dtype {x.dtype} is not supported; use one of {names}")
    check_op(OPS[op], x.dtype)
    if not x.flags.c_contiguous:
        raise ValueError("hpcring.allreduce: x must be C-contiguous (use xp.ascontiguousarray)")
    backend.check_device(x, "x")
    # Another view of x's very bytes (C-contiguous, x's dtype, any shape) is in place; any other
    # overlap is refused below. The overlap test runs once, and only where it finds one are the
    # data pointers read.
    overlaps = out is not None and out is not x and backend.owns(out) and backend.shares_memory(x, out)
    in_place = (
        out is None
        or out is x
        or (overlaps and out.dtype == x.dtype and out.flags.c_contiguous and backend.same_memory(out, x))
    )
    if in_place:
        if not backend.writeable(x):
            raise ValueError("hpcring.allreduce: x is read-only; pass out= for an out-of-place result")
        return backend, OPS[op], True
    if not backend.owns(out):
        raise TypeError(
            f"hpcring.allreduce: out must be a {type(x).__module__}.{type(x).__name__} like x, "
            f"got {type(out).__module__}.{type(out).__name__}"
        )
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(
            f"hpcring.allreduce: out must have x's shape {x.shape} and dtype {x.dtype}, "
            f"got {out.shape} and {out.dtype}"
        )
    if not out.flags.c_contiguous:
        raise ValueError("hpcring.allreduce: out must be C-contiguous")
    backend.check_device(out, "out")
    if not backend.writeable(out):
        raise ValueError("hpcring.allreduce: out is read-only")
    if overlaps:
        raise ValueError("hpcring.allreduce: out overlaps x; pass out=None (or out=x) for in place")
    return backend, OPS[op], False


_OP_NAMES = list(OPS)
_ALG_NAMES = list(algorithms.MODULES)


_ARRAYS = ["numpy.ndarray", "cupy.ndarray"]


def _signature(call: int, x: Any, op: str, algorithm: str, in_place: bool | None) -> list[int]:
    """What must agree across ranks, as integers (-1 where a value is not one we know).

    The array kind is part of it: NumPy on some ranks and CuPy on others would stage
    and sum fine, but almost always means a rank that skipped moving its data to the GPU.
    So is the placement, as MPI asks of MPI_IN_PLACE: `auto` keeps a choice per size and
    placement, and ranks that chose differently would run different algorithms.
    """
    count = int(getattr(x, "size", -1)) if hasattr(x, "dtype") else -1
    dtype = getattr(x, "dtype", None)
    kind = f"{type(x).__module__.split('.')[0]}.{type(x).__name__}"
    return [
        call,
        count,
        DTYPES.index(dtype) if dtype in DTYPES else -1,
        _OP_NAMES.index(op) if op in _OP_NAMES else -1,
        _ALG_NAMES.index(algorithm) if algorithm in _ALG_NAMES else -1,
        _ARRAYS.index(kind) if kind in _ARRAYS else -1,
        -1 if in_place is None else int(in_place),
    ]


def _describe(field: str, value: int) -> str:
    """A value of the agreement row, as a person would name it."""
    names = {
        "dtype": [d.name for d in DTYPES],
        "op": _OP_NAMES,
        "algorithm": _ALG_NAMES,
        "array": _ARRAYS,
        "placement": ["out of place (out=)", "in place"],
    }
    if field in names:
        return names[field][value] if value >= 0 else "?"
    return str(value)


def _check_memory(channel: Channel, algorithm: str, scratch: int, count: int, itemsize: int) -> None:
    """MemoryError, before anything is allocated, when the algorithm's scratch cannot fit.

    The limit is the memory the backend still has (HPCRING_MEMORY_LIMIT caps it, for a
    job that shares its node or device with other work).
    """
    need = scratch - channel.scratch_held()
    if need <= 0:
        return
    available = channel.backend.available_bytes()
    limit = os.environ.get("HPCRING_MEMORY_LIMIT", "").strip()
    if limit:
        if not limit.isdigit():
            raise ValueError(f"HPCRING_MEMORY_LIMIT must be a number of bytes, got {limit!r}")
        available = int(limit) if available is None else min(available, int(limit))
    if available is None or need <= available:
        return
    ring = algorithms.scratch_bytes("ring", count, itemsize, channel.size, channel.rank)
    raise MemoryError(
        f"hpcring.allreduce: algorithm {algorithm!r} needs {format_bytes(need)} more scratch on "
        f"rank {channel.rank} for {count} elements on {channel.size} ranks, but only "
        f"{format_bytes(available)} is available; algorithm='ring' needs {format_bytes(ring)}"
    )


def default_timeout() -> float:
    """Seconds to wait for every rank to arrive: HPCRING_TIMEOUT, else 300; 0 waits forever."""
    raw = os.environ.get("HPCRING_TIMEOUT", "300")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"HPCRING_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"HPCRING_TIMEOUT must be >= 0, got {raw!r}")
    return value


def allreduce(
    x: Any,
    *,
    op: str | MPI.Op = "sum",
    algorithm: str = "ring",
    comm: MPI.Intracomm | None = None,
    out: Any = None,
    check: bool = True,
    timeout: float | None = None,
) -> Any:
    """Reduce ``x`` over all ranks of ``comm`` and return the result on every rank.

    In place unless ``out`` is given (then ``x`` is left as it was). ``x``: a C-contiguous
    NumPy or CuPy array of float16/32/64, int32/64, complex64/128, or (NumPy only) ml_dtypes'
    bfloat16. ``op`` is one of sum, mean, max, min, prod; ``algorithm`` one of
    `hpcring.ALGORITHMS`. With ``check`` (the default) the ranks first agree on count,
    dtype, op, algorithm and placement, so a mismatch or a bad argument on any rank raises
    on every rank before any data moves, and a rank that does not arrive within ``timeout``
    seconds (default `HPCRING_TIMEOUT`, 300; 0 waits forever) makes the others raise
    `hpcring.StallError` naming it.
    """
    comm = intracomm(comm, "allreduce")
    problem: Exception | None = None
    in_place: bool | None = None
    try:
        op = op_name(op)  # mpi4py's MPI.SUM, MAX, MIN, PROD -> their names; inside the try: a verdict
        backend, reduction, in_place = _validate(x, out, op, algorithm)
    except (TypeError, ValueError) as error:
        if not check:
            raise
        problem, backend = error, backend_for(np.empty(0))
    state = state_of(comm)
    channel = state.channel(backend)
    if problem is None:
        try:
            prepared = algorithms.prepare(algorithm, channel, x.size, x.dtype.itemsize, bool(in_place))
            _check_memory(channel, prepared.name, prepared.scratch, x.size, x.dtype.itemsize)
        except (MemoryError, TypeError, ValueError) as error:
            if not check:
                raise
            problem = error
    with Exclusive(state):
        if check and channel.size > 1:
            state.calls = call = state.calls + 1
            agree(
                channel.comm,
                _signature(call, x, op, algorithm, in_place),
                problem,
                timeout=default_timeout() if timeout is None else timeout,
                describe=_describe,
                what=f"allreduce(op={op!r}, algorithm={algorithm!r}) call {call} on this communicator",
            )
        if problem is not None:  # a single rank: nothing to agree on
            raise problem
        src = x.reshape(-1)
        dst = src if in_place else out.reshape(-1)
        call_begin(algorithm, channel, src, dst)
        if channel.size > 1 and src.size > 0:
            prepared.run(channel, src, dst, reduction)
            if reduction.name == "mean":
                channel.xp.true_divide(dst, channel.size, out=dst)
        elif dst is not src:  # nothing to exchange: every algorithm would only copy
            dst[...] = src
            local_copy(dst, src)
        call_end()
    return x if in_place else out
