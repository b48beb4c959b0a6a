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
from . import wire as wires
from .arrays import NAMES, NUMPY, Adapter, adapter_for, known_adapter
from .channel import Channel
from .comm import CommState, Exclusive, intracomm, known_state, state_of
from .errors import StallError
from .flight import AGREEMENT, MASK, MOVING, clock, dump_on_error
from .ops import DTYPES, OPS, Op, check_op, op_name
from .polling import abandon
from .tracing import call_begin, call_end, local_copy
from .units import format_bytes

WARM_CALLS = 256  # kinds of call remembered per communicator


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
        fix = getattr(adapter, "contiguous_fix", "xp.ascontiguousarray(x)")
        raise ValueError(f"hpcring.allreduce: x must be C-contiguous (reduce {fix}, then copy it back)")
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
_WIRE_NAMES = [None, *wires.WIRES]  # wire=None is 0: a row without wire= reads as before


def _signature(
    x: Any,
    adapter: Adapter | None,
    op: str,
    algorithm: str,
    in_place: bool | None,
    settings: int,
    wire: Any = None,
) -> list[int]:
    """What must agree across ranks, as integers (-1 where a value is not one we know); the
    agreement puts the call's number in front.

    The array kind is part of it: NumPy on some ranks and CuPy on others would stage
    and sum fine, but almost always means a rank that skipped moving its data to the GPU.
    So is the placement, as MPI asks of MPI_IN_PLACE: `auto` keeps a choice per size and
    placement, and ranks that chose differently would run different algorithms.
    ``adapter`` is None where this rank refused ``x``: its verdict, not this row, is then
    what the others hear. ``settings`` is the digest of the communicator's must-agree
    HPCRING_* values (`hpcring.config.Config.digest`): ranks with other chunk sizes or node
    shapes would run other schedules, and hang. ``wire`` too: ranks that narrow what they send
    and ranks that do not would read each other's bytes as another dtype.
    """
    if adapter is None:
        count, dtype, kind = -1, None, -1
    else:
        count, dtype, kind = adapter.size(x), adapter.dtype(x), adapter.index
    return [
        count,
        DTYPES.index(dtype) if dtype in DTYPES else -1,
        _OP_NAMES.index(op) if op in _OP_NAMES else -1,
        _ALG_NAMES.index(algorithm) if algorithm in _ALG_NAMES else -1,
        kind,
        -1 if in_place is None else int(in_place),
        settings,
        _WIRE_NAMES.index(wire) if wire in _WIRE_NAMES else -1,
    ]


def _describe(field: str, value: int) -> str:
    """A value of the agreement row, as a person would name it."""
    names = {
        "dtype": [d.name for d in DTYPES],
        "op": _OP_NAMES,
        "algorithm": _ALG_NAMES,
        "array": NAMES,
        "placement": ["out of place (out=)", "in place"],
        "wire": [f"wire={w!r}" for w in _WIRE_NAMES],
    }
    if field in names:
        return names[field][value] if 0 <= value < len(names[field]) else "?"
    if field == "settings":
        return f"digest {value:08x}"
    return str(value)


