"""Wire compression: what travels is narrowed (bfloat16 or float16), every reduction stays wide.

``hpcring.allreduce(x, wire="bfloat16")`` runs the algorithm it names on a `WireChannel`: the
same schedule, neighbours and reductions, but every payload the channel hands to MPI is first
narrowed to the wire dtype, and every payload received is widened back to ``x``'s dtype before
the algorithm reads it. So a received chunk is widened, added to the local partial in the input
dtype, and narrowed only when it is sent on: each hop rounds a partial sum once.

Bitwise identity across ranks: an algorithm tells its channel when this rank has finished a
piece it will only send on from then (`Channel.as_sent`: the owner of a segment after the
reduce-scatter, or each rank's own contribution where there is no owner); a `WireChannel`
rounds that piece to the wire dtype in place, so what it keeps is exactly what the others
receive (narrowing a value that is already representable is exact). Numerics live here and
nowhere else: `narrow`, `widen`, `round_trip`, and the error bound (`narrowings`, from each
algorithm's Spec, and `error_bound`; docs/compression.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from . import algorithms, kernels, ops
from .algorithms.base import Spec
from .channel import Channel
from .errors import StallError
from .ops import WIRE_NAMES


def wire_dtype(name: str) -> np.dtype:
    """The dtype a wire named ``name`` carries (bfloat16: ml_dtypes', imported now)."""
    return ops.bfloat16() if name == "bfloat16" else np.dtype(np.float16)


def __getattr__(name: str) -> Any:
    """``WIRES`` (name -> dtype) imports ml_dtypes: made when asked for (tests, the bench)."""
    if name == "WIRES":
        return {wire: wire_dtype(wire) for wire in WIRE_NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Input dtypes a wire applies to: wider floats only. Integers would be rounded (refused), and a
# float16/bfloat16 input has nothing to gain.
WIDE = (np.dtype(np.float32), np.dtype(np.float64))
# Unit roundoff of round-to-nearest: 2^-p for a significand of p bits (implicit bit included).
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11}


def check(wire: Any, dtype: np.dtype, spec: Spec, reproducible: bool, device: bool) -> np.dtype | None:
    """The wire dtype for this call of ``spec`` (None: no wire), or TypeError/ValueError saying
    why not."""
    if wire is None:
        return None
    if not isinstance(wire, str) or wire not in WIRE_NAMES:
        names = ", ".join(WIRE_NAMES)
        raise ValueError(f"unknown wire {wire!r}; choose one of {names} or None")
    if spec.narrowings is None:
        able = ", ".join(name for name, s in algorithms.table(spec.collective).items() if s.narrowings)
        raise ValueError(
            f"algorithm={spec.name!r} moves data inside the library and cannot narrow it; "
            f"wire={wire!r} needs {able}"
        )
    if dtype not in WIDE:
        raise TypeError(
            f"wire={wire!r} applies to float32 and float64 arrays, got {dtype.name}"
            + (" (integers would be rounded)" if dtype.kind in "iu" else "")
        )
    if reproducible:
        raise ValueError("reproducible=True and wire= cannot be combined")
    if device:
        raise TypeError(f"wire={wire!r} needs host arrays (NumPy, CPU torch, JAX)")
    return wire_dtype(wire)


# Conversions in NumPy integer arithmetic on views of the bits, BLOCK elements at a time through
# one scratch block per thread (made once), so a call allocates nothing and every pass after the
# first reads cache. ml_dtypes' own casts ran at 4.5 GB/s (narrow) and 9.5 GB/s (widen) here, and
# on one node the wire was 1.6-4.5x slower than float32; these run at 5-7 and 20-28 GB/s on
# 1-8 MiB (memcpy: 32-45 GB/s). 64 Ki elements: 16 Ki ran 30% slower (call overhead), larger
# blocks no faster.
BLOCK = 1 << 16
_F32 = np.dtype(np.float32)
_local = threading.local()


def _block_scratch() -> np.ndarray:
    """This thread's uint32 scratch block (two communicators may convert in two threads)."""
    scratch = getattr(_local, "scratch", None)
    if scratch is None:
        scratch = _local.scratch = np.empty(BLOCK, np.uint32)
    return scratch


def _fast(src: Any, out: Any, frm: np.dtype | None, to: np.dtype | None) -> bool:
    """Whether the integer kernels apply: NumPy arrays of these dtypes (None: bfloat16),
    contiguous, same size."""
    return (
        type(src) is np.ndarray
        and type(out) is np.ndarray
        and _is(src.dtype, frm)
        and _is(out.dtype, to)
        and src.size == out.size
        and src.flags.c_contiguous
        and out.flags.c_contiguous
    )


def _is(dtype: np.dtype, want: np.dtype | None) -> bool:
    """dtype == want, where None stands for bfloat16 (not imported until an array has it)."""
    return ops.is_bfloat16(dtype) if want is None else dtype == want


def _round_bits(bits: np.ndarray, into: np.ndarray) -> np.ndarray:
    """into <- bits rounded to nearest even at bit 16, still in the high half (uint32 arithmetic:
    (u + 0x7FFF + ((u >> 16) & 1)), whose >> 16 is the bfloat16). NaNs are fixed up after."""
    np.right_shift(bits, 16, out=into)
    np.bitwise_and(into, 1, out=into)
    into += 0x7FFF
    into += bits
    return into


def _has_nan(values: np.ndarray) -> bool:
    """Whether the block holds a NaN: the minimum propagates one, and reads at 47 GB/s."""
    return bool(np.isnan(np.minimum.reduce(values))) if values.size else False


def _narrow_bf16(src: np.ndarray, out: np.ndarray, on_grid: bool) -> None:
    """float32 -> bfloat16, bitwise what ml_dtypes gives: round to nearest even (subnormals, -0,
    overflow to Inf included, as the integer carry gives them), every NaN the quiet NaN of its
    sign (0x7FC0 | sign; a NaN whose payload is only in the low bits would otherwise round to
    Inf). ``on_grid``: every value is already a bfloat16, so the high halves are exact."""
    values, bits, words = src.reshape(-1), src.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint16)
    scratch = _block_scratch()
    for lo in range(0, bits.size, BLOCK):
        block = bits[lo : lo + BLOCK]
        t = scratch[: block.size]
        if on_grid:
            np.right_shift(block, 16, out=t)
        else:
            np.right_shift(_round_bits(block, t), 16, out=t)
        target = words[lo : lo + block.size]
        target[...] = t  # uint32 -> uint16: in place then a copy beat a casting shift, 53 vs 21 GB/s
        if not on_grid and _has_nan(values[lo : lo + block.size]):
            nan = np.isnan(values[lo : lo + block.size])
            target[nan] = (block[nan] >> 16) & 0x8000 | 0x7FC0


