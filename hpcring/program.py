"""A call's data movement as data: the step table the compiled core runs with the GIL released.

An algorithm is written once, in Python, against the `Channel` (`hpcring.algorithms`): that code
is the reference. The compiled core runs the very same steps without the interpreter by
*recording* them: `record` runs the algorithm's run function once on a `Tape`, a stand-in for the
channel whose arrays are `Sym`\\ s (symbolic flat arrays: a buffer, a byte offset, a shape, a
dtype), and every call the algorithm makes (a send, a receive, a wait, a reduction, a copy, a
library collective, a flight step) becomes one row of an int64 table. The rows name memory as
(buffer, byte offset): buffer 0 is the call's input, 1 its output, the others the channel's
scratch by name and the wire buffers. The compiled core (`hpcring.core`) executes the rows in
order, on the call's real buffers; `execute` below does the same in Python, as the table's
specification (the tests run both).

Why recorded rather than written twice: the table cannot drift from the algorithm, so both cores
send the same messages in the same order and reduce the same operands in the same order, which
is what makes their results the same bits; and any algorithm that only uses the channel (a new
one registered from outside included) gets the compiled step loop for nothing. An algorithm that
does something a table cannot hold (a data-dependent branch, an array operation the `Sym` has
not got, a staged device buffer) raises `Unrecordable` while it is recorded, and its calls keep
the Python path.

Every row is WIDTH int64s: the kind, then its operands (see the constants). A `wire=` channel's
narrowing and widening are rows of their own (NARROW before a send, WIDEN after a receive's
wait), on wire buffers assigned as `hpcring.wire.WireChannel` pools them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from . import kernels
from .algorithms.base import Spec

WIDTH = 12  # int64s per row

# Row kinds (column 0) and their operands (columns 1..):
SEND = 1  # comm, peer, tag, buf, off, nbytes: MPI_Isend; its request is this row's
RECV = 2  # comm, peer, tag, buf, off, nbytes: MPI_Irecv
WAIT = 3  # row, peer (-1: all), receive, nap (ns), comm: wait for that row's request, bounded
COMBINE = 4  # op, dtype, lbuf, loff, rbuf, roff, obuf, ooff, count: out <- left (op) right
COPY = 5  # dbuf, doff, sbuf, soff, nbytes
NARROW = 6  # sbuf, soff, dbuf, doff, count, from, to: the wire's rounding (hpcring.wire.narrow)
WIDEN = 7  # sbuf, soff, dbuf, doff, count, from, to: exact (hpcring.wire.widen)
ROUND = 8  # buf, off, count, dtype, wire, nbuf, noff: narrow and widen in place (WireChannel.as_sent),
# the narrowed values also stored at (nbuf, noff) where nbuf >= 0
STEP = 9  # value: the flight record's step (Channel.step)
COLLECTIVE = 10  # which, comm, root, sbuf (-1: MPI_IN_PLACE), soff, rbuf, roff, count, dtype, op, counts
# The reproducible sum's conversions (hpcring.exact), inside the algorithm's steps; buf -1: none
CODES = 11  # xbuf, xoff, inbuf, inoff, obuf, ooff, count, dtype: out <- codes of x (max with in)
ENCODE = 12  # xbuf, xoff, cbuf, coff, inbuf, inoff, obuf, ooff, count, dtype, floats: words (+ in)
DECODE = 13  # wbuf, woff, xbuf, xoff, cbuf, coff, obuf, ooff, count, packed, divisor: rounded (+ x)
WIDEN_ADD = 14  # sbuf, soff, bbuf, boff, obuf, ooff, count, from | to << 8, flags, nbuf, noff:
# out <- widen(s) + b (flags WIDE_LEFT: widen(s) the left operand); WIDE_ROUND: then rounded as
# ROUND, its narrowed values stored at (nbuf, noff) where nbuf >= 0; WIDE_NARROW: the sum's
# narrowed values stored at (nbuf, noff), and with WIDE_ONLY the wide sum not stored
GATHER = 15  # xbuf, xoff, rbuf, roff, stride, others, obuf, ooff, count, dtype, divisor: out <- the
# reproducible sum of x and ``others`` rows from (rbuf, roff), ``stride`` elements apart (exact.gathered_sum)
# `which` of a COLLECTIVE: the library's blocking ones (`mpi`), and ps's non-blocking ones; then
# the all-to-all's (`mpi`'s MPI_Alltoall of equal blocks, count: the bytes of one block)
ALLREDUCE, REDUCE_SCATTER, ALLGATHER, BCAST, IGATHER, IBCAST, ALLTOALL = range(7)
KINDS = {
    SEND: "send",
    RECV: "recv",
    WAIT: "wait",
    COMBINE: "combine",
    COPY: "copy",
    NARROW: "narrow",
    WIDEN: "widen",
    ROUND: "round",
    STEP: "step",
    COLLECTIVE: "collective",
    CODES: "codes",
    ENCODE: "encode",
    DECODE: "decode",
    WIDEN_ADD: "widen_add",
    GATHER: "gather",
}
SRC, DST = 0, 1  # buffer numbers of the call's input and output
OPS = {"add": 0, "maximum": 1, "minimum": 2, "multiply": 3}  # kernels.OP_CODES
MPI_OPS = ("SUM", "MAX", "MIN", "PROD")  # the same codes, as mpi4py names them
LIBRARY_DTYPES = ("float32", "float64", "int32", "int64", "complex64", "complex128", "uint8", "uint16")


class Unrecordable(Exception):
    """The algorithm did something a step table cannot hold; its calls keep the Python path."""


class Buffer:
    """One memory a program names: the input, the output, a channel's scratch or a wire pool.
    (Plain classes, this and `Program`: a code's second call imports this module, and dataclasses
    would add their module's import and about 0.4 ms each to it, docs/embedding.md.)"""

    __slots__ = ("comm", "kind", "name", "nbytes")

    def __init__(self, kind: str, comm: int = 0, name: str = "", nbytes: int = 0) -> None:
        self.kind = kind  # "src", "dst", "scratch", "wire"
        self.comm = comm  # scratch: which channel's (0 the call's, 1 and 2 a two-level algorithm's)
        self.name = name  # scratch: its name in that channel
        self.nbytes = nbytes  # scratch and wire: bytes it must hold

    def __repr__(self) -> str:
        return f"Buffer({self.kind!r}, {self.comm}, {self.name!r}, {self.nbytes})"


class Program:
    """The table and what it refers to."""

    __slots__ = ("buffers", "channels", "counts", "rows", "sent", "unknown")

    def __init__(
        self,
        rows: np.ndarray,
        buffers: list[Buffer],
        channels: list[Any],
        counts: np.ndarray,
        sent: int,
        unknown: bool,
    ) -> None:
        self.rows = rows  # (n, WIDTH) int64
        self.buffers = buffers
        self.channels = channels  # the real channels the comm numbers stand for
        self.counts = counts  # int32: the counts a REDUCE_SCATTER row refers to
        self.sent = sent  # bytes handed to MPI by one run (what Channel.traffic counts)
        self.unknown = unknown  # a library collective ran (its traffic is not visible)

    def describe(self) -> list[str]:
        """The rows in words (for a reader, and for a failing test's message)."""
        return [f"{KINDS.get(int(r[0]), '?')} {list(map(int, r[1:]))}" for r in self.rows]


# ---- symbolic arrays -----------------------------------------------------------------------


class Sym:
    """A C-contiguous array that is only a name for memory: buffer number, byte offset, shape,
    dtype. What an algorithm does with it (slicing, reshaping, assigning) is what NumPy would do
    to the real array's view, or Unrecordable."""

    __slots__ = ("buf", "dtype", "offset", "shape", "tape")

    def __init__(self, tape: Tape, buf: int, offset: int, shape: tuple[int, ...], dtype: Any) -> None:
        self.tape, self.buf, self.offset, self.shape, self.dtype = tape, buf, offset, shape, np.dtype(dtype)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """A made-up address per (buffer, offset), so `same_memory` compares Syms as arrays."""
        return {"data": ((self.buf + 1) << 44 | self.offset, False), "shape": self.shape}

    def _row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def __getitem__(self, key: Any) -> Sym:
        if key is Ellipsis:
            return self
        keys = key if isinstance(key, tuple) else (key,)
        out = self
        axis = 0  # the axis of ``out`` the next key applies to
        for k in keys:
            if out.ndim <= axis:
                raise Unrecordable(f"index {key!r} of a {self.ndim}-d array")
            n = out.shape[axis]
            if isinstance(k, (int, np.integer)):
                if axis:
                    raise Unrecordable("an integer index past the first axis")
                i = int(k) + (n if k < 0 else 0)
                if not 0 <= i < n:
                    raise Unrecordable(f"index {k} out of range")
                out = Sym(self.tape, out.buf, out.offset + i * out._row_bytes(), out.shape[1:], out.dtype)
            elif isinstance(k, slice):
                start, stop, step = k.indices(n)
                if step != 1:
                    raise Unrecordable("a strided slice")
                stop = max(stop, start)
                if axis == 0:
                    shape = (stop - start, *out.shape[1:])
                    out = Sym(self.tape, out.buf, out.offset + start * out._row_bytes(), shape, out.dtype)
                elif (start, stop) != (0, n):
                    if out.shape[0] != 1:
                        raise Unrecordable("a slice that is not contiguous")
                    shape = (1, stop - start)
                    out = Sym(self.tape, out.buf, out.offset + start * out.dtype.itemsize, shape, out.dtype)
                axis += 1
            else:
                raise Unrecordable(f"index {k!r}")
        return out

    def __setitem__(self, key: Any, value: Any) -> None:
        target = self[key]
        if not isinstance(value, Sym) or value.size != target.size or value.dtype != target.dtype:
            raise Unrecordable("an assignment of something other than an array of the same size")
        self.tape.program.copy(target, value)

    def reshape(self, *shape: Any) -> Sym:
        wanted = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else tuple(shape)
        if -1 in wanted:
            known = int(np.prod([d for d in wanted if d != -1], dtype=np.int64))
            wanted = tuple(self.size // known if d == -1 else d for d in wanted)
        if int(np.prod(wanted, dtype=np.int64)) != self.size:
            raise Unrecordable(f"reshape of {self.shape} to {wanted}")
        return Sym(self.tape, self.buf, self.offset, tuple(int(d) for d in wanted), self.dtype)

    def view(self, dtype: Any) -> Sym:
        dtype = np.dtype(dtype)
        last = self.shape[-1] if self.shape else 1
        if (last * self.dtype.itemsize) % dtype.itemsize:
            raise Unrecordable("a view whose last axis does not divide")
        shape = (*self.shape[:-1], last * self.dtype.itemsize // dtype.itemsize)
        return Sym(self.tape, self.buf, self.offset, shape, dtype)

    def region(self) -> tuple[int, int, int]:
        """(buffer, byte offset, bytes)."""
        return self.buf, self.offset, self.nbytes


def packed(dtype: int, floats: bool, terms: int | None) -> int:
    """A DECODE row's dtype code, float words and terms (None: unknown) in one operand."""
    return dtype | int(floats) << 8 | (0 if terms is None else terms + 1) << 16


def unpacked(value: int) -> tuple[int, bool, int | None]:
    """`packed`'s three back."""
    terms = value >> 16
    return value & 0xFF, bool(value >> 8 & 1), None if terms == 0 else terms - 1


class _Xp:
    """The array module the algorithms see while recorded: its element-wise functions are rows,
    and so are the reproducible sum's conversions (`hpcring.exact` asks ``records``)."""

    records = True

    def __init__(self, tape: Tape) -> None:
        self.tape = tape

    def _at(self, a: Sym | None) -> tuple[int, int]:
        return (-1, 0) if a is None else a.region()[:2]

    def exact_codes(self, x: Sym, into: Sym | None, out: Sym) -> None:
        if x.size:
            self.tape.program.add(
                CODES, *self._at(x), *self._at(into), *self._at(out), x.size, _code(x.dtype)
            )

    def exact_encode(self, x: Sym, code: Sym, into: Sym | None, out: Sym, floats: bool) -> None:
        if x.size:
            self.tape.program.add(
                ENCODE,
                *self._at(x),
                *self._at(code),
                *self._at(into),
                *self._at(out),
                x.size,
                _code(x.dtype),
                int(floats),
            )

    def exact_gather(self, own: Sym, rows: Sym, stride: int, others: int, out: Sym, divisor: int) -> None:
        if out.size:
            self.tape.program.add(
                GATHER,
                *self._at(own),
                *self._at(rows),
                stride,
                others,
                *self._at(out),
                out.size,
                _code(out.dtype),
                divisor,
            )

    def exact_decode(
        self, words: Sym, mine: Sym | None, code: Sym, out: Sym, divisor: int, terms: int | None, floats: bool
    ) -> None:
        if out.size:
            self.tape.program.add(
                DECODE,
                *self._at(words),
                *self._at(mine),
                *self._at(code),
                *self._at(out),
                out.size,
                packed(_code(out.dtype), floats, terms),
                divisor,
            )

    def _combine(self, ufunc: str, left: Sym, right: Sym, out: Sym) -> None:
        self.tape.program.combine(ufunc, left, right, out)

    def add(self, left: Sym, right: Sym, out: Sym) -> None:
        self._combine("add", left, right, out)

    def maximum(self, left: Sym, right: Sym, out: Sym) -> None:
        self._combine("maximum", left, right, out)

    def minimum(self, left: Sym, right: Sym, out: Sym) -> None:
        self._combine("minimum", left, right, out)

    def multiply(self, left: Sym, right: Sym, out: Sym) -> None:
        self._combine("multiply", left, right, out)

    def copyto(self, dst: Sym, src: Sym) -> None:
        self.tape.program.copy(dst, src)

    def __getattr__(self, name: str) -> Any:
        raise Unrecordable(f"xp.{name}")


# ---- the table being written ---------------------------------------------------------------


class _Builder:
    """The rows, the buffers they name, the wire pools and the bytes they send."""

    def __init__(self, itemsize_of_wire: int | None) -> None:
        self.rows: list[list[int]] = []
        self.buffers = [Buffer("src"), Buffer("dst")]
        self.scratch: dict[tuple[int, str], int] = {}
        self.counts: list[int] = []
        self.sent = 0
        self.unknown = False
        self.pending: dict[int, tuple[Sym | None, Sym | None]] = {}  # request row -> (wire slot, target)
        self.free: dict[int, list[int]] = {}  # wire pool: free slots by bytes, as WireChannel pools them
        self.wire_top = 0
        # wire=: where the narrowed value of a wide region is known to lie: (buf, off, nbytes) ->
        # the slot (a receive's, before it was widened; the owner's, as it was rounded), until
        # a row writes either; a send of the region then sends the slot instead of narrowing again
        self.known: dict[tuple[int, int, int], Sym] = {}

    def add(self, kind: int, *operands: int) -> int:
        if len(operands) >= WIDTH:
            raise AssertionError("a row with too many operands")
        row = [kind, *map(int, operands), *[0] * (WIDTH - 1 - len(operands))]
        self.rows.append(row)
        if self.known:
            writes = _touched(row)[1]
            self.known = {
                region: slot
                for region, slot in self.known.items()
                if not any(_meets(w, r) for w in writes for r in (_span(region), _span(slot.region())))
            }
        return len(self.rows) - 1

    def buffer(self, comm: int, name: str, nbytes: int) -> int:
        key = (comm, name)
        if key not in self.scratch:
            self.scratch[key] = len(self.buffers)
            self.buffers.append(Buffer("scratch", comm, name, 0))
        number = self.scratch[key]
        self.buffers[number].nbytes = max(self.buffers[number].nbytes, nbytes)
        return number

    def wire_slot(self, tape: Tape, count: int, dtype: np.dtype) -> Sym:
        """A wire buffer of ``count`` elements: a free one of that size, else a new one."""
        nbytes = count * dtype.itemsize
        free = self.free.get(nbytes)
        if free:
            offset = free.pop()
        else:
            offset, self.wire_top = self.wire_top, self.wire_top + max(nbytes, 8) + (-nbytes % 8)
        number = self.buffer(0, "wire", self.wire_top)
        return Sym(tape, number, offset, (count,), dtype)

    def release(self, slot: Sym) -> None:
        """``slot`` back to the pool; one that holds a known narrowed value is taken last."""
        free = self.free.setdefault(slot.nbytes, [])
        if any(held.offset == slot.offset for held in self.known.values()):
            free.insert(0, slot.offset)
        else:
            free.append(slot.offset)

    def forwarded(self, region: tuple[int, int, int]) -> Sym | None:
        """The slot holding the narrowed value of ``region``, taken out of the pool, or None."""
        slot = self.known.pop(region, None)
        if slot is not None:
            free = self.free.get(slot.nbytes, [])
            if slot.offset in free:
                free.remove(slot.offset)
        return slot

    def combine(self, ufunc: str, left: Sym, right: Sym, out: Sym) -> None:
        for a in (left, right, out):
            if not isinstance(a, Sym):
                raise Unrecordable("a reduction of something other than the call's arrays")
        if not left.size == right.size == out.size or not left.dtype == right.dtype == out.dtype:
            raise Unrecordable("a reduction of arrays that differ in size or dtype")
        for operand in (left, right):  # out must be the operand itself or apart from it
            if _overlaps(operand, out) and operand.region() != out.region():
                raise Unrecordable("a reduction whose output partly overlaps an operand")
        code = kernels.DTYPE_CODES.get(out.dtype)
        if code is None:
            raise Unrecordable(f"a reduction of {out.dtype}")
        if out.size:
            self.add(
                COMBINE,
                OPS[ufunc],
                code,
                *left.region()[:2],
                *right.region()[:2],
                *out.region()[:2],
                out.size,
            )

    def copy(self, dst: Sym, src: Sym) -> None:
        if not isinstance(src, Sym) or src.nbytes != dst.nbytes:
            raise Unrecordable("a copy of something other than the call's arrays")
        if dst.nbytes and dst.region() != src.region():
            self.add(COPY, *dst.region()[:2], *src.region())

    def program(self, channels: list[Any]) -> Program:
        rows = np.array(_fused(self.rows, self.buffers), dtype=np.int64).reshape(-1, WIDTH)
        return Program(rows, self.buffers, channels, np.array(self.counts, np.int32), self.sent, self.unknown)


# ---- fusing rows: one pass over memory where the recording made two ---------------------------

ITEMSIZE = (2, 2, 4, 8, 4, 8, 8, 16, 1, 2)  # by kernels' dtype code (enum hr_dtype)
_EVERYTHING = (-1, 0, 1 << 62)  # what a library collective may touch: any buffer


def _touched(row: list[int]) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """The (buffer, start, stop) byte ranges a row reads and those it writes (a receive writes
    its buffer; a library collective is taken to read everything)."""
    k, a = row[0], row[1:]

    def span(buf: int, off: int, nbytes: int) -> list[tuple[int, int, int]]:
        return [] if buf < 0 else [(buf, off, off + nbytes)]

    if k == SEND:
        return span(a[3], a[4], a[5]), []
    if k == RECV:
        return [], span(a[3], a[4], a[5])
    if k == COMBINE:
        n = a[8] * ITEMSIZE[a[1]]
        return span(a[2], a[3], n) + span(a[4], a[5], n), span(a[6], a[7], n)
    if k == COPY:
        return span(a[2], a[3], a[4]), span(a[0], a[1], a[4])
    if k in (NARROW, WIDEN):
        return span(a[0], a[1], a[4] * ITEMSIZE[a[5]]), span(a[2], a[3], a[4] * ITEMSIZE[a[6]])
    if k == ROUND:
        both = span(a[0], a[1], a[2] * ITEMSIZE[a[3]])
        return both, both + span(a[5], a[6], a[2] * ITEMSIZE[a[4]])
    if k == WIDEN_ADD:
        wire, wide = ITEMSIZE[a[7] & 0xFF], ITEMSIZE[a[7] >> 8]
        reads = span(a[0], a[1], a[6] * wire) + span(a[2], a[3], a[6] * wide)
        written = [] if a[8] & 8 else span(a[4], a[5], a[6] * wide)  # WIDE_ONLY: no wide sum
        return reads, written + span(a[9], a[10], a[6] * wire)
    if k in (WAIT, STEP):
        return [], []
    return [_EVERYTHING], [_EVERYTHING]  # COLLECTIVE, the exact rows: never reordered around


def _span(region: tuple[int, int, int]) -> tuple[int, int, int]:
    """(buffer, start, stop) of a Sym's (buffer, offset, bytes)."""
    return region[0], region[1], region[1] + region[2]


def _meets(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    return (a[0] == b[0] or -1 in (a[0], b[0])) and a[1] < b[2] and b[1] < a[2]


def _dead(rows: list[list[int]], after: int, region: tuple[int, int, int], buffers: list[Buffer]) -> bool:
    """Whether nothing reads ``region`` after row ``after`` before it is written whole (scratch and
    wire buffers only: the call's input and output are never dead)."""
    for row in rows[after + 1 :]:
        reads, writes = _touched(row)
        if any(_meets(r, region) for r in reads):
            return False
        if any(w[0] == region[0] and w[1] <= region[1] and region[2] <= w[2] for w in writes):
            return True
    return buffers[region[0]].kind == "scratch"


# WIDEN_ADD's flags (enum in hpcring/_c/wire.h)
WIDE_LEFT, WIDE_ROUND, WIDE_NARROW, WIDE_ONLY = 1, 2, 4, 8


def _fused(rows: list[list[int]], buffers: list[Buffer]) -> list[list[int]]:
    """The rows with a wire= channel's steps fused, each one pass over memory where the recording
    made two or three (the WAIT rows' request numbers follow the rows they name):

    - a widening that a sum reads at once: one WIDEN_ADD (the received words are widened as they
      are added; the wide copy is never written, where it is the sum's own output or dead);
    - the owner's rounding right after its last sum: that WIDEN_ADD rounds (and stores the wire
      values the all-gather sends on);
    - a partial sum narrowed for the next step's send: its WIDEN_ADD narrows into the send's
      buffer as it sums, and stores no wide sum where nothing reads it."""
    rows = [list(row) for row in rows]
    names = list(range(len(rows)))  # each row's number in the recording
    i = 0
    while i + 1 < len(rows):
        row, nxt = rows[i], rows[i + 1]
        if row[0] == WIDEN and nxt[0] == COMBINE and nxt[1] == OPS["add"]:
            sbuf, soff, tbuf, toff, count, wire, dtype = row[1:8]
            lbuf, loff, rbuf, roff, obuf, ooff, n = nxt[3:10]
            target = (tbuf, toff)
            if nxt[2] == dtype and n == count and target in ((lbuf, loff), (rbuf, roff)):
                left = target == (lbuf, loff)
                other = (rbuf, roff) if left else (lbuf, loff)
                region = (tbuf, toff, toff + count * ITEMSIZE[dtype])
                if other != target and (target == (obuf, ooff) or _dead(rows, i + 1, region, buffers)):
                    flags = WIDE_LEFT if left else 0
                    pair = wire | dtype << 8
                    rows[i] = [WIDEN_ADD, sbuf, soff, *other, obuf, ooff, count, pair, flags, -1, 0]
                    del rows[i + 1], names[i + 1]
                    continue
        if (  # the owner's rounding, as its last sum is made
            row[0] == WIDEN_ADD
            and nxt[0] == ROUND
            and not row[9] & (WIDE_ROUND | WIDE_NARROW)
            and (row[5], row[6], row[7]) == (nxt[1], nxt[2], nxt[3])
            and row[8] == nxt[5] | nxt[4] << 8
        ):
            row[9] |= WIDE_ROUND
            row[10], row[11] = nxt[6], nxt[7]
            del rows[i + 1], names[i + 1]
            continue
        i += 1
    by_name = dict(zip(names, rows, strict=True))
    for j in range(len(rows)):
        if rows[j][0] == NARROW:
            k = _narrowed_by(rows, j, by_name)
            if k is not None:
                narrow, total = rows[j], rows[k]
                total[9] |= WIDE_NARROW
                total[10], total[11] = narrow[3], narrow[4]
                rows[j] = [STEP, -1, *[0] * (WIDTH - 2)]  # gone (below)
                wide = (total[5], total[6], total[6] + total[7] * ITEMSIZE[total[8] >> 8])
                if _dead(rows, j, wide, buffers):
                    total[9] |= WIDE_ONLY
    kept = [(name, row) for name, row in zip(names, rows, strict=True) if row[:2] != [STEP, -1]]
    moved = {name: index for index, (name, _) in enumerate(kept)}
    out = [row for _, row in kept]
    for row in out:
        if row[0] == WAIT:
            row[1] = moved[row[1]]
    return out


def _narrowed_by(rows: list[list[int]], j: int, by_name: dict[int, list[int]]) -> int | None:
    """The WIDEN_ADD row before row ``j`` (a NARROW) that made the very values it narrows, with
    nothing between touching them or the wire buffer it narrows into (a send still reading that
    buffer included); None where there is none."""
    narrow = rows[j]
    count, wide, wire = narrow[5], narrow[6], narrow[7]
    source = (narrow[1], narrow[2], narrow[2] + count * ITEMSIZE[wide])
    slot = (narrow[3], narrow[4], narrow[4] + count * ITEMSIZE[wire])
    for k in range(j - 1, -1, -1):
        row = rows[k]
        if row[0] == WIDEN_ADD:
            out = (row[5], row[6], row[6] + row[7] * ITEMSIZE[row[8] >> 8])
            if out == source and row[8] == wire | wide << 8 and not row[9] & ~WIDE_LEFT:
                return k
        reads, writes = _touched(row)
        if row[0] == WAIT:  # a request still in flight until here: its buffer is in use
            reads = writes = _touched(by_name[row[1]])[0] + _touched(by_name[row[1]])[1]
        if any(_meets(r, source) or _meets(r, slot) for r in reads + writes):
            return None
    return None


def _overlaps(a: Sym, b: Sym) -> bool:
    return a.buf == b.buf and a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes


# ---- the channel the algorithm talks to while recorded --------------------------------------


class Tape:
    """A `Channel` as an algorithm sees it, writing rows instead of calling MPI.

    Setup questions (the topology, cached schedules, settings) go to the real channel; data
    calls become rows. With ``wire``, payloads are narrowed and widened as `WireChannel` does."""

    def __init__(self, real: Any, program: _Builder, comm: int, wire: np.dtype | None, main: bool) -> None:
        self.real, self.program, self.number, self.wire, self.main = real, program, comm, wire, main
        self.rank, self.size = real.rank, real.size
        self.adapter, self.config, self.comm = real.adapter, real.config, real.comm
        self.traffic = _Traffic()
        self.xp = _Xp(self)
        self.timeout = real.timeout
        self._step = 0
        self.channels: list[Any] = []  # shared by a tape and its sub-tapes: the real channels by number
        self.convert: Any = None  # `converting`'s op: what this rank's contribution becomes when sent

    # -- the flight step: ch.step += 1 becomes a row (only the call's own channel counts) --

    @property
    def step(self) -> int:
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = value
        if self.main and value:
            self.program.add(STEP, value)

    # -- setup: the real channel's --

    def topology(self) -> Any:
        return self.real.topology()

    def schedule(self, key: tuple[Any, ...], build: Any) -> Any:
        return self.real.schedule(key, build)

    def cached(self, key: tuple[Any, ...]) -> Any:
        return self.real.cached(key)

    def resource(self, name: str, build: Any) -> Any:
        return self.real.resource(name, build)

    def travel_itemsize(self, itemsize: int) -> int:
        return self.wire.itemsize if self.wire is not None else itemsize

    def arrive(self, what: str) -> None:
        raise Unrecordable("a barrier inside the algorithm")

    def sub_channels(self, topo: Any) -> tuple[Tape, Tape]:
        """The two levels' channels, as `Channel.sub_channels` gives them; with ``wire``, only the
        one across nodes narrows (`WireChannel.sub_channels`)."""
        local, cross = self.real.sub_channels(topo)
        made = []
        for real, wire in ((local, None), (cross, self.wire)):
            number = len(self.channels)
            self.channels.append(real)
            sub = Tape(real, self.program, number, wire, main=False)
            sub.channels = self.channels
            made.append(sub)
        return made[0], made[1]

    def converting(self, op: Any) -> Tape:
        """This tape as `hpcring.exact.Converting` is the channel: the pieces of this rank's
        contribution that ``op`` converts are converted into wire buffers where they are sent
        (rows of their own, before the send). The flight step is this tape's."""
        twin = _ConvertingTape(self, op)
        twin.channels = self.channels
        return twin

    def scratch(self, name: str, count: int, dtype: Any) -> Sym:
        dtype = np.dtype(dtype)
        number = self.program.buffer(self.number, name, count * dtype.itemsize)
        return Sym(self, number, 0, (count,), dtype)

    def as_sent(self, piece: Sym) -> None:
        """The owner's rounding, which also leaves the narrowed piece in a wire buffer of its own:
        its sends then narrow nothing (`_narrowed`)."""
        if self.wire is not None and piece.size:
            slot = self.program.wire_slot(self, piece.size, self.wire)
            self.program.add(
                ROUND,
                *piece.region()[:2],
                piece.size,
                _code(piece.dtype),
                _code(self.wire),
                *slot.region()[:2],
            )
            self.program.known[piece.region()] = slot

    # -- point to point, as `Channel` and `WireChannel` send and receive --

    def _count(self, send: Sym, dest: int) -> None:
        if dest != self.rank:
            self.program.sent += send.nbytes

    def _narrowed(self, send: Sym) -> Sym:
        if self.convert is not None and self.convert.converts(send):
            count, dtype = self.convert.wire(send)
            slot = self.program.wire_slot(self, count, np.dtype(dtype))
            self.convert.convert(self.xp, send, slot)
            return slot
        if self.wire is None:
            return send
        slot = self.program.forwarded(send.region())  # what was received or rounded, sent as it is
        if slot is not None:
            return slot
        slot = self.program.wire_slot(self, send.size, self.wire)
        self.program.add(
            NARROW, *send.region()[:2], *slot.region()[:2], send.size, _code(send.dtype), _code(self.wire)
        )
        return slot

    def _wire_in(self, recv: Sym) -> Sym:
        return recv if self.wire is None else self.program.wire_slot(self, recv.size, self.wire)

    def _widen(self, slot: Sym, recv: Sym) -> None:
        self.program.add(
            WIDEN, *slot.region()[:2], *recv.region()[:2], recv.size, _code(self.wire), _code(recv.dtype)
        )
        self.program.known[recv.region()] = slot
        self.program.release(slot)

    def _isend(self, send: Sym, dest: int, tag: int) -> int:
        self._count(send, dest)
        return self.program.add(SEND, self.number, dest, tag, *send.region())

    def _irecv(self, recv: Sym, source: int, tag: int) -> int:
        return self.program.add(RECV, self.number, source, tag, *recv.region())

    def _wait(self, row: int, peer: int, receive: bool, nap: float = 0.0) -> None:
        self.program.add(WAIT, row, peer, int(receive), round(nap * 1e9), self.number)

    def sendrecv(self, send: Sym, dest: int, recv: Sym, source: int) -> None:
        flat = _flat(send)
        out, into = self._narrowed(flat), self._wire_in(_flat(recv))
        received = self._irecv(into, source, 0)
        sent = self._isend(out, dest, 0)
        self._wait(received, source, True)
        self._wait(sent, dest, False)
        if self.wire is not None:
            self._widen(into, _flat(recv))
        if out is not flat:
            self.program.release(out)

    def send(self, send: Sym, dest: int) -> None:
        flat = _flat(send)
        out = self._narrowed(flat)
        self._wait(self._isend(out, dest, 0), dest, False)
        if out is not flat:
            self.program.release(out)

    def recv(self, recv: Sym, source: int) -> None:
        into = self._wire_in(_flat(recv))
        self._wait(self._irecv(into, source, 0), source, True)
        if self.wire is not None:
            self._widen(into, _flat(recv))

    def isend(self, send: Sym, dest: int, tag: int = 0) -> int:
        flat = _flat(send)
        out = self._narrowed(flat)
        row = self._isend(out, dest, tag)
        self.program.pending[row] = (out if out is not flat else None, None)
        return row

    def irecv(self, recv: Sym, source: int, tag: int = 0) -> int:
        into = self._wire_in(_flat(recv))
        row = self._irecv(into, source, tag)
        self.program.pending[row] = (into, _flat(recv)) if self.wire is not None else (None, None)
        return row

    def wait(self, request: int, nap: float = 0.0) -> None:
        row = self.program.rows[request]
        self._wait(request, row[2], row[0] == RECV, nap)
        slot, target = self.program.pending.pop(request, (None, None))
        if slot is not None:
            if target is not None:
                self._widen(slot, target)
            else:
                self.program.release(slot)

    def waitall(self, requests: Iterable[int], nap: float = 0.0) -> None:
        for request in list(requests):
            self.wait(request, nap)

    def sendrecv_host(self, *args: Any) -> None:
        raise Unrecordable("a staged (device) exchange")

    def allreduce_init(self, *args: Any) -> None:
        raise Unrecordable("a persistent request")

    # -- collectives --

    def gather(self, send: Sym | None, stack: Sym, root: int) -> None:
        """`Channel.gather` (the root's row in place), narrowed as `WireChannel.gather` where wire."""
        if self.rank == root:
            rows = stack
            if self.wire is not None:
                rows = self.program.wire_slot(self, stack.size, self.wire).reshape(stack.shape)
                mine = rows[root]
                self.program.add(
                    NARROW,
                    *stack[root].region()[:2],
                    *mine.region()[:2],
                    mine.size,
                    _code(stack.dtype),
                    _code(self.wire),
                )
            row = self._collective(IGATHER, root, None, _flat(rows), rows.size // self.size)  # per rank
            self._wait(row, -1, False)
            if self.wire is not None:
                self._widen(_flat(rows), _flat(stack))
        else:
            out = self._narrowed(_flat(send))
            self.program.sent += out.nbytes
            row = self._collective(IGATHER, root, out, None, out.size)
            self._wait(row, root, False)
            if self.wire is not None:
                self.program.release(out)

    def bcast(self, buf: Sym, root: int) -> None:
        is_root = self.rank == root
        words = _flat(buf)
        if self.wire is not None:
            words = self.program.wire_slot(self, buf.size, self.wire)
            if is_root:
                self.program.add(
                    NARROW,
                    *_flat(buf).region()[:2],
                    *words.region()[:2],
                    buf.size,
                    _code(buf.dtype),
                    _code(self.wire),
                )
        if is_root:
            self.program.sent += words.nbytes * (self.size - 1)
        row = self._collective(IBCAST, root, None, words, words.size)
        self._wait(row, -1 if is_root else root, False)
        if self.wire is not None:
            self._widen(words, _flat(buf))

    def _collective(
        self,
        which: int,
        root: int,
        send: Sym | None,
        recv: Sym | None,
        count: int,
        op: int = -1,
        counts: int = -1,
    ) -> int:
        """One library collective row: ``send`` None is MPI_IN_PLACE (or nothing, at a non-root of
        a gather); counts in elements of the buffers' dtype."""
        dtype = (recv if recv is not None else send).dtype  # type: ignore[union-attr]
        code = kernels.DTYPE_CODES.get(dtype, -1)
        sbuf, soff = send.region()[:2] if send is not None else (-1, 0)
        rbuf, roff = recv.region()[:2] if recv is not None else (-1, 0)
        return self.program.add(
            COLLECTIVE, which, self.number, root, sbuf, soff, rbuf, roff, count, code, op, counts
        )

    def _typed(self, *arrays: Sym | None) -> None:
        for a in arrays:
            if a is not None and a.dtype.name not in LIBRARY_DTYPES:
                raise Unrecordable(f"a library collective on {a.dtype} (a user-defined op)")

    def allreduce(self, src: Sym, dst: Sym, op: Any) -> None:
        self._typed(src, dst)
        self.program.unknown = True
        self._collective(ALLREDUCE, 0, None if src is dst else _flat(src), _flat(dst), dst.size, _mpi_op(op))

    def reduce_scatter(self, src: Sym, dst: Sym, counts: list[int], op: Any) -> None:
        self._typed(src, dst)
        self.program.unknown = True
        at = len(self.program.counts)
        self.program.counts.extend(counts)
        self._collective(REDUCE_SCATTER, 0, _flat(src), _flat(dst), dst.size, _mpi_op(op), at)

    def allgather(self, src: Sym | None, dst: Sym) -> None:
        self.program.unknown = True
        count = dst.nbytes // self.size
        self._collective(
            ALLGATHER, 0, None if src is None else _flat(src).view(np.uint8), _flat(dst).view(np.uint8), count
        )

    def broadcast(self, buf: Sym, root: int) -> None:
        self.program.unknown = True
        self._collective(BCAST, root, None, _flat(buf).view(np.uint8), buf.nbytes)

    def alltoall(self, src: Sym, dst: Sym) -> None:
        """`Channel.alltoall`: MPI_Alltoall of equal blocks, as bytes (an uneven one, `alltoallv`,
        keeps the Python path: its counts change from call to call)."""
        self.program.unknown = True
        block = dst.nbytes // self.size
        self._collective(ALLTOALL, 0, _flat(src).view(np.uint8), _flat(dst).view(np.uint8), block)


class _ConvertingTape(Tape):
    """`Tape.converting`'s twin: the same rows and channel, sends converted by ``op``, and the
    flight step the base tape's (as `hpcring.exact.Converting` shares its channel's)."""

    def __init__(self, base: Tape, op: Any) -> None:
        super().__init__(base.real, base.program, base.number, base.wire, base.main)
        self.base, self.convert = base, op

    @property  # type: ignore[override]
    def step(self) -> int:
        return self.base.step

    @step.setter
    def step(self, value: int) -> None:
        self.base.step = value


class _Traffic:
    __slots__ = ("sent", "unknown")

    def __init__(self) -> None:
        self.sent, self.unknown = 0, False


def _flat(a: Sym) -> Sym:
    return a if a.ndim == 1 else a.reshape(-1)


def _code(dtype: np.dtype) -> int:
    code = kernels.DTYPE_CODES.get(np.dtype(dtype))
    if code is None:
        raise Unrecordable(f"dtype {dtype}")
    return code


def _mpi_op(op: Any) -> int:
    from mpi4py import MPI

    for code, name in enumerate(MPI_OPS):
        if op == getattr(MPI, name):
            return code
    raise Unrecordable("a user-defined MPI op")


# ---- recording a call ----------------------------------------------------------------------


def record(
    spec: Spec,
    form: str,
    channel: Any,
    src: Any,
    dst: Any,
    op: Any = None,
    root: int = 0,
    wire: np.dtype | None = None,
    layout: Any = None,
) -> Program:
    """The steps ``spec.run`` takes on ``channel`` for arrays shaped as ``src`` and ``dst`` (flat,
    host memory; ``dst`` may be ``src``, or a part or row of it, as the engine hands them), as a
    `Program`; Unrecordable where the algorithm does what a table cannot hold.

    ``form`` is how the collective's run function is called ("reducing", "gathering", "rooted":
    `hpcring.engine.FORMS`; "exchanging": an all-to-all's, with its ``layout``); ``wire``: the
    call's channel narrows to it."""
    builder = _Builder(None if wire is None else wire.itemsize)
    tape = Tape(channel, builder, 0, wire, main=True)
    tape.channels.append(channel)
    s = Sym(tape, SRC, 0, (src.size,), src.dtype)
    if dst is src or (dst.nbytes == src.nbytes and _address(dst) == _address(src)):
        d = s
    elif _inside(dst, src):  # a reduce-scatter in place: the output is this rank's part
        offset = _address(dst) - _address(src)
        d = Sym(tape, SRC, offset, (dst.size,), dst.dtype)
    elif _inside(src, dst):  # an all-gather in place: the input is this rank's row
        d = Sym(tape, DST, 0, (dst.size,), dst.dtype)
        s = Sym(tape, DST, _address(src) - _address(dst), (src.size,), src.dtype)
    else:
        d = Sym(tape, DST, 0, (dst.size,), dst.dtype)
    try:
        if form == "reducing":
            spec.run(tape, s, d, op)
        elif form == "gathering":
            spec.run(tape, s, d)
        elif form == "exchanging":
            spec.run(tape, s, d, layout)
        else:
            spec.run(tape, d, root)
    except Unrecordable:
        raise
    except (AttributeError, TypeError, ValueError, IndexError, NotImplementedError) as error:
        raise Unrecordable(f"{type(error).__name__}: {error}") from None
    if builder.pending:
        raise Unrecordable("requests left unwaited")
    return builder.program(tape.channels)


def record_exact(spec: Spec, channel: Any, src: Any, dst: Any, op: str) -> Program:
    """The steps of a reproducible all-reduce (``op`` "sum" or "mean") of ``src`` into ``dst`` (may
    be ``src``) inside ``spec``'s two phases (`hpcring.exact.fused`), as a `Program`; Unrecordable
    where the algorithm does what a table cannot hold."""
    from . import exact

    builder = _Builder(None)
    tape = Tape(channel, builder, 0, None, main=True)
    tape.channels.append(channel)
    s = Sym(tape, SRC, 0, (src.size,), src.dtype)
    same = dst is src or (dst.nbytes == src.nbytes and _address(dst) == _address(src))
    d = s if same else Sym(tape, DST, 0, (dst.size,), dst.dtype)
    try:
        exact.fused(tape, spec.split(tape, dst.size), [s], d, op)  # type: ignore[misc]
    except Unrecordable:
        raise
    except (AttributeError, TypeError, ValueError, IndexError, NotImplementedError) as error:
        raise Unrecordable(f"{type(error).__name__}: {error}") from None
    if builder.pending:
        raise Unrecordable("requests left unwaited")
    return builder.program(tape.channels)


def _address(array: Any) -> int:
    return int(array.__array_interface__["data"][0])


def _inside(part: Any, whole: Any) -> bool:
    """Whether ``part`` lies inside ``whole``'s bytes (a reduce-scatter's own part, an all-gather's row)."""
    a, b = _address(part), _address(whole)
    return b <= a and a + part.nbytes <= b + whole.nbytes and part.nbytes > 0


# ---- the table's meaning, in Python ------------------------------------------------------------


def execute(program: Program, src: np.ndarray, dst: np.ndarray, timeout: float | None = None) -> None:
    """Run ``program`` on NumPy arrays through its channels, row by row: what the compiled core
    does without the interpreter (the rows' specification; the tests compare the two)."""
    from mpi4py import MPI

    from . import wire as wires
    from .ops import OPS as REDUCTIONS

    ufuncs = {code: name for name, code in OPS.items()}
    memory: list[np.ndarray] = []
    for number, buffer in enumerate(program.buffers):
        if buffer.kind == "src":
            memory.append(src.reshape(-1).view(np.uint8))
        elif buffer.kind == "dst":
            memory.append(dst.reshape(-1).view(np.uint8))
        else:
            channel = program.channels[buffer.comm]
            memory.append(channel.scratch(buffer.name, buffer.nbytes, np.dtype(np.uint8)))
        assert len(memory) == number + 1

    def at(buf: int, off: int, nbytes: int) -> np.ndarray:
        return memory[buf][off : off + nbytes]

    def typed(buf: int, off: int, count: int, code: int) -> np.ndarray:
        dtype = kernels.DTYPES[code]
        return at(buf, off, count * dtype.itemsize).view(dtype)

    for channel in program.channels:
        channel.timeout = timeout or None
    requests: dict[int, Any] = {}
    ops = {name: op for op in REDUCTIONS.values() for name in [op.ufunc]}
    mpi_ops = [getattr(MPI, name) for name in MPI_OPS]
    for index, row in enumerate(program.rows.tolist()):
        kind, a = row[0], row[1:]
        if kind == SEND:
            requests[index] = program.channels[a[0]].comm.Isend(at(*a[3:6]), a[1], a[2])
        elif kind == RECV:
            requests[index] = program.channels[a[0]].comm.Irecv(at(*a[3:6]), a[1], a[2])
        elif kind == WAIT:
            channel = program.channels[a[4]]
            if a[3]:
                channel.wait(requests.pop(a[0]), a[3] * 1e-9)
            else:
                channel.finish(requests.pop(a[0]), a[1], bool(a[2]))
        elif kind == COMBINE:
            left, right, out = (typed(a[i], a[i + 1], a[8], a[1]) for i in (2, 4, 6))
            ops[ufuncs[a[0]]].combine(np, left, right, out)
        elif kind == COPY:
            at(a[0], a[1], a[4])[...] = at(a[2], a[3], a[4])
        elif kind == NARROW:
            wires.narrow(typed(a[0], a[1], a[4], a[5]), typed(a[2], a[3], a[4], a[6]))
        elif kind == WIDEN:
            wires.widen(typed(a[0], a[1], a[4], a[5]), typed(a[2], a[3], a[4], a[6]))
        elif kind == ROUND:
            piece = typed(a[0], a[1], a[2], a[3])
            wires.round_trip(piece, np.empty(a[2], kernels.DTYPES[a[4]]))
            if a[5] >= 0:
                wires.narrow(piece, typed(a[5], a[6], a[2], a[4]), on_grid=True)
        elif kind == STEP:
            program.channels[0].step = a[0]
        elif kind == COLLECTIVE:
            requests[index] = _collective(program, a, typed, mpi_ops)
        elif kind in (CODES, ENCODE, DECODE, GATHER):
            _exact(kind, a, at, typed)
        elif kind == WIDEN_ADD:
            wire, dtype = a[7] & 0xFF, a[7] >> 8
            wide = typed(a[4], a[5], a[6], dtype)
            widened = wires.widen(typed(a[0], a[1], a[6], wire), np.empty_like(wide))
            left, right = (widened, typed(a[2], a[3], a[6], dtype))[:: 1 if a[8] & 1 else -1]
            total = wide if not a[8] & WIDE_ONLY else np.empty_like(wide)
            ops["add"].combine(np, left, right, total)
            if a[8] & WIDE_ROUND:
                wires.round_trip(wide, np.empty(a[6], kernels.DTYPES[wire]))
                if a[9] >= 0:
                    wires.narrow(wide, typed(a[9], a[10], a[6], wire), on_grid=True)
            elif a[8] & WIDE_NARROW:
                wires.narrow(total, typed(a[9], a[10], a[6], wire))
        else:
            raise ValueError(f"row {index}: unknown kind {kind}")
    program.channels[0].traffic.sent += program.sent
    program.channels[0].traffic.unknown |= program.unknown


def _exact(kind: int, a: list[int], at: Any, typed: Any) -> None:
    """One CODES, ENCODE or DECODE row through `hpcring.exact`'s NumPy code."""
    from . import exact

    made: dict[tuple[str, int | None], np.ndarray] = {}

    def block(name: str, dtype: np.dtype, rows: int | None = None) -> np.ndarray:
        if (name, rows) not in made:
            made[name, rows] = np.empty((rows or 1) * exact.BLOCK, dtype)
        return made[name, rows] if rows is None else made[name, rows].reshape(rows, -1)

    if kind == GATHER:
        n, dtype, stride, others = a[8], a[9], a[4], a[5]
        fmt = exact.format_of(kernels.DTYPES[dtype])
        own, out = typed(a[0], a[1], n, dtype), typed(a[6], a[7], n, dtype)
        rows = typed(a[2], a[3], (others - 1) * stride + n, dtype)
        exact.gathered_sum(fmt, own, rows, stride, others, out, a[10], np, block, floats=False)
        return
    if kind == CODES:
        n, fmt = a[6], exact.format_of(kernels.DTYPES[a[7]])
        x = typed(a[0], a[1], n, a[7])
        into = None if a[2] < 0 else at(a[2], a[3], n * fmt.code.itemsize).view(fmt.code)
        exact.codes(fmt, x, np, at(a[4], a[5], n * fmt.code.itemsize).view(fmt.code), block, into)
        return
    if kind == ENCODE:
        n, fmt, floats = a[8], exact.format_of(kernels.DTYPES[a[9]]), bool(a[10])
        x, code = typed(a[0], a[1], n, a[9]), at(a[2], a[3], n * fmt.code.itemsize).view(fmt.code)

        def words(buf: int, off: int) -> np.ndarray:
            return at(buf, off, n * 8 * fmt.words).view(np.int64).reshape(n, fmt.words)

        into = None if a[4] < 0 else words(a[4], a[5])
        exact.encode(fmt, x, code, words(a[6], a[7]), np, block, into, floats)
        return
    n, (dtype, floats, terms), divisor = a[8], unpacked(a[9]), a[10]
    fmt = exact.format_of(kernels.DTYPES[dtype])
    summed = (
        at(a[0], a[1], n * 8 * fmt.words).view(np.int64).reshape(n, fmt.words).copy()
    )  # decode overwrites
    mine = None if a[2] < 0 else typed(a[2], a[3], n, dtype)
    code = at(a[4], a[5], n * fmt.code.itemsize).view(fmt.code)
    exact.decode(fmt, summed, code, typed(a[6], a[7], n, dtype), divisor, np, block, terms, floats, mine)


def _collective(program: Program, a: list[int], typed: Any, mpi_ops: list[Any]) -> Any:
    """One COLLECTIVE row through mpi4py (blocking ones return None). The reductions travel as
    their dtype; the others as bytes, as the compiled core sends them (MPI_BYTE)."""
    from mpi4py import MPI

    which, comm, root, sbuf, soff, rbuf, roff, count, code, op, counts = a[:11]
    comm = program.channels[comm].comm
    size = comm.Get_size()
    if which in (ALLREDUCE, REDUCE_SCATTER):
        parts = program.counts[counts : counts + size].tolist() if which == REDUCE_SCATTER else []
        send = MPI.IN_PLACE if sbuf < 0 else typed(sbuf, soff, sum(parts) if parts else count, code)
        recv = typed(rbuf, roff, count, code)
        if which == ALLREDUCE:
            comm.Allreduce(send, recv, mpi_ops[op])
        else:
            comm.Reduce_scatter(send, recv, parts, mpi_ops[op])
        return None
    whole = count * size if which in (ALLGATHER, IGATHER, ALLTOALL) else count  # per rank, or all
    if which == ALLTOALL:
        comm.Alltoall(
            typed(sbuf, soff, whole, code).view(np.uint8), typed(rbuf, roff, whole, code).view(np.uint8)
        )
        return None
    send = MPI.IN_PLACE if sbuf < 0 else typed(sbuf, soff, count, code).view(np.uint8)
    recv = None if rbuf < 0 else typed(rbuf, roff, whole, code).view(np.uint8)
    if which == ALLGATHER:
        comm.Allgather(send, recv)
    elif which == BCAST:
        comm.Bcast(recv, root)
    elif which == IGATHER:
        return comm.Igather(send, recv, root)
    elif which == IBCAST:
        return comm.Ibcast(recv, root)
    return None


__all__ = ["Program", "Sym", "Tape", "Unrecordable", "execute", "record", "record_exact"]
