"""Wire compression: what travels is narrowed (bfloat16 or float16), every reduction stays wide.

``hpcring.allreduce(x, wire="bfloat16")`` runs the algorithm it names on a `WireChannel`: the
same schedule, neighbours and reductions, but every payload the Channel hands to MPI is first
narrowed to the wire dtype, and every payload received is widened back to ``x``'s dtype before
the algorithm reads it. So a received chunk is widened, added to the local partial in the input
dtype, and narrowed only when it is sent on: each hop rounds a partial sum once.

Bitwise identity across ranks: the rank that finishes a segment (the owner, after the
reduce-scatter) rounds it to the wire dtype in place (`round_owned`) before passing it on, so
what it keeps is exactly what the others receive (narrowing a value that is already
representable is exact). Algorithms with no owner (naive, ps) round each rank's own contribution
the same way. Numerics live here and nowhere else: `narrow`, `widen`, `round_owned`, and the
error bound (`narrowings`, `error_bound`, docs/compression.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import ml_dtypes
import numpy as np

from .channel import Channel

WIRES: dict[str, np.dtype] = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
# Input dtypes a wire applies to: wider floats only. Integers would be rounded (refused), and a
# float16/bfloat16 input has nothing to gain.
WIDE = (np.dtype(np.float32), np.dtype(np.float64))
# Unit roundoff of round-to-nearest: 2^-p for a significand of p bits (implicit bit included).
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11}


def check(wire: Any, dtype: np.dtype, algorithm: str, reproducible: bool, device: bool) -> np.dtype | None:
    """The wire dtype for this call (None: no wire), or TypeError/ValueError saying why not."""
    if wire is None:
        return None
    if not isinstance(wire, str) or wire not in WIRES:
        names = ", ".join(WIRES)
        raise ValueError(f"hpcring.allreduce: unknown wire {wire!r}; choose one of {names} or None")
    if algorithm in ("mpi", "nccl"):
        raise ValueError(
            f"hpcring.allreduce: algorithm={algorithm!r} moves data inside the library and cannot "
            f"narrow it; wire={wire!r} needs naive, ps, ring, rabenseifner, hierarchical or auto"
        )
    if dtype not in WIDE:
        raise TypeError(
            f"hpcring.allreduce: wire={wire!r} applies to float32 and float64 arrays, got {dtype.name}"
            + (" (integers would be rounded)" if dtype.kind in "iu" else "")
        )
    if reproducible:
        raise ValueError("hpcring.allreduce: reproducible=True and wire= cannot be combined")
    if device:
        raise TypeError(f"hpcring.allreduce: wire={wire!r} needs host arrays (NumPy, CPU torch, JAX)")
    return WIRES[wire]


def narrow(src: Any, out: Any) -> Any:
    """out (wire dtype) <- src rounded to nearest (even); returns out."""
    out[...] = src
    return out


def widen(src: Any, out: Any) -> Any:
    """out (input dtype) <- src (wire dtype), exactly; returns out."""
    out[...] = src
    return out


def round_trip(array: Any, scratch: Any) -> None:
    """array <- widen(narrow(array)), in place: the value a receiver of ``array`` would see."""
    narrow(array, scratch)
    widen(scratch, array)


def round_owned(ch: Any, piece: Any) -> None:
    """On a `WireChannel`, round the piece this rank finished to the wire dtype, so it keeps the
    very value it sends (bitwise identity); on a plain Channel, nothing."""
    if isinstance(ch, WireChannel) and piece.size:
        round_trip(piece, ch.buffer(piece.size))


class WireChannel:
    """A `Channel` whose payloads travel narrowed: every other attribute is the inner channel's.

    Sends narrow into a pooled wire buffer (kept until the send completes); receives land in a
    pooled wire buffer and are widened into the caller's array when they complete (blocking
    calls at once, non-blocking ones in `wait`/`waitall`). The inner channel counts the bytes,
    so what it counts is what travels.
    """

    def __init__(self, inner: Channel, wire: np.dtype) -> None:
        self.__dict__["inner"] = inner
        self.__dict__["wire"] = wire
        self.__dict__["_free"] = {}  # element count -> wire buffers not in use
        self.__dict__["_pending"] = {}  # id(request) -> (request, buffer, widen target or None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)  # bytes_sent += ... reaches the counter MPI's calls use

    # -- pooled wire buffers: grow-only, so a warm call allocates nothing --

    def buffer(self, count: int) -> Any:
        free = self._free.get(count)
        if free:
            return free.pop()
        return self.inner.backend.empty(count, self.wire)

    def release(self, buf: Any) -> None:
        self._free.setdefault(buf.size, []).append(buf)

    # -- the data calls --

    def sendrecv(self, send: Any, dest: int, recv: Any, source: int) -> None:
        out, into = narrow(send, self.buffer(send.size)), self.buffer(recv.size)
        self.inner.sendrecv(out, dest, into, source)
        widen(into, recv)
        self.release(out)
        self.release(into)

    def send(self, send: Any, dest: int) -> None:
        out = narrow(send, self.buffer(send.size))
        self.inner.send(out, dest)
        self.release(out)

    def recv(self, recv: Any, source: int) -> None:
        into = self.buffer(recv.size)
        self.inner.recv(into, source)
        widen(into, recv)
        self.release(into)

    def isend(self, send: Any, dest: int, tag: int = 0) -> Any:
        out = narrow(send, self.buffer(send.size))
        request = self.inner.isend(out, dest, tag)
        self._pending[id(request)] = (request, out, None)
        return request

    def irecv(self, recv: Any, source: int, tag: int = 0) -> Any:
        into = self.buffer(recv.size)
        request = self.inner.irecv(into, source, tag)
        self._pending[id(request)] = (request, into, recv)
        return request

    def _finish(self, request: Any) -> None:
        held = self._pending.pop(id(request), None)
        if held is not None:
            _, buf, target = held
            if target is not None:
                widen(buf, target)
            self.release(buf)

    def wait(self, request: Any, nap: float = 0.0) -> None:
        self.inner.wait(request, nap)
        self._finish(request)

    def waitall(self, requests: Iterable[Any], nap: float = 0.0) -> None:
        pending = list(requests)
        self.inner.waitall(pending, nap)
        for request in pending:
            self._finish(request)

    def gather(self, send: Any, stack: Any, root: int) -> None:
        if self.rank == root:
            rows = self.buffer(stack.size).reshape(stack.shape)
            narrow(stack[root], rows[root])  # the root's own row: rounded like every other
            self.inner.gather(None, rows, root)
            widen(rows, stack)
            self.release(rows.reshape(-1))
        else:
            out = narrow(send, self.buffer(send.size))
            self.inner.gather(out, None, root)
            self.release(out)

    def bcast(self, buf: Any, root: int) -> None:
        words = self.buffer(buf.size)
        if self.rank == root:
            narrow(buf, words)
        self.inner.bcast(words, root)
        widen(words, buf)  # the root too: it keeps what it sent
        self.release(words)


def channel(ch: Channel, wire: np.dtype) -> WireChannel:
    """The `WireChannel` over ``ch`` for ``wire``, made once per channel and kept with it."""
    return ch.resource(f"wire-{wire.name}", lambda: WireChannel(ch, wire))


def bytes_sent(
    algorithm: str, count: int, itemsize: int, wire: np.dtype, size: int, rank: int, per_node: int = 1
) -> int | None:
    """Bytes rank ``rank`` hands to MPI for one call with ``wire``: the algorithm's formula in the
    wire's itemsize, except inside the node for `hierarchical`, which narrows only across nodes."""
    from . import algorithms  # the algorithms import this module

    if algorithm == "hierarchical":
        return algorithms.hierarchical.bytes_sent(count, itemsize, size, rank, per_node, wire.itemsize)
    return algorithms.bytes_sent(algorithm, count, wire.itemsize, size, rank, per_node)