def _check_memory(
    channel: Channel, algorithm: str, scratch: int, count: int, itemsize: int, exact_path: bool = False
) -> None:
    """MemoryError, before anything is allocated, when the algorithm's scratch cannot fit
    (``exact_path``: ``scratch`` includes reproducible=True's integer words, `exact.scratch_bytes`).

    The limit is the memory the backend still has (HPCRING_MEMORY_LIMIT caps it, for a
    job that shares its node or device with other work).
    """
    need = scratch - channel.scratch_held()
    pool = 0
    if isinstance(channel, wires.WireChannel):  # wire=: its pool holds about one narrowed copy in flight
        pool = max(wires.pool_bytes(count, channel.wire) - channel.pool_held(), 0)
        need = max(need, 0) + pool
    if need <= 0:
        return
    available = channel.backend.available_bytes()
    limit = config.current().memory_limit
    if limit is not None:
        available = limit if available is None else min(available, limit)
    if available is None or need <= available:
        return
    ring = algorithms.scratch_bytes("ring", count, itemsize, channel.size, channel.rank)
    if exact_path:
        raise MemoryError(
            f"hpcring.allreduce: reproducible=True with algorithm {algorithm!r} needs {format_bytes(need)} "
            f"more scratch on rank {channel.rank} for {count} elements (its integer words: "
            f"{exact.WORD_BYTES[itemsize]} bytes per element), but only {format_bytes(available)} is "
            f"available; without reproducible=True, algorithm='ring' needs {format_bytes(ring)}"
        )
    if pool:
        raise MemoryError(
            f"hpcring.allreduce: algorithm {algorithm!r} with wire={channel.wire.name!r} needs "
            f"{format_bytes(need)} more on rank {channel.rank} for {count} elements (scratch, and "
            f"{format_bytes(pool)} of wire buffers), but only {format_bytes(available)} is available; "
            f"without wire=, algorithm='ring' needs {format_bytes(ring)}"
        )
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
    wire: str | None = None,
) -> Any:
    """Reduce ``x`` over all ranks of ``comm`` and return the result on every rank.

    In place unless ``out`` is given (then ``x`` is left as it was). ``x``: a C-contiguous
    NumPy or CuPy array or torch tensor of float16/32/64, int32/64, complex64/128 or bfloat16
    (not on CuPy), or a jax.Array, whose result is a new array (`hpcring.arrays`). ``op`` is one
    of sum, mean, max, min, prod; ``algorithm`` one of `hpcring.ALGORITHMS`. With ``check``
    (the default) the ranks first agree on count, dtype, op, algorithm and placement, so a
    mismatch or a bad argument on any rank raises on every rank before any data moves, and a
    rank that does not arrive within ``timeout`` seconds (default `HPCRING_TIMEOUT`, 300; 0
    waits forever) makes the others raise
    `hpcring.StallError` naming it.

    ``reproducible=True`` (op sum or mean, float16, bfloat16, float32, float64): the result's
    bits depend only on the multiset of the ranks' arrays, not on the rank count, their order,
    the algorithm or its chunking (`hpcring.exact`; docs/reproducibility.md gives the error
    bound and the cost, about 2.25x the bytes). With integers, max and min it changes nothing:
    those are reproducible already.

    ``wire="bfloat16"`` or ``"float16"`` (float32 and float64 ``x``; algorithms naive, ps, ring,
    rabenseifner, hierarchical, auto): what travels is narrowed to that dtype, half the bytes of
    float32, while every reduction stays in ``x``'s dtype; every rank still ends with the same
    bits (`hpcring.wire`; docs/compression.md gives the error bound and when it pays).
    """
    # A warm call (an array kind, shape, dtype, op, algorithm and placement this communicator
    # has run, on the same device) reuses what cannot have changed and asks the adapter one
    # question of what can; anything else, an error included, takes the full path (names
    # that are not strings too: unhashable, they must reach the agreement as a verdict).
    state = known_state(MPI.COMM_WORLD if comm is None else comm)
    if (
        state is not None
        and op.__class__ is str
        and algorithm.__class__ is str
        and not reproducible
        and (wire is None or wire.__class__ is str)
    ):
        adapter = known_adapter(x)
        if adapter is not None:
            try:  # an adapter's question that raises (a dtype it has no name for) is the full path's
                device = adapter.current_device() if adapter.device else None
                key = (adapter, adapter.shape(x), adapter.dtype(x), op, algorithm, out is None, device, wire)
                call = state.warm.get(key)
                ready = call is not None and adapter.ready(x, out)
            except Exception:
                ready = False
            if ready:
                return call.execute(x, out, check, timeout, None)
    comm = intracomm(comm, "allreduce")
    return _first(x, op, algorithm, comm, out, check, timeout, reproducible, wire=wire)


