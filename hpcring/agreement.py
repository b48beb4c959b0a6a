"""Agreement before data moves: every rank arrives, with the same call, or all raise.

The fast path is one collective of a fixed shape on every rank: each rank contributes its row
(the call's number, then the `Row`: collective, count, dtype, op, algorithm, array kind,
placement, root, the digest of the settings that must agree, wire; then what it carries, below),
a verdict, the row negated and the verdict again, and a non-blocking all-reduce
whose op takes the maximum gives every rank max(row) and -min(row) at once; the ranks agree
exactly where they are equal, and any local verdict (a bad argument) shows as a 1 in its column.
Only when something is off are the rows gathered, on a slow path every rank takes together, to
name the ranks and the values that differ.

A small `mpi` all-reduce rides along (`Payload`): the collective has a slot of `SLOT` bytes
after the header, four columns of the header say what a rank put there, and the op
(hpcring/_c/agree.h, and `combine_payload` here) reduces the payloads wherever the rows and the
payloads it combines are one and the same, so the data has moved by the time the ranks know
they agree: a checked call is one collective, not two, which matters most where every
collective costs a scheduling round (more ranks than cores, a shared node). Where a rank
carries nothing (a buffer hpcring cannot read), every rank sees it and the data moves after,
as it would have. The shape never depends on the call (a mismatch cannot derail it: every rank
always sends the header and the slot), and the user's output is written only once the
agreement has passed. The payload's reductions are bitwise commutative, so every rank gets the
same bits whatever tree MPI takes.

Up to `EXCHANGE_RANKS` ranks (HPCRING_EXCHANGE_RANKS lowers it, for tuning and so that tests
reach the collective form on few ranks) need no collective (`Agreement._exchange`): recursive
doubling (`steps`), each step a message each way of what a rank holds so far, the header (its
maxima and two flags, `_unpack`) with the first `PAIR_INLINE` bytes of payload in the same
message and the rest of a larger one (up to `PAIR_SLOT`) apart, straight from where it lies;
each side applies the same op to the two contributions. The header's maxima are exact and the
payload's op bitwise commutative, so both sides of a step hold the same bits after it, and
every rank ends with the same verdict and the same result. That is what a checked call of up to
64 KiB then costs: one message each way on two ranks, two steps on
four (under Open MPI 5 the non-blocking all-reduce of the header and a slot cost 1.8 us in C at
2 ranks, where the blocking MPI_Allreduce of 8 bytes cost 0.3 us). Past `EXCHANGE_RANKS`, where
log2 G steps of the whole payload would cost more than MPI's all-reduce and this machine cannot
measure, the collective above stays. Whether the ranks exchange depends on the communicator's
size alone, so every rank takes the same road whatever its call.

A rank that does not arrive leaves the collective (or a step's receive) pending: each waiting
rank waits for it until its deadline, one for the whole agreement (`hpcring.polling.Waiter`: a
test loop, as MPI's own wait is), then tells every other rank that it stopped waiting (one tiny
message each), listens a moment for the others', and names the ranks it did not hear from in a
`StallError`. A
rank still waiting that hears such a message takes the same road at once, so every rank
that did arrive raises within the timeout plus that moment. After a StallError the
communicator holds unmatched messages: end the job.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import cache, partial
from typing import Any

import numpy as np
from mpi4py import MPI

from . import algorithms, config, core, kernels
from .arrays import NAMES
from .flight import Recorder, Where
from .ops import NAMES as DTYPE_NAMES
from .ops import OPS, WIRE_NAMES
from .ops import code as dtype_code
from .polling import Waiter
from .records import Record

REPRODUCIBLE = " (reproducible=True)"  # the op as the row sees it where reproducible=True
_OPS = [*OPS, *(op + REPRODUCIBLE for op in OPS)]  # ranks that differ on reproducible= differ on op
_WIRES = [None, *WIRE_NAMES]  # wire=None is 0
HINTS = {
    "call": " (a rank skipped or repeated a call on this communicator)",
    "settings": (
        " (the HPCRING_* variables that must be the same on every rank differ; "
        "docs/configuration.md marks them)"
    ),
}


class Row(Record):
    """What must agree across ranks before a collective's data moves, as this rank sees it.

    The array kind is part of it: NumPy on some ranks and CuPy on others would stage and sum
    fine, but almost always means a rank that skipped moving its data to the GPU. So is the
    placement, as MPI asks of MPI_IN_PLACE: `auto` keeps a choice per size and placement, and
    ranks that chose differently would run different algorithms. ``settings`` is the digest of
    the communicator's must-agree HPCRING_* values (`hpcring.config.Config.digest`): ranks with
    other chunk sizes or node shapes would run other schedules, and hang. ``wire`` too: ranks that
    narrow what they send and ranks that do not would read each other's bytes as another dtype.
    A value this rank does not know (it refused its input) is None: its verdict, not this row,
    is then what the others hear.
    """

    collective: str
    count: int | None
    dtype: np.dtype | None
    op: str | None  # None: a collective that reduces nothing
    algorithm: str
    array: str | None  # the array kind's name (`hpcring.arrays.NAMES`)
    placement: bool | None  # in place
    root: int
    settings: int
    wire: str | None

    def words(self) -> list[int]:
        """The row as integers, in field order (-1 where a value is unknown), for the collective."""
        names = algorithms.names(self.collective)
        return [
            algorithms.COLLECTIVES.index(self.collective),
            -1 if self.count is None else self.count,
            -1 if self.dtype is None else dtype_code(self.dtype),
            _OPS.index(self.op) if self.op in _OPS else -1,
            names.index(self.algorithm) if self.algorithm in names else -1,
            NAMES.index(self.array) if self.array in NAMES else -1,
            -1 if self.placement is None else int(self.placement),
            self.root,
            self.settings,
            _WIRES.index(self.wire) if self.wire in _WIRES else -1,
        ]

    def describe(self, field: str, value: int) -> str:
        """A value of ``field`` as any rank's row encodes it, as a person would name it."""
        names: dict[str, list[Any]] = {
            "collective": list(algorithms.COLLECTIVES),
            "dtype": list(DTYPE_NAMES),
            "op": _OPS,
            "algorithm": list(algorithms.names(self.collective)),
            "array": NAMES,
            "placement": ["out of place (out=)", "in place"],
            "wire": [f"wire={w!r}" for w in _WIRES],
        }
        if field in names:
            return str(names[field][value]) if 0 <= value < len(names[field]) else "?"
        if field == "settings":
            return f"digest {value:08x}"
        return str(value)