def _widen_bf16(src: np.ndarray, out: np.ndarray) -> None:
    """bfloat16 -> float32, exactly: the 16 bits become the high half of the float32. A copy into
    the uint32 view and a shift in place (20-28 GB/s) beat strided stores of the halves (7)."""
    words, bits = src.reshape(-1).view(np.uint16), out.reshape(-1).view(np.uint32)
    for lo in range(0, bits.size, BLOCK):
        block = bits[lo : lo + BLOCK]
        block[...] = words[lo : lo + BLOCK]
        np.left_shift(block, 16, out=block)


def _round_trip_bf16(array: np.ndarray) -> None:
    """array <- the float32 of its nearest bfloat16, in place in one pass of blocks."""
    values, bits = array.reshape(-1), array.reshape(-1).view(np.uint32)
    scratch = _block_scratch()
    for lo in range(0, bits.size, BLOCK):
        block = bits[lo : lo + BLOCK]
        piece = values[lo : lo + block.size]
        nan = np.isnan(piece) if _has_nan(piece) else None
        quiet = None if nan is None else block[nan] & 0x80000000 | 0x7FC00000  # before the carry
        np.bitwise_and(_round_bits(block, scratch[: block.size]), 0xFFFF0000, out=block)
        if nan is not None:
            block[nan] = quiet


def narrow(src: Any, out: Any, on_grid: bool = False) -> Any:
    """out (wire dtype) <- src rounded to nearest (even); returns out. ``on_grid``: src holds
    wire values already (what an all-gather passes on), so truncation is exact and faster.

    float32 -> bfloat16 runs the integer kernels above. float64 keeps ml_dtypes' cast: through
    float32 it would round twice, which differs in rare cases. float16 keeps NumPy's cast.
    The compiled kernels, where they run, give these same bits in one pass.
    """
    if type(src) is np.ndarray and kernels.narrow(src, out, on_grid):
        return out
    if _fast(src, out, _F32, None):
        _narrow_bf16(src, out, on_grid)
    else:
        out[...] = src
    return out


def widen(src: Any, out: Any) -> Any:
    """out (input dtype) <- src (wire dtype), exactly; returns out."""
    if type(src) is np.ndarray and kernels.widen(src, out):
        return out
    if _fast(src, out, None, _F32):
        _widen_bf16(src, out)
    else:
        out[...] = src
    return out