class _Call:
    """Everything about one kind of call that cannot change between calls: worked out by the
    full path once, then reused by every warm call of that shape, dtype, op, algorithm and
    placement on the communicator."""

    __slots__ = (
        "adapter",
        "algorithm",
        "channel",
        "exact",
        "flight",
        "in_place",
        "mean",
        "name",
        "op",
        "parts",
        "reduction",
        "row",
        "run",
        "state",
        "what",
    )

    def __init__(
        self,
        state: CommState,
        channel: Channel,
        adapter: Adapter | None,
        algorithm: str,
        op: Any,
        reduction: Op | None,
        in_place: bool | None,
        row: list[int],
        run: Any,
    ) -> None:
        self.state, self.channel, self.adapter, self.algorithm = state, channel, adapter, algorithm
        self.flight = state.flight  # the communicator's recorder, one attribute away on every call
        self.reduction, self.in_place, self.row, self.run = reduction, in_place, row, run
        self.mean = reduction is not None and reduction.name == "mean"
        self.name: str | None = None  # what runs (`auto`: its choice once made), where known
        self.op = op
        self.exact = False  # reproducible=True: the sum runs through hpcring/exact.py
        self.parts: list[Any] | None = None  # ExactSum's local contributions, where it calls
        self.what = f"allreduce(op={op!r}, algorithm={algorithm!r})"

    def execute(self, x: Any, out: Any, check: bool, timeout: float | None, problem: Exception | None) -> Any:
        """Agree (with ``check``), then move the data, or raise ``problem`` on every rank.

        Each call is recorded in the communicator's flight recorder (`hpcring.flight`): a slot
        reused every 64 calls, six attribute stores and two clock reads (+0.2-0.3 us, measured
        on a loaded machine: docs/reliability.md)."""
        channel = self.channel
        if timeout is None:  # the communicator's HPCRING_TIMEOUT (docs/configuration.md: fixed at first use)
            timeout = channel.default_timeout
            if timeout is None:
                timeout = default_timeout()  # a bad value raises here
        channel.timeout = timeout or None  # every wait of the data exchange is bounded by it
        state = self.state
        with Exclusive(state):
            flight = self.flight
            seq = flight.seq = flight.seq + 1
            slot = flight.slots[seq & MASK]
            slot.call = self
            slot.phase = AGREEMENT
            slot.start = clock()
            try:
                if check:
                    self.agree(timeout, problem)
                slot.number = state.calls if check else 0  # 0: not agreed on
                if problem is not None:  # a single rank: nothing to agree on
                    raise problem
                slot.phase = MOVING
                dst = self.move(x, out)
            except BaseException as error:
                slot.number = state.calls if check else 0
                flight.failed(slot, error)
                if isinstance(error, StallError):  # MPI may still use what the frames hold
                    abandon(error)
                raise
            slot.end = clock()  # done: an end after the start (a failed call negates its phase)
        if self.adapter.immutable:  # JAX: a new array of the result; CUDA torch: after its stream waits
            return self.adapter.result(dst, x if self.in_place else out)
        return x if self.in_place else out

    def agree(self, timeout: float | None, problem: Exception | None) -> None:
        """The ranks' agreement on this call (nothing to agree on for one rank)."""
        if self.channel.size > 1:
            state = self.state
            state.calls = call = state.calls + 1
            state.agreement(
                [call, *self.row],
                problem,
                timeout=default_timeout() if timeout is None else timeout,
                describe=_describe,
                what=self.what,
            )

    def move(self, x: Any, out: Any) -> Any:
        """The all-reduce itself, on the flat views of ``x`` and ``out``; returns the result's view."""
        adapter, channel = self.adapter, self.channel
        src = adapter.flat(x)
        dst = src if self.in_place else adapter.flat(out)
        call_begin(self.algorithm, channel, src, dst)
        if self.exact:  # ---- reproducible sums: hpcring/exact.py (max agreement, integer sum) ----
            parts = [src] if self.parts is None else self.parts
            exact.run(channel, self.algorithm, parts, dst, self.op, accumulated=self.parts is not None)
        elif channel.size > 1 and src.size > 0:
            try:
                self.run(channel, src, dst, self.reduction)
            except BaseException:
                if isinstance(channel, wires.WireChannel):  # its wire buffers back to the pool
                    channel.settle()
                raise
            if self.mean:
                channel.xp.true_divide(dst, channel.size, out=dst)
        elif dst is not src:  # nothing to exchange: every algorithm would only copy
            dst[...] = src
            local_copy(dst, src)
        call_end()
        return dst