FIELDS = ("call", *Row._fields)  # the call's number comes first

SLOT = 512  # bytes of payload the agreement's collective carries: an `mpi` all-reduce up to this rides along
# Up to EXCHANGE_RANKS ranks exchange their contributions instead (`Agreement._exchange`): a message
# each way per step of recursive doubling, of the header and only the bytes a rank carries, so the
# slot may be larger without costing a small call anything; up to this many bytes ride there.
# HPCRING_EXCHANGE_RANKS may lower the limit (`exchanges`), never raise it.
EXCHANGE_RANKS = 4
PAIR_SLOT = 64 << 10
# The first bytes of payload, sent inside the header's message (the rest of a larger one apart,
# from where it lies). The header (16 * WIDTH = 256 bytes) and these stay under Open MPI's
# shared-memory eager limit (btl_sm_eager_limit, 4096 bytes with its own headers): a message
# past it waits for a rendezvous, a round trip. With the whole payload apart past 1 KiB, as
# before, a checked 4 KiB call on 2 ranks cost 1.46-2.06x the bare MPI_Allreduce (calls back to
# back, input written before each); with 3.5 KiB in the header's message and 512 bytes apart,
# 1.06-1.07x (2 and 3 KiB: 1.15-1.24x, now 1.00-1.02x).
PAIR_INLINE = 3584
# On two ranks fewer bytes ride: the other rank's single-copy read of a buffer just written (as
# a code's data is before each call) costs more there than the second exchange saves. Measured
# with the input written before each call (medians of 3 x 400 calls, 2 ranks): out of place,
# 64 KiB took 20.2-21.0 us riding against 18.0-18.5 apart (bare 17.1-17.7), 32 KiB 11.8-12.5
# against 12.0; in place, 64 KiB 24.0 against 14.9 (bare 14.5), 32 KiB 13.8 against 10.6,
# 16 KiB 8.8 against 8.4-9.0. On three or four ranks riding wins up to PAIR_SLOT (4 ranks,
# 64 KiB: 52-53 us against 58-62 apart, bare 49-53). These figures predate the payload's
# one-pass sum (agree.h): since it, two ranks in place up to 64 KiB measured riding and apart
# within the noise of each other (64 KiB: 14.4-15.8 us against 15.1-19.0), so the limits stand.
TWO_RANKS = 32 << 10
TWO_RANKS_IN_PLACE = 16 << 10
TAG_AGREE = 32002  # the pair's header message (the stall notices are 32001; the algorithms use small tags)
TAG_AGREE_DATA = 32003  # the rest of the pair's payload, past PAIR_INLINE
# An all-to-all's blocks, sent ahead of its agreement (hpcring.exchange.send_ahead); a mismatch
# receives them into scratch (`Agreement.disagree`).
TAG_AHEAD = 32004
NO_PAYLOAD = (-1, -1, 0)  # the descriptor of a call whose data does not ride along
# The header, per half: the call (FIELDS), the payload's columns (present, dtype, op, count), the verdict.
WIDTH = len(FIELDS) + 4 + 1
# An exchange's message carries the header's maxima and a word of flags (`_uniform`), not the
# whole header: its minima follow from them (`_unpack`). A checked call of 8 B then sends 144
# bytes, which Open MPI's shared memory sends inline (btl_sm_max_inline_send: 256 bytes with its
# own header); with the whole header (264 bytes) it took the slower path, and on 4 ranks over 2
# cores a checked 8-byte call cost 1.5-1.9x the bare MPI_Allreduce, at 264 bytes 1.03-1.04x.
WIRE_HEAD = 8 * (WIDTH + 1)
# (kernels' dtype code, op code) pairs a payload may carry: those whose reduction commutes bitwise
# (agree.h's hr_payload_ok): float32, float64, int32, int64 under every op, complex under sum.
_REAL = ("float32", "float64", "int32", "int64")
_OP_CODES = {"add": 0, "maximum": 1, "minimum": 2, "multiply": 3}