def narrowings(algorithm: str, size: int, per_node: int = 1) -> int:
    """How many times the value of one element is rounded to the wire dtype on its way to the
    result (its longest path), for ``size`` ranks: the k in the error bound."""
    if size <= 1:
        return 0
    if algorithm == "naive":
        return 1  # each input once; the sum is done wide, in rank order, on every rank
    if algorithm == "ps":
        return 2  # each input once on its way to the root, the root's sum once on the way back
    if algorithm == "rabenseifner":
        core = 1 << (size.bit_length() - 1)
        return int(math.log2(core)) + 1 + (size != core)  # halving steps, the owner, a fold
    if algorithm == "hierarchical" and per_node > 1 and size % per_node == 0 and size > per_node:
        return size // per_node  # the ring across nodes, owner included (the node's sum stays wide)
    return size  # ring: G-1 hops of partial sums, then the owner's rounding


def error_bound(algorithm: str, size: int, wire: str, input_unit_roundoff: float, per_node: int = 1) -> float:
    """First-order bound on |result - exact sum| / sum_i |x_i| (elementwise), for sum.

    Each narrowing rounds a partial sum s with |s| <= sum_i |x_i| once (relative error <= u of the
    wire); the wide additions add at most (G-1) u_in more. Worst case; random data sees ~sqrt(k)
    times u (docs/compression.md).
    """
    k = narrowings(algorithm, size, per_node)
    return k * UNIT_ROUNDOFF[wire] + max(size - 1, 0) * input_unit_roundoff