def _first(
    x: Any,
    op: Any,
    algorithm: str,
    comm: MPI.Intracomm,
    out: Any,
    check: bool,
    timeout: float | None,
    reproducible: bool = False,
    parts: list[Any] | None = None,
    wire: str | None = None,
) -> Any:
    """The full path: `examine` the call, run it, and keep what a warm call of its kind reuses."""
    try:
        call, problem, key = examine(x, op, algorithm, comm, out, check, reproducible, parts, wire, timeout)
    except Exception as error:  # check=False: this rank's own input error (check=True agrees on it)
        dump_on_error(error)
        raise
    result = call.execute(x, out, check, timeout, problem)
    if key is not None:
        warm = call.state.warm
        if len(warm) >= WARM_CALLS:  # a code that never repeats a shape: keep the table small
            warm.clear()
        warm[key] = call
    return result


def examine(
    x: Any,
    op: Any,
    algorithm: str,
    comm: MPI.Intracomm,
    out: Any,
    check: bool,
    reproducible: bool = False,
    parts: list[Any] | None = None,
    wire: str | None = None,
    timeout: float | None = None,
) -> tuple[_Call, Exception | None, Any]:
    """Validation through the adapter, the communicator's state (its first call duplicates it),
    the one question to the algorithms, the memory guard: the call to run, this rank's problem
    with it (raised at once without ``check``), and its warm key (None: not reusable)."""
    exact_path = False
    problem: Exception | None = None
    in_place: bool | None = None
    reduction: Op | None = None
    try:
        op = op_name(op)  # mpi4py's MPI.SUM, MAX, MIN, PROD -> their names; inside the try: a verdict
        adapter, reduction, in_place, dtype = _validate(x, out, op)
    except (TypeError, ValueError) as error:
        if not check:
            raise
        problem, adapter = error, None
    state = state_of(comm, timeout)
    channel = state.channel(NUMPY if adapter is None else adapter)
    if timeout is not None:  # auto's table and the topology are set up under the call's timeout
        channel.timeout = timeout or None
    state.agreement.settings = channel.config  # what a settings mismatch names
    run = ran = None
    cacheable = False
    if adapter is not None:
        try:
            count, itemsize = adapter.size(x), dtype.itemsize
            if reproducible:  # ---- reproducible sums: hpcring/exact.py ----
                exact_path = exact.check(op, dtype, accumulated=parts is not None)
            narrowed = wires.check(wire, dtype, algorithm, reproducible, bool(adapter.device))
            if narrowed is not None:  # ---- wire compression: hpcring/wire.py ----
                channel = wires.channel(channel, narrowed)
            prepared = algorithms.prepare(algorithm, channel, count, itemsize, bool(in_place))
            scratch = prepared.scratch
            if exact_path:
                scratch = exact.scratch_bytes(channel, algorithm, dtype, count, parts is not None)
            _check_memory(channel, prepared.name, scratch, count, itemsize, exact_path)
            run, ran = prepared.run, prepared.name
            # `auto` before its choice for this size asks again next time (where it runs at all:
            # not on one rank, nor for no data). A view of x's bytes passed as out= is in place,
            # but is not what a warm call's key says.
            chosen = prepared.name != "auto" or channel.size == 1 or count == 0
            cacheable = chosen and in_place == (out is None) and not reproducible
        except (MemoryError, TypeError, ValueError) as error:
            if not check:
                raise
            problem = error
    tagged = exact.tagged(op) if reproducible else op  # ranks that differ on reproducible= disagree on op
    row = _signature(x, adapter, tagged, algorithm, in_place, channel.config.digest(), wire)
    call = _Call(state, channel, adapter, algorithm, op, reduction, in_place, row, run)
    call.name, call.exact, call.parts = ran, exact_path, parts
    key = None
    if cacheable:
        device = adapter.current_device() if adapter.device else None
        key = (adapter, adapter.shape(x), dtype, op, algorithm, out is None, device, wire)
    return call, problem, key