def exchanges(size: int, limit: int | None = None) -> bool:
    """Whether ``size`` ranks agree by exchanging messages (`Agreement._exchange`) rather than in
    one MPI_Iallreduce: a function of the communicator's size and ``limit`` (HPCRING_EXCHANGE_RANKS,
    at most `EXCHANGE_RANKS`, as the communicator took it; None: the current snapshot's), which
    every rank checked alike at its first call (`hpcring.comm`), so every rank takes the same
    road whatever each one's call is."""
    if limit is None:
        limit = config.current().exchange_ranks
    return 2 <= size <= limit


def slot_bytes(size: int, limit: int | None = None, in_place: bool = False, planned: bool = False) -> int:
    """The bytes of payload a checked call on ``size`` ranks may carry (`PAIR_SLOT` where they
    exchange messages, `TWO_RANKS` or `TWO_RANKS_IN_PLACE` where two do, `SLOT` in the
    collective); ``planned``: a two-rank plan's exchange (`hpcring.persistent.Pair`), which no
    agreement precedes and which beats MPI's persistent all-reduce up to PAIR_SLOT (2 ranks,
    64 KiB written before each run: 14-16 us, MPI's persistent all-reduce 24.6, bare 19-20)."""
    if not exchanges(size, limit):
        return SLOT
    if size == 2 and not planned:
        return TWO_RANKS_IN_PLACE if in_place else TWO_RANKS
    return PAIR_SLOT


# The steps of an exchange (`steps`): send the contribution so far; receive the other's and
# combine; both at once; receive the result.
GIVE, TAKE, SWAP, RESULT = range(4)


@cache
def steps(rank: int, size: int) -> tuple[tuple[int, int], ...]:
    """Recursive doubling for ``rank`` of ``size``, as (kind, peer) steps: with p the largest power
    of two up to ``size``, each odd rank below 2 (size - p) first gives its contribution to the even
    rank below it and gets the result back last; the p ranks left swap with the one whose index
    among them differs in one bit, the lowest bit first (the tree Open MPI's recursive doubling
    takes)."""
    p = 1 << (size.bit_length() - 1)
    extra = size - p
    if rank < 2 * extra and rank % 2:
        return ((GIVE, rank - 1), (RESULT, rank - 1))
    index = rank // 2 if rank < 2 * extra else rank - extra
    swaps = []
    mask = 1
    while mask < p:
        other = index ^ mask
        swaps.append((SWAP, 2 * other if other < extra else other + extra))
        mask <<= 1
    if rank < 2 * extra:
        return ((TAKE, rank + 1), *swaps, (GIVE, rank + 1))
    return tuple(swaps)


