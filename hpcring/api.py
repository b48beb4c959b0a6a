"""`allreduce`: validation, agreement across ranks, dispatch by name, and mean.

Validation happens in one place, here. With ``check=True`` every rank's local verdict
and its (count, dtype, op, algorithm, array kind, placement) go to rank 0, which answers
every rank (`agreement`), before any data moves, so a mistake on one rank becomes an
exception on every rank instead of a hang, and the user's buffers are untouched when it
is raised.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from . import algorithms, config, exact
from .agreement import agree
from .arrays import NAMES, NUMPY, Adapter, adapter_for
from .channel import Channel
from .comm import Exclusive, intracomm, state_of
from .ops import DTYPES, OPS, Op, check_op, op_name
from .tracing import call_begin, call_end, local_copy
from .units import format_bytes


def _validate(x: Any, out: Any, op: str) -> tuple[Adapter, Op, bool, np.dtype]:
    """Local checks, no communication. Returns (adapter, op, in place, x's dtype) or raises.

    Every question about ``x`` and ``out`` goes to the adapter that owns ``x``."""
    adapter = adapter_for(x)
    if op not in OPS:
        raise ValueError(f"hpcring.allreduce: unknown op {op!r}; choose one of {', '.join(OPS)}")
    dtype = adapter.dtype(x)
    if dtype not in DTYPES:
        names = ", ".join(d.name for d in DTYPES)
        raise TypeError(f"hpcring.allreduce: dtype {dtype} is not supported; use one of {names}")
    check_op(OPS[op], dtype)
    flags = adapter.flags(x)
    if not flags.c_contiguous:
        raise ValueError("hpcring.allreduce: x must be C-contiguous (use xp.ascontiguousarray)")
    adapter.check_device(x, "x")
    if out is None or out is x:
        in_place = True
    else:
        # Another view of x's very bytes (C-contiguous, x's dtype, any shape) is in place; any
        # other overlap is refused below. The overlap test runs once, and only where it finds
        # one are the data pointers read.
        owned = adapter.owns(out)
        overlaps = owned and adapter.shares_memory(x, out)
        in_place = (
            overlaps
            and adapter.dtype(out) == dtype
            and adapter.flags(out).c_contiguous
            and adapter.same_memory(out, x)
        )
    if in_place:
        if not flags.writeable:
            raise ValueError("hpcring.allreduce: x is read-only; pass out= for an out-of-place result")
        return adapter, OPS[op], True, dtype
    if not owned:
        raise TypeError(
            f"hpcring.allreduce: out must be a {type(x).__module__}.{type(x).__name__} like x, "
            f"got {type(out).__module__}.{type(out).__name__}"
        )
    shape, out_shape, out_dtype = adapter.shape(x), adapter.shape(out), adapter.dtype(out)
    if out_shape != shape or out_dtype != dtype:
        raise ValueError(
            f"hpcring.allreduce: out must have x's shape {shape} and dtype {dtype}, "
            f"got {out_shape} and {out_dtype}"
        )
    flags = adapter.flags(out)
    if not flags.c_contiguous:
        raise ValueError("hpcring.allreduce: out must be C-contiguous")
    adapter.check_device(out, "out")
    if not flags.writeable:
        raise ValueError("hpcring.allreduce: out is read-only")
    if overlaps:
        raise ValueError("hpcring.allreduce: out overlaps x; pass out=None (or out=x) for in place")
    return adapter, OPS[op], False, dtype


_OP_NAMES = [*OPS, *map(exact.tagged, OPS)]  # tagged: reproducible=True
_ALG_NAMES = list(algorithms.MODULES)


def _signature(
    call: int, x: Any, adapter: Adapter | None, op: str, algorithm: str, in_place: bool | None
) -> list[int]:
    """What must agree across ranks, as integers (-1 where a value is not one we know).

    The array kind is part of it: NumPy on some ranks and CuPy on others would stage
    and sum fine, but almost always means a rank that skipped moving its data to the GPU.
    So is the placement, as MPI asks of MPI_IN_PLACE: `auto` keeps a choice per size and
    placement, and ranks that chose differently would run different algorithms.
    ``adapter`` is None where this rank refused ``x``: its verdict, not this row, is then
    what the others hear.
    """
    if adapter is None:
        count, dtype, kind = -1, None, -1
    else:
        count, dtype, kind = adapter.size(x), adapter.dtype(x), adapter.index
    return [
        call,
        count,
        DTYPES.index(dtype) if dtype in DTYPES else -1,
        _OP_NAMES.index(op) if op in _OP_NAMES else -1,
        _ALG_NAMES.index(algorithm) if algorithm in _ALG_NAMES else -1,
        kind,
        -1 if in_place is None else int(in_place),
    ]


def _describe(field: str, value: int) -> str:
    """A value of the agreement row, as a person would name it."""
    names = {
        "dtype": [d.name for d in DTYPES],
        "op": _OP_NAMES,
        "algorithm": _ALG_NAMES,
        "array": NAMES,
        "placement": ["out of place (out=)", "in place"],
    }
    if field in names:
        return names[field][value] if 0 <= value < len(names[field]) else "?"
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
    limit = config.current().memory_limit
    if limit is not None:
        available = limit if available is None else min(available, limit)
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
    return config.current().timeout


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
    _parts: list[Any] | None = None,
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

    ``reproducible=True`` (op sum or mean, float16, bfloat16, float32, float64): the result's
    bits depend only on the multiset of the ranks' arrays, not on the rank count, their order,
    the algorithm or its chunking (`hpcring.exact`; docs/reproducibility.md gives the error
    bound and the cost, about 2.25x the bytes). With integers, max and min it changes nothing:
    those are reproducible already.
    """
    comm = intracomm(comm, "allreduce")
    exact_path = False
    problem: Exception | None = None
    in_place: bool | None = None
    try:
        op = op_name(op)  # mpi4py's MPI.SUM, MAX, MIN, PROD -> their names; inside the try: a verdict
        adapter, reduction, in_place, dtype = _validate(x, out, op)
    except (TypeError, ValueError) as error:
        if not check:
            raise
        problem, adapter = error, None
    state = state_of(comm)
    channel = state.channel(NUMPY if adapter is None else adapter)
    if adapter is not None:
        try:
            count, itemsize = adapter.size(x), dtype.itemsize
            if reproducible:  # ---- reproducible sums: hpcring/exact.py ----
                exact_path = exact.check(op, dtype, accumulated=_parts is not None)
            prepared = algorithms.prepare(algorithm, channel, count, itemsize, bool(in_place))
            _check_memory(channel, prepared.name, prepared.scratch, count, itemsize)
        except (MemoryError, TypeError, ValueError) as error:
            if not check:
                raise
            problem = error
    with Exclusive(state):
        if check and channel.size > 1:
            state.calls = call = state.calls + 1
            agree(
                channel.comm,
                _signature(call, x, adapter, exact.tagged(op) if reproducible else op, algorithm, in_place),
                problem,
                timeout=default_timeout() if timeout is None else timeout,
                describe=_describe,
                what=f"allreduce(op={op!r}, algorithm={algorithm!r}) call {call} on this communicator",
            )
        if problem is not None:  # a single rank: nothing to agree on
            raise problem
        src = adapter.flat(x)
        dst = src if in_place else adapter.flat(out)
        call_begin(algorithm, channel, src, dst)
        if exact_path:  # ---- reproducible sums: hpcring/exact.py (max agreement, integer sum) ----
            exact.run(channel, algorithm, [src] if _parts is None else _parts, dst, op)
        elif channel.size > 1 and src.size > 0:
            prepared.run(channel, src, dst, reduction)
            if reduction.name == "mean":
                channel.xp.true_divide(dst, channel.size, out=dst)
        elif dst is not src:  # nothing to exchange: every algorithm would only copy
            dst[...] = src
            local_copy(dst, src)
        call_end()
    if adapter.immutable:  # JAX: the algorithms ran on a copy; the result is a new array
        return adapter.result(dst, x)
    return x if in_place else out