def round_trip(array: Any, scratch: Any) -> None:
    """array <- widen(narrow(array)), in place: the value a receiver of ``array`` would see
    (``scratch``: a wire-dtype buffer of its size, unused where the kernels round in place)."""
    if type(array) is np.ndarray and kernels.round_trip(array, scratch):
        return
    if _fast(array, array, _F32, _F32) and ops.is_bfloat16(scratch.dtype):
        _round_trip_bf16(array)
    else:
        narrow(array, scratch)
        widen(scratch, array)


class WireChannel(Channel):
    """A `Channel` whose payloads travel narrowed: the twin of a plain channel (the same
    communicator, scratch, schedules and byte counter) whose data calls narrow what they send
    and widen what they receive, so the algorithms run unchanged and reduce in the input dtype.

    Sends narrow into a pooled wire buffer (kept until the send completes); receives land in a
    pooled wire buffer and are widened into the caller's array when they complete (blocking
    calls at once, non-blocking ones in `wait`/`waitall`). The shared counter counts what travels.
    """

    def __init__(self, base: Channel, wire: np.dtype) -> None:
        self.__dict__.update(base.__dict__)  # the twin: shared scratch, schedules, traffic, waiter
        self.wire = wire
        self._free: dict[int, list[Any]] = {}  # element count -> wire buffers not in use
        self._pending: dict[int, tuple[Any, Any, Any]] = {}  # id(request) -> (request, buffer, target)
        self._abandoned: list[tuple[Any, Any, Any]] = []  # those of a failed call still in flight
        self._nested: dict[int, WireChannel] = {}  # id -> WireChannel over a sub-channel

    # -- what the algorithms ask of a channel that narrows --

    def as_sent(self, piece: Any) -> None:
        """Round the piece this rank finished to the wire dtype, so it keeps the very value it
        sends on (narrowing a value on the wire's grid is exact): bitwise identity across ranks."""
        if piece.size:
            scratch = self.buffer(piece.size)
            try:
                round_trip(piece, scratch)
            finally:
                self.release(scratch)  # back to the pool: a warm call allocates nothing

    def travel_itemsize(self, itemsize: int) -> int:
        return self.wire.itemsize

    def sub_channels(self, topo: Any) -> tuple[Channel, Channel]:
        """Only the network carries narrowed data: inside the node the channel stays wide (shared
        memory moves it faster than it can be narrowed, and the node's sum is then rounded once),
        across nodes it narrows."""
        local, cross = super().sub_channels(topo)
        wide = cross
        cross = cross.resource(f"wire-{self.wire.name}", lambda: WireChannel(wide, self.wire))
        cross.timeout = self.timeout
        self._nested[id(cross)] = cross
        return local, cross

    # -- pooled wire buffers: grow-only, so a warm call allocates nothing --

    def buffer(self, count: int) -> Any:
        free = self._free.get(count)
        if free:
            return free.pop()
        return self.adapter.empty(count, self.wire)

    def release(self, buf: Any) -> None:
        self._free.setdefault(buf.size, []).append(buf)

    @contextlib.contextmanager
    def _lent(self, *bufs: Any) -> Iterator[None]:
        """The blocking calls' wire buffers go back to the pool on the way out, a failure (a
        raising op) included, except after a StallError: MPI may still read or write them (a
        send it could not finish, a receive it could not cancel), and the requests that hold
        them are kept (`hpcring.polling.abandon`); so they leave the pool for good."""
        try:
            yield
        except StallError:
            raise
        except BaseException:
            for buf in bufs:
                self.release(buf)
            raise
        for buf in bufs:
            self.release(buf)

    def pool_held(self) -> int:
        """Bytes of wire buffers this channel holds (pooled or in flight)."""
        held = [buf for bufs in self._free.values() for buf in bufs]
        held += [buf for _, buf, _ in (*self._pending.values(), *self._abandoned)]
        return sum(buf.nbytes for buf in held)

    # -- the data calls --

    def sendrecv(self, send: Any, dest: int, recv: Any, source: int) -> None:
        out, into = self.buffer(send.size), self.buffer(recv.size)
        with self._lent(out, into):
            super().sendrecv(narrow(send, out), dest, into, source)
            widen(into, recv)

    def send(self, send: Any, dest: int) -> None:
        out = self.buffer(send.size)
        with self._lent(out):
            super().send(narrow(send, out), dest)

    def recv(self, recv: Any, source: int) -> None:
        into = self.buffer(recv.size)
        with self._lent(into):
            super().recv(into, source)
            widen(into, recv)

    def isend(self, send: Any, dest: int, tag: int = 0) -> Any:
        out = self.buffer(send.size)
        try:
            request = super().isend(narrow(send, out), dest, tag)
        except BaseException:
            self.release(out)
            raise
        self._pending[id(request)] = (request, out, None)
        return request

    def irecv(self, recv: Any, source: int, tag: int = 0) -> Any:
        into = self.buffer(recv.size)
        try:
            request = super().irecv(into, source, tag)
        except BaseException:
            self.release(into)
            raise
        self._pending[id(request)] = (request, into, recv)
        return request

    def settle(self) -> None:
        """After a failed call: the buffers of requests that completed go back to the pool; those
        of requests MPI may still read or write are set aside (never reused) until a later
        settle finds them complete. So a failure leaks no pooled buffer and corrupts no later call."""
        held = [*self._abandoned, *self._pending.values()]
        self._pending.clear()
        self._abandoned.clear()
        for request, buf, target in held:
            try:
                done = request.Test()
            except Exception:  # a failed request: MPI holds nothing of it
                done = True
            if done:
                self.release(buf)
            else:
                self._abandoned.append((request, buf, target))
        for inner in self._nested.values():
            inner.settle()

    def _finish(self, request: Any) -> None:
        held = self._pending.pop(id(request), None)
        if held is not None:
            _, buf, target = held
            if target is not None:
                widen(buf, target)
            self.release(buf)

    def wait(self, request: Any, nap: float = 0.0) -> None:
        super().wait(request, nap)
        self._finish(request)

    def waitall(self, requests: Iterable[Any], nap: float = 0.0) -> None:
        pending = list(requests)
        super().waitall(pending, nap)
        for request in pending:
            self._finish(request)

    def gather(self, send: Any, stack: Any, root: int) -> None:
        if self.rank == root:
            flat = self.buffer(stack.size)
            with self._lent(flat):
                rows = flat.reshape(stack.shape)
                narrow(stack[root], rows[root])  # the root's own row: rounded like every other
                super().gather(None, rows, root)
                widen(rows, stack)
        else:
            out = self.buffer(send.size)
            with self._lent(out):
                super().gather(narrow(send, out), None, root)

    def bcast(self, buf: Any, root: int) -> None:
        words = self.buffer(buf.size)
        with self._lent(words):
            if self.rank == root:
                narrow(buf, words)
            super().bcast(words, root)
            widen(words, buf)  # the root too: it keeps what it sent