def payload_descriptor(
    dtype: np.dtype,
    ufunc: str,
    count: int,
    size: int = 0,
    limit: int | None = None,
    in_place: bool = False,
    planned: bool = False,
    room: int | None = None,
) -> tuple[int, int, int]:
    """The descriptor of an `mpi` all-reduce of ``count`` elements on ``size`` ranks (exchanging up
    to ``limit``: `exchanges`), in place or not, planned or not (`slot_bytes`), whose data may
    ride along, or NO_PAYLOAD: what every rank computes alike from what they agree on. ``room``:
    the bytes that may ride, instead of the agreement's slot (a plan's shared memory)."""
    name = dtype.name
    nbytes = count * dtype.itemsize
    if room is None:
        room = slot_bytes(size, limit, in_place, planned)
    if count <= 0 or nbytes > room or ufunc not in _OP_CODES:
        return NO_PAYLOAD
    if name in _REAL or (name in ("complex64", "complex128") and ufunc == "add"):
        return kernels.DTYPE_CODES[dtype], _OP_CODES[ufunc], count
    return NO_PAYLOAD


def combine_payload(code: int, op: int, a: np.ndarray, b: np.ndarray) -> None:
    """b <- a (op) b, as the agreement's op reduces payloads (hpcring/_c/agree.h: this is the
    reference it is tested against). Bitwise commutative: where both are NaN, the larger bits
    (quieted by sums and products); maximum and minimum let NaN win and order -0 below +0."""
    dtype = kernels.DTYPES[code]
    ufunc = list(_OP_CODES)[op]
    if dtype is None or dtype.kind in "iu":
        with np.errstate(over="ignore"):
            getattr(np, ufunc)(a, b, out=b)  # integers wrap, and commute
        return
    if dtype.kind == "c":  # componentwise: complex payloads are sums
        part = np.float32 if dtype.itemsize == 8 else np.float64
        a, b = a.view(part), b.view(part)
    bits = np.dtype(f"u{a.dtype.itemsize}")
    quiet = 1 << (22 if a.dtype.itemsize == 4 else 51)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    with np.errstate(all="ignore"):
        if ufunc in ("add", "multiply"):
            made = getattr(np, ufunc)(a, b)
        else:
            wins = np.signbit(a) if ufunc == "maximum" else ~np.signbit(a)  # ties: +0 for max, -0 for min
            made = np.where(a == b, np.where(wins, b, a), getattr(np, ufunc)(a, b))
            made = np.where(nan_b, b, made)
            made = np.where(nan_a, a, made)
    both = nan_a & nan_b
    if both.any():
        larger = np.maximum(a.view(bits), b.view(bits))
        if ufunc in ("add", "multiply"):
            larger |= bits.type(quiet)
        made[both] = larger[both].view(a.dtype)
    b[...] = made


# These read a header of a few dozen int64s as a list (``header.tolist()``, once per header): NumPy's
# per-call cost on arrays this small (about 2.7 us a comparison) was most of an exchange's time on
# the Python path.


def _one_value(h: list[int], first: int, last: int) -> bool:
    """Every column of [first, last) holds one value in the header ``h`` (max equals min)."""
    return h[first:last] == [-v for v in h[WIDTH + first : WIDTH + last]]


def _agreed(h: list[int]) -> bool:
    """The ranks in the header ``h`` agree: one call, one row, no verdict (agree.h's hr_agreed)."""
    return _one_value(h, 0, WIDTH - 5) and not h[WIDTH - 1] and not h[-1]


def _carried(h: list[int]) -> bool:
    """Every rank in the header ``h`` put the same payload in the slot (agree.h's hr_carried)."""
    return h[WIDTH - 5] == 1 and _one_value(h, WIDTH - 5, WIDTH - 1)


def _uniform(h: list[int]) -> int:
    """The flags an exchange's message carries after the header's maxima (`WIRE_HEAD`): 1 where
    its ranks' rows are one (and number), 2 where their payload columns are."""
    return int(_one_value(h, 0, WIDTH - 5)) | 2 * int(_one_value(h, WIDTH - 5, WIDTH - 1))


