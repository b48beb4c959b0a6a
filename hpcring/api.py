"""`allreduce`: validation, agreement across ranks, dispatch by name, and mean.

Validation happens in one place, here. With ``check=True`` every rank's local verdict
and its (count, dtype, op, algorithm, array kind, placement) go to rank 0, which answers
every rank (`agreement`), before any data moves, so a mistake on one rank becomes an
exception on every rank instead of a hang, and the user's buffers are untouched when it
is raised.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from . import algorithms
from .agreement import agree
from .arrays import NAMES, NUMPY, Adapter, adapter_for
from .channel import Channel
from .ops import DTYPES, OPS, Op, check_op
from .trace import call_begin, call_end, local_copy

_lock = threading.Lock()


def _release(comm: MPI.Comm, keyval: int, state: dict[str, Any]) -> None:
    """Attribute delete callback: the user freed their communicator, so free what we made for it."""
    for close in reversed(state.pop("closers", [])):
        close()
    dup = state.pop("comm", None)
    if dup is not None and not MPI.Is_finalized():
        dup.Free()


_keyval: int | None = None  # created on first use: importing hpcring must not need MPI initialized


def _state(comm: MPI.Intracomm) -> dict[str, Any]:
    """hpcring's per-communicator state, cached as an MPI attribute of the user's communicator.

    The first call on a communicator (collective) duplicates it. Being an attribute, the
    duplicate is released when the user frees that communicator, and never leaks one per call.
    """
    global _keyval
    with _lock:
        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_release)
        state = comm.Get_attr(_keyval)
        if state is not None:
            return state
        creating = _creating.setdefault(MPI._handleof(comm), threading.Lock())
    # The Dup is collective: hold only this communicator's lock across it. A process-wide lock
    # here deadlocks two threads that set up two communicators, when ranks take them in
    # opposite orders (each rank's Dup waits for a rank whose other thread holds the lock).
    with creating:
        state = comm.Get_attr(_keyval)
        if state is None:
            state = {"comm": comm.Dup(), "busy": threading.Lock(), "lock": creating, "closers": []}
            with _lock:
                comm.Set_attr(_keyval, state)
                _creating.pop(MPI._handleof(comm), None)
        return state


_creating: dict[int, threading.Lock] = {}  # communicator handle -> lock held while it is duplicated


def attached(comm: MPI.Intracomm, key: str, build: Callable[[], Any]) -> Any:
    """The object ``build()`` made for ``comm`` under ``key``, made once and cached with its state.

    ``build`` may be collective (every rank reaches the first call in the same order): it runs
    under this communicator's own lock only, as the Dup in `_state` does. An object with a
    ``close()`` is closed, in reverse order of making, when the user frees the communicator.
    """
    state = _state(comm)
    with state["lock"]:
        made = state.get(key)
        if made is None:
            made = state[key] = build()
            if hasattr(made, "close"):
                state["closers"].append(made.close)
        return made


def channel_for(comm: MPI.Intracomm, backend: Adapter) -> Channel:
    """The cached Channel of ``comm`` for ``backend`` (on its current device)."""
    return _channel(_state(comm), backend)


def _channel(state: dict[str, Any], backend: Adapter) -> Channel:
    # One per device: scratch, plans and NCCL's communicator live on the GPU they were made on,
    # and a rank may switch GPUs between calls (`with cupy.cuda.Device(i):`).
    device = backend.current_device()
    key = backend.name if device is None else f"{backend.name}:{device}"
    channel = state.get(key)  # a dict read is atomic: no lock once it is made
    if channel is None:
        with _lock:
            channel = state.get(key)
            if channel is None:
                channel = state[key] = Channel(state["comm"], backend)
    return channel


_thread_level: int | None = None  # MPI's thread level, fixed once MPI is initialized


class _Exclusive:
    """One all-reduce at a time per communicator, and none from threads MPI was not set up for.

    Two threads interleaving collectives on one communicator would match each other's
    messages: refuse the second one instead of corrupting both. (A class, not a
    generator-based context manager: this runs on every call, where microseconds count.)
    """

    __slots__ = ("busy", "serial")

    def __init__(self, state: dict[str, Any]) -> None:
        global _thread_level
        level = _thread_level
        if level is None:
            level = _thread_level = MPI.Query_thread()
        if level < MPI.THREAD_SERIALIZED and threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "hpcring.allreduce: called from a second thread, but MPI was initialized without thread "
                "support; initialize MPI with MPI_THREAD_MULTIPLE (mpi4py's default) to use threads"
            )
        self.busy = state["busy"]
        self.serial = _serialized if level == MPI.THREAD_SERIALIZED else None

    def __enter__(self) -> None:
        if not self.busy.acquire(blocking=False):
            raise RuntimeError(
                "hpcring.allreduce: another thread is running an all-reduce on this communicator; "
                "give each thread its own communicator (comm.Dup())"
            )
        if self.serial is not None:
            self.serial.acquire()

    def __exit__(self, *exc: object) -> None:
        if self.serial is not None:
            self.serial.release()
        self.busy.release()


_serialized = threading.Lock()  # under MPI_THREAD_SERIALIZED, one MPI call at a time in all


def _validate(x: Any, out: Any, op: str, algorithm: str) -> tuple[Adapter, Op, bool, np.dtype]:
    """Local checks, no communication. Returns (adapter, op, in place, x's dtype) or raises.

    Every question about ``x`` and ``out`` goes to the adapter that owns ``x``."""
    adapter = adapter_for(x)
    if op not in OPS:
        raise ValueError(f"hpcring.allreduce: unknown op {op!r}; choose one of {', '.join(OPS)}")
    algorithms.get(algorithm)
    refusal = algorithms.refuses(algorithm, adapter)
    if refusal:
        raise TypeError(f"hpcring.allreduce: {refusal}")
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


_OP_NAMES = list(OPS)
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


def _format_bytes(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


# The scratch formula is a pure function of the call's shape, worked out once per shape
# (auto's asks two modules): a warm call only looks it up.
_scratch_bytes = functools.lru_cache(maxsize=256)(algorithms.scratch_bytes)


def _check_memory(channel: Channel, algorithm: str, count: int, itemsize: int) -> None:
    """MemoryError, before anything is allocated, when the algorithm's scratch cannot fit.

    The limit is the memory the backend still has (HPCRING_MEMORY_LIMIT caps it, for a
    job that shares its node or device with other work).
    """
    need = _scratch_bytes(algorithm, count, itemsize, channel.size, channel.rank) - channel.scratch_held()
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
        f"hpcring.allreduce: algorithm {algorithm!r} needs {_format_bytes(need)} more scratch on "
        f"rank {channel.rank} for {count} elements on {channel.size} ranks, but only "
        f"{_format_bytes(available)} is available; algorithm='ring' needs {_format_bytes(ring)}"
    )


def intracomm(comm: MPI.Intracomm | None, caller: str) -> MPI.Intracomm:
    """``comm``, or COMM_WORLD for None; TypeError (naming ``caller``) for anything else."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"hpcring.{caller}: comm must be an mpi4py intracommunicator, got {comm!r}")
    return comm


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
    op: str = "sum",
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
        adapter, reduction, in_place, dtype = _validate(x, out, op, algorithm)
    except (TypeError, ValueError) as error:
        if not check:
            raise
        problem, adapter = error, None
    state = _state(comm)
    channel = _channel(state, NUMPY if adapter is None else adapter)
    run = algorithm  # what will run: `auto` resolves to its choice once it has made it for this size
    if adapter is not None:
        try:
            count, itemsize = adapter.size(x), dtype.itemsize
            run = algorithms.resolved(algorithm, channel, count * itemsize, in_place)
            _check_memory(channel, run, count, itemsize)
        except (MemoryError, ValueError) as error:
            if not check:
                raise
            problem = error
    with _Exclusive(state):
        if check and channel.size > 1:
            state["calls"] = call = state.get("calls", 0) + 1
            agree(
                channel.comm,
                _signature(call, x, adapter, op, algorithm, in_place),
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
        if channel.size > 1 and src.size > 0:
            algorithms.get(run)(channel, src, dst, reduction)
            if reduction.name == "mean":
                channel.xp.true_divide(dst, channel.size, out=dst)
        elif dst is not src:  # nothing to exchange: every algorithm would only copy
            dst[...] = src
            local_copy(dst, src)
        call_end()
    if adapter.immutable:  # JAX: the algorithms ran on a copy; the result is a new array
        return adapter.result(dst, x)
    return x if in_place else out