def channel(ch: Channel, wire: np.dtype) -> WireChannel:
    """The `WireChannel` over ``ch`` for ``wire``, made once per channel and kept with it."""
    return ch.resource(f"wire-{wire.name}", lambda: WireChannel(ch, wire))


def pool_bytes(count: int, wire: np.dtype) -> int:
    """What a call's wire buffers come to, about: one narrowed copy of the data in flight (a send
    and a receive buffer per message; gather's root holds G rows, which its scratch prices)."""
    return count * wire.itemsize


def _spec(algorithm: str) -> Spec:
    """The all-reduce Spec of ``algorithm``, where it can narrow (ValueError otherwise)."""
    spec = algorithms.spec("allreduce", algorithm)
    if spec.narrowings is None:
        raise ValueError(f"algorithm {algorithm!r} moves data inside the library and cannot narrow it")
    return spec


def bytes_sent(
    algorithm: str, count: int, itemsize: int, wire: np.dtype, size: int, rank: int, per_node: int = 1
) -> int | None:
    """Bytes rank ``rank`` hands to MPI for one all-reduce with ``wire``: the algorithm's formula
    with every element that travels narrowed costing the wire's itemsize (a two-level algorithm
    narrows only across nodes: its Spec is topology-aware)."""
    return _spec(algorithm).sent(count, itemsize, size, rank, per_node, wire.itemsize)


def narrowings(algorithm: str, size: int, per_node: int = 1) -> int:
    """How many times the value of one element is rounded to the wire dtype on its way to the
    result (its longest path), for ``size`` ranks: the k in the error bound (the Spec says)."""
    return _spec(algorithm).narrowings(size, per_node) if size > 1 else 0  # type: ignore[misc]


def error_bound(algorithm: str, size: int, wire: str, input_unit_roundoff: float, per_node: int = 1) -> float:
    """First-order bound on |result - exact sum| / sum_i |x_i| (elementwise), for sum.

    Each narrowing rounds a partial sum s with |s| <= sum_i |x_i| once (relative error <= u of the
    wire); the wide additions add at most (G-1) u_in more. Worst case; random data sees ~sqrt(k)
    times u (docs/compression.md).
    """
    k = narrowings(algorithm, size, per_node)
    return k * UNIT_ROUNDOFF[wire] + max(size - 1, 0) * input_unit_roundoff