def _unpack(h: np.ndarray) -> None:
    """The whole header of a contribution from its message (agree.h's hr_unpack), received so
    that the maxima fill words WIDTH - 1 to 2 WIDTH - 2 and the flags (`_uniform`) the last: the
    maxima moved to the front, and the minima made from them. Where a column group held one value,
    its minima are its maxima, exactly; where it did not, one minimum is made one less than its
    maximum, which keeps it apart as the true minimum would (later maxima only grow, minima only
    shrink). So every rank reaches the verdict, and rides the payload, as with the whole header."""
    flags = int(h[-1])
    h[:WIDTH] = h[WIDTH - 1 : 2 * WIDTH - 1].copy()
    h[WIDTH : 2 * WIDTH - 1] = -h[: WIDTH - 1]
    h[-1] = h[WIDTH - 1]
    if not flags & 1:
        h[WIDTH] += 1  # the call number's minimum
    if not flags & 2:
        h[WIDTH + WIDTH - 5] += 1  # the payload's present column's minimum


def _riding(header: np.ndarray) -> int:
    """The payload bytes that travel with a contribution of this ``header`` in an exchange (agree.h's
    hr_riding): those of one payload all its ranks agree on and carry, else 0."""
    h = header.tolist()
    if not (_agreed(h) and _carried(h)):
        return 0
    code, count = h[WIDTH - 4], h[WIDTH - 2]
    dtype = kernels.DTYPES[code] if 0 <= code < len(kernels.DTYPES) else None
    n = 0 if dtype is None else count * dtype.itemsize
    return n if 0 < n <= PAIR_SLOT else 0


def combine(ins: np.ndarray, outs: np.ndarray, slot: int) -> None:
    """outs <- ins (op) outs for one contribution (bytes: the header, then a slot of ``slot``
    bytes): the header's maxima, and the payloads where both sides carry the same one (agree.h's
    hr_agree_combine)."""
    a, b = ins[: 16 * WIDTH].view(np.int64), outs[: 16 * WIDTH].view(np.int64)
    ha, hb = a.tolist(), b.tolist()
    carry = _agreed(ha) and _agreed(hb) and _carried(ha) and _carried(hb) and ha[:WIDTH] == hb[:WIDTH]
    np.maximum(a, b, out=b)
    code, op, count = (int(v) for v in b[WIDTH - 4 : WIDTH - 1])
    dtype = kernels.DTYPES[code] if carry and 0 <= code < len(kernels.DTYPES) else None
    if dtype is not None and 0 < count * dtype.itemsize <= slot:
        end = 16 * WIDTH + count * dtype.itemsize
        combine_payload(code, op, ins[16 * WIDTH : end].view(dtype), outs[16 * WIDTH : end].view(dtype))


def _reduce(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
    """The agreement's op on the pure-Python core (agree.h's agree_reduce, in NumPy)."""
    size = 16 * WIDTH + SLOT
    ins, outs = np.frombuffer(inbuf, np.uint8), np.frombuffer(inoutbuf, np.uint8)
    for start in range(0, ins.size, size):
        combine(ins[start : start + size], outs[start : start + size], SLOT)


class Both:
    """Two requests waited for as one (`Waiter.wait` tests it): a pair's receive and send."""

    __slots__ = ("requests",)

    def __init__(self, *requests: MPI.Request) -> None:
        self.requests = list(requests)

    def Test(self) -> bool:  # MPI.Request's name, which Waiter calls
        return MPI.Request.Testall(self.requests)


_MADE: dict[bool, tuple[MPI.Datatype, MPI.Op]] = {}


def collective(compiled: bool | None = None) -> tuple[MPI.Datatype, MPI.Op]:
    """The agreement's datatype (one element: the header and the slot) and op: the compiled
    core's (agree.h) where it runs (or ``compiled`` asks), else this module's (`_reduce`). Made
    once per process each; ranks that use different ones still agree (the same reductions)."""
    if compiled is None:
        compiled = core.active()
    made = _MADE.get(compiled)
    if made is None:
        if compiled:
            made = core.mpi_core()[0].agreement(WIDTH, SLOT, PAIR_SLOT, PAIR_INLINE)
        else:
            datatype = MPI.BYTE.Create_contiguous(16 * WIDTH + SLOT)
            datatype.Commit()
            made = datatype, MPI.Op.Create(_reduce, commute=True)
        _MADE[compiled] = made
    return made


class Payload(Record):
    """A call's data riding with its agreement: ``src`` goes in, ``dst`` gets the result (host
    arrays, flat; ``dst`` may be ``src``)."""

    descriptor: tuple[int, int, int]
    src: Any
    dst: Any


class Agreement:
    """One communicator's agreement: the row and its negation, and a payload, in one collective."""

    __slots__ = (
        "ahead",
        "buffer",
        "comm",
        "exchanging",
        "incoming",
        "op",
        "rank",
        "settings",
        "size",
        "type",
        "waiter",
        "work",
    )

    def __init__(
        self, comm: MPI.Intracomm, flight: Recorder | None = None, limit: int = EXCHANGE_RANKS
    ) -> None:
        """``limit``: HPCRING_EXCHANGE_RANKS as the communicator took it (`exchanges`)."""
        self.comm = comm
        self.settings: Any = None  # the communicator's config snapshot, named on a settings mismatch
        self.waiter = Waiter(comm)
        self.waiter.flight = flight  # the communicator's record: a StallError names where ranks were
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.exchanging = exchanges(self.size, limit)  # the compiled core's agreements read it too
        self.type, self.op = collective()
        self.buffer: np.ndarray | None = None  # the header and the slot, reused call after call
        self.incoming: np.ndarray | None = None  # exchanging ranks: the other's contribution
        self.work: np.ndarray | None = None  # exchanging ranks: the payload combined so far
        # the sends of what this call sent every other rank ahead of it (TAG_AHEAD), while it runs
        self.ahead: Sequence[Any] = ()

    def __call__(
        self,
        words: Sequence[int],
        row: Row,
        problem: Exception | None,
        *,
        timeout: float,
        what: str,
        caller: str,
        payload: Payload | None = None,
    ) -> bool:
        """Raise on every rank if any rank failed, disagrees on the row, or does not arrive in time.
        True where a ``payload`` rode along on every rank: its ``dst`` then holds the result.

        ``words`` is the call's number, then ``row.words()``; ``what`` names the call for a
        StallError (which adds the call number), ``caller`` the collective for the other
        messages ("hpcring.allgather").
        """
        verdict = int(problem is not None)
        carrying = payload is not None and problem is None
        full = [*words, *((1, *payload.descriptor) if carrying else (0, *NO_PAYLOAD)), verdict]
        if self.exchanging:
            return self._exchange(words, row, problem, full, carrying, payload, timeout, what, caller)
        buf = self.buffer
        if buf is None:
            buf = self.buffer = np.zeros(16 * WIDTH + SLOT, np.uint8)
        header = buf[: 16 * WIDTH].view(np.int64)
        # [row, verdict, -row, verdict] under max: [max(row), any verdict, -min(row), any verdict].
        header[:] = [*full, *[-v for v in full[:-1]], verdict]
        slot = buf[16 * WIDTH :]
        if carrying:
            slot[: payload.src.nbytes] = payload.src.view(np.uint8)
        request = self.comm.Iallreduce(MPI.IN_PLACE, [buf, 1, self.type], self.op)
        try:
            if not request.Test():
                self.wait(request, words[0], timeout, what)
        except BaseException:  # a stall, or an MPI error (a failed rank): the request may be pending
            self.buffer = None  # MPI may still write it: left to the request (the engine keeps it)
            raise
        agreed = header.tolist()
        if not _agreed(agreed):
            self.disagree(words, row, problem, caller)
        if not (carrying and _carried(agreed)):
            return False
        payload.dst.view(np.uint8)[...] = slot[: payload.src.nbytes]
        return True

    def _exchange(
        self,
        words: Sequence[int],
        row: Row,
        problem: Exception | None,
        full: list[int],
        carrying: bool,
        payload: Any,
        timeout: float,
        what: str,
        caller: str,
    ) -> bool:
        """The agreement of 2 to `EXCHANGE_RANKS` ranks (agree.h's exchange): recursive doubling
        over `steps`, each step a message each way of the contribution so far (the header's
        maxima and flags, `_unpack`, with the first `PAIR_INLINE` bytes of payload after them, the
        rest of a larger payload apart, straight from its buffer), each side applying the op
        itself. The header's maxima are exact and the payload's op is bitwise commutative, so both
        sides of a step hold the same bits after it, and every rank ends with the same verdict and
        the same result. One deadline for all the waits."""
        number = words[0]
        deadline = time.monotonic() + timeout if timeout > 0 else None
        head, lead = 16 * WIDTH, WIRE_HEAD
        buf = self.buffer
        if buf is None:  # the header, then the message: its maxima, flags and first payload bytes
            buf = self.buffer = np.zeros(head + lead + PAIR_INLINE, np.uint8)
        incoming = self.inbox()
        header, theirs = buf[:head].view(np.int64), incoming[:head].view(np.int64)
        wire, maxima = buf[head:], buf[head : head + lead].view(np.int64)
        header[:] = [*full, *[-v for v in full[:-1]], full[-1]]
        # the payload so far: this rank's input, then `work` (or, last, the output)
        mine = payload.src.view(np.uint8) if carrying else buf[:0]
        # the bytes of payload the contribution so far carries (_riding(header), kept as it changes)
        riding = payload.src.nbytes if carrying and not full[-1] else 0
        final: np.ndarray | None = None  # where the result is, once it is complete
        comm = self.comm
        try:
            for kind, peer in steps(self.rank, self.size):
                requests = []
                if kind in (GIVE, SWAP):  # send the contribution so far
                    n = riding
                    k = min(n, PAIR_INLINE)
                    maxima[:WIDTH] = header[:WIDTH]
                    maxima[WIDTH] = _uniform(header.tolist())
                    wire[lead : lead + k] = mine[:k]
                    requests.append(comm.Isend([wire[: lead + k], MPI.BYTE], peer, TAG_AGREE))
                    if n > k:
                        requests.append(comm.Isend([mine[k:n], MPI.BYTE], peer, TAG_AGREE_DATA))
                if kind in (TAKE, SWAP, RESULT):  # receive the other's
                    got = comm.Irecv([incoming[head - lead : head + PAIR_INLINE], MPI.BYTE], peer, TAG_AGREE)
                    self.wait(got, number, timeout, what, deadline)
                    _unpack(theirs)
                    n = _riding(theirs) if theirs[WIDTH - 5] == 1 else 0
                    if n > PAIR_INLINE:
                        apart = [incoming[head + PAIR_INLINE : head + n], MPI.BYTE]
                        requests.append(comm.Irecv(apart, peer, TAG_AGREE_DATA))
                if requests:
                    self.wait(Both(*requests), number, timeout, what, deadline)
                if kind == RESULT:  # the result, as the rank that held this one's share has it
                    header[:] = theirs
                    riding = n
                    final = incoming[head:]
                elif kind != GIVE:  # combine: the header's maxima, the payloads where they ride
                    # both ride one payload where both headers are the same (the maxima then are)
                    carry = riding > 0 and n > 0 and theirs[:WIDTH].tolist() == header[:WIDTH].tolist()
                    np.maximum(theirs, header, out=header)
                    riding = n if carry else 0
                    if carry:
                        work = self.workspace()
                        if mine is not work:
                            work[:n] = mine[:n]
                        code, op = int(header[WIDTH - 4]), int(header[WIDTH - 3])
                        dtype = kernels.DTYPES[code]
                        combine_payload(code, op, incoming[head : head + n].view(dtype), work[:n].view(dtype))
                        mine = work
                    final = mine
        except BaseException:
            self.buffer = self.incoming = self.work = None  # MPI may still use them: left to the requests
            raise
        if not _agreed(header.tolist()):
            self.disagree(words, row, problem, caller)
        if not (carrying and riding):
            return False
        nbytes = payload.src.nbytes
        assert final is not None
        payload.dst.view(np.uint8)[...] = final[:nbytes]
        return True

    def inbox(self) -> np.ndarray:
        """Exchanging ranks: the buffer the other's contribution comes into, made once (the
        compiled core's agreements on this communicator share it)."""
        incoming = self.incoming
        if incoming is None:
            incoming = self.incoming = np.zeros(16 * WIDTH + PAIR_SLOT, np.uint8)
        return incoming

    def workspace(self) -> np.ndarray:
        """Exchanging ranks: where the payload combined so far is kept between steps."""
        work = self.work
        if work is None:
            work = self.work = np.zeros(PAIR_SLOT, np.uint8)
        return work

    def wait(
        self,
        request: Any,
        number: int,
        timeout: float,
        what: str,
        deadline: float | None = None,
        where: Where = Where.AGREEMENT,
    ) -> None:
        """Wait for the agreement's requests of call ``number`` until ``deadline`` (None: within
        ``timeout`` from now; a ``timeout`` of 0: no limit), or raise StallError naming the ranks
        that did not arrive (the compiled core's agreement comes here too, once its own spinning
        is over; several requests as a tuple). ``where``: what the stall notices say this rank
        waited in (an unchecked all-to-all's blocks, `hpcring.exchange.receive`, wait in the data
        exchange)."""
        if isinstance(request, tuple):
            request = Both(*request)
        if request.Test():
            return
        if deadline is None:
            deadline = time.monotonic() + timeout if timeout > 0 else None
        woke = self.waiter.wait(request, deadline)
        if woke is not None:
            raise self.waiter.stall(
                woke, f"{what} call {number} on this communicator", timeout, number, where=where
            )

    def disagree(self, words: Sequence[int], row: Row, problem: Exception | None, caller: str) -> None:
        """The collective showed something off (``words``: this rank's call number and row): raise
        the same exception on every rank (every rank comes here: each saw the same maxima). Each
        says whether it sent its blocks ahead (`ahead`); what came so is received into scratch
        first, and this rank's sends done, so nothing is left unmatched."""
        ahead, self.ahead = self.ahead, ()
        mine = np.array([*words, int(bool(ahead)), int(problem is not None)], dtype=np.int64)
        self._raise_for(mine, row, problem, caller, ahead)

    def _raise_for(
        self, mine: np.ndarray, row: Row, problem: Exception | None, what: str, ahead: Sequence[Any] = ()
    ) -> None:
        """The same exception on every rank, from every rank's row (every rank is here: the
        collective completed, and showed every rank that something is off)."""
        table = np.empty((self.size, mine.size), dtype=np.int64)
        self.comm.Allgather(mine, table)
        self._drain(table[:, -2], ahead)
        failed = np.flatnonzero(table[:, -1])
        if failed.size:
            reports = self.comm.allgather(None if problem is None else (type(problem), str(problem)))
            if problem is not None:
                raise problem
            kind, message = reports[failed[0]]
            raise kind(f"rank {failed[0]} rejected its input: {message}")
        for column, field in enumerate(FIELDS):
            values = table[:, column].tolist()
            if len(set(values)) > 1:
                if field == "settings":
                    raise ValueError(self._settings_differ(what))
                detail = by_value(values, partial(row.describe, field))
                hint = HINTS.get(field, "")
                raise ValueError(f"{what}: ranks disagree on {field}: {detail}{hint}")
        raise AssertionError("the agreement saw a difference the table does not show")

    def _drain(self, sent: np.ndarray, ahead: Sequence[Any]) -> None:
        """What each rank that says so (``sent``, by rank) sent this one ahead of the agreement,
        received into scratch; then this rank's own sends (``ahead``) done. Every rank is past
        the agreement, so each message is on its way."""
        comm, requests = self.comm, list(ahead)
        for q in np.flatnonzero(sent).tolist():
            if q != self.rank:
                status = MPI.Status()
                message = comm.Mprobe(q, TAG_AHEAD, status)
                requests.append(message.Irecv([np.empty(status.Get_count(MPI.BYTE), np.uint8), MPI.BYTE]))
        MPI.Request.Waitall(requests)

    def _settings_differ(self, what: str) -> str:
        """The must-agree variables that differ, their values and the ranks (every rank gathers
        every rank's values: this runs only after the digests differed)."""
        mine = {} if self.settings is None else self.settings.agreed()
        everyone = self.comm.allgather(mine)
        parts = []
        for name in sorted({name for values in everyone for name in values}):
            seen = [values.get(name, "=?") for values in everyone]
            if len(set(seen)) == 1:
                continue
            shown = by_value(seen, _setting)
            parts.append(f"{name}: {shown}")
        return (
            f"{what}: ranks disagree on settings: {' | '.join(parts) or 'digests differ'}{HINTS['settings']}"
        )


def by_value(values: Sequence[Any], name: Any) -> str:
    """Each value of ``values`` (one per rank), ``name``d, with the ranks that hold it:
    "10 on ranks 0, 1, 2; 11 on rank 3"."""
    groups: dict[Any, list[int]] = {}
    for r, value in enumerate(values):
        groups.setdefault(value, []).append(r)
    return "; ".join(
        f"{name(value)} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        for value, ranks in groups.items()
    )


def _setting(text: str) -> str:
    """A must-agree value as `Config.agreed` gives it ("=VALUE", "=None", or "!TEXT" unparsable)."""
    if text == "=None":
        return "unset"
    return text[1:] if text[0] == "=" else "unparsable " + text[1:]
