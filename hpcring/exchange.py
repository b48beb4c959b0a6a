"""The all-to-all on the call engine: equal blocks (MPI_Alltoall) and uneven ones (MPI_Alltoallv).

`hpcring.alltoall` differs from the other collectives in one way: an uneven exchange
(``send_splits=``) has per-call sizes that differ from rank to rank, and that no rank knows
whole. So its signature (what the warm table keys, what the agreement compares) holds what
must be the same everywhere (the form, the dtype, the array kind, the algorithm, and the
elements of one row: equal blocks compare the whole count, uneven ones the row size), and the
splits travel with each call (`Exchange.plan`, kept per thread). Once the ranks agree, an
uneven call learns its receive counts and checks them against ``recv_splits=`` and ``out=``
where given, before any data moves: up to TABLE_RANKS ranks from a table of every rank's
splits, which rides with the agreement where its slot holds it (`Exchange.riding_table`: up to 5
ranks) and is else one all-gather (`Channel.table`), from which every rank finds the same
problems; above, by an
all-to-all of the counts (`Channel.counts`) and a verdict the ranks agree on
(`Channel.verdict`). A mismatch raises the same ValueError on every rank, naming the ranks,
with the user's arrays untouched. Everything else
(the exclusion, the timeout and StallError naming ranks, the flight record, the compiled
core's step tables) is the engine's `Call`, unchanged.

The check is the agreement's, as for every collective (on 2 to 4 ranks its recursive-doubling
exchange, so a rank in another collective meets the all-to-all's header and every rank raises
the same error). Where auto runs equal blocks of host NumPy arrays on 2 to 4 ranks, up to a
size (`EAGER_UPTO`), the blocks leave ahead of the agreement (`send_ahead`, on TAG_AHEAD) and
are received into the output once it passed (`receive`); on a mismatch every rank says in the
agreement's error path whether it sent ahead, and what came is received into scratch
(`hpcring.agreement.Agreement.disagree`), so nothing is left unmatched. With ``check=False``
the same signatures post every block at once the same way, with no agreement before them. The
compiled core's warm call (core.c's ``ahead``) runs the same protocol.

The splits count rows: the first axis of ``x`` (elements, for a 1-D array), as
``torch.distributed.all_to_all_single`` counts them, and the other axes travel whole.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from . import algorithms, config, core, kernels, tracing
from .agreement import NO_PAYLOAD, TAG_AHEAD, Agreement, Both, Payload, Row, exchanges, payload_descriptor
from .algorithms import ALLTOALL, Layout, Spec
from .algorithms.base import choice_key
from .arrays import NUMPY, Adapter, adapter_for, known_adapter
from .channel import Channel
from .comm import CommState, intracomm, known_state, state_of
from .engine import EXCHANGING, Call, Options, keep_warm, viewed
from .flight import Where, dump_on_error
from .ops import NAMES as DTYPE_NAMES
from .ops import supported
from .program import Unrecordable, record
from .tracing import local_copy
from .units import format_bytes

CALLER = "hpcring.alltoall"
_INT64 = np.dtype(np.int64)
_WORLD = MPI.COMM_WORLD
_SEEN = "seen"
UNEVEN = -2  # an uneven call's count in the agreement: UNEVEN - (elements of one row)
# Up to this many ranks an uneven call checks its splits by one all-gather of every rank's (2G+1
# integers each: G^2 in all); above, by an all-to-all of the counts and a verdict, two rounds of
# G integers.
TABLE_RANKS = 64
# auto's blocks leave ahead of the agreement (`send_ahead`) on 2 to 4 ranks (where the agreement
# exchanges messages), up to this many bytes of each rank's input, by rank count (None: every
# size); elsewhere auto's algorithm moves them after it. Measured (docs/collectives.md): on two
# ranks the blocks and the header's message are the whole call; on four, posting every block at
# once beats MPI_Alltoall after the agreement up to 256 KiB.
EAGER_UPTO: dict[int, int | None] = {2: None, 3: 256 << 10, 4: 256 << 10}
# What moves blocks that leave ahead: each rank's block straight to the rank it is for, the
# pattern (and the bytes, (G-1)/G of the input) of pairwise exchange. So auto's choice for a
# signature whose blocks leave ahead is this one, for every call of it (check=False's too, which
# post every block at once the same way, with no agreement before them): what the trace, the
# flight record and the bench name, and what the byte formulas count.
AHEAD = "pairwise"


class ExchangeRow(Row):
    """The agreement's row of an all-to-all: its count is the whole input for equal blocks, and
    says "uneven, rows of k elements" (UNEVEN - k) for send_splits=, so ranks that mix the two
    forms, or rows of other sizes, are named by what they passed."""

    __slots__ = ()  # a row, as its base: the fields only

    def describe(self, field: str, value: int) -> str:
        if field == "count" and value <= UNEVEN:
            return f"send_splits= (rows of {UNEVEN - value} elements)"
        if field == "count" and value >= 0:
            return f"{value} elements in equal blocks"
        return super().describe(field, value)


class _Now(threading.local):
    """One call's own arguments, per thread (the Call is shared by every call of its signature)."""

    sends: tuple[int, ...] | None = None  # rows to each rank (uneven)
    recvs: tuple[int, ...] | None = None  # rows from each rank, as given (uneven)
    check: bool = True
    shape: tuple[int, ...] | None = None  # the output's shape, once known
    out_rows: int = -1  # the rows of out= (-1: none), uneven
    table: np.ndarray | None = None  # every rank's splits, where they rode with the agreement
    x: Any = None  # the input, where its blocks leave ahead of the agreement (`plan` to `_agree`)
    pending: list[Any] | None = None  # those blocks' sends, once the ranks agree
    number: int = 0  # the agreed call's number

    def row(self, size: int) -> list[int]:
        """This rank's row of an uneven call's split table (`Exchange.checked`): the sends, the
        receives as given or -1, the rows of out= or -1."""
        assert self.sends is not None
        return [*self.sends, *(self.recvs if self.recvs is not None else [-1] * size), self.out_rows]


class Exchange(Call):
    """The `Call` of one all-to-all signature: the engine's, with the data movement of an
    all-to-all (`move`) and its splits carried per call (`plan`)."""

    __slots__ = ("early", "equal_layout", "now", "rest", "row_items", "rows", "table_rides", "uneven")

    def __init__(
        self,
        options: Options,
        state: CommState,
        channel: Channel,
        adapter: Adapter,
        spec: Spec,
        row: Row,
        uneven: bool,
        shape: tuple[int, ...],
    ) -> None:
        self.now = _Now()
        super().__init__(options, state, channel, adapter, spec, row, None, False, None)
        self.uneven = uneven
        self.rows = shape[0] if shape else 0  # x's first axis
        self.rest = tuple(shape[1:])  # the shape of one row
        self.row_items = int(np.prod(self.rest, dtype=np.int64))
        size = channel.size
        block = self.rows // size * self.row_items if size else 0
        self.equal_layout = Layout.blocks(block, size)
        self.ready = self.fits
        itemsize = 0 if row.dtype is None else row.dtype.itemsize
        # this signature's blocks leave ahead of the agreement (`eager`): decided once, so that a
        # call that does not (every torch tensor's) pays nothing for it
        self.early = itemsize > 0 and self.eager(self.rows * self.row_items * itemsize)
        # an uneven call's split table rides with the agreement under this descriptor (`riding_table`)
        width = 2 * size + 1
        self.table_rides = NO_PAYLOAD
        if uneven and 1 < size <= TABLE_RANKS:
            self.table_rides = payload_descriptor(_INT64, "add", size * width, size, state.exchange_ranks)

    # the output's shape is per call (uneven: known once the counts are exchanged), so per thread
    @property  # type: ignore[override]
    def out_shape(self) -> tuple[int, ...] | None:
        return self.now.shape

    @out_shape.setter
    def out_shape(self, value: tuple[int, ...] | None) -> None:
        self.now.shape = value

    def _agree(self, timeout: float, problem: Exception | None, payload: Any = None) -> bool:
        """The engine's agreement, with this call's blocks sent ahead of it where they leave early
        (`eager`): received into the output once it passed (`move`); where it did not, every rank
        receives what came into scratch before the error (`Agreement.disagree`)."""
        now = self.now
        x, now.x = now.x, None
        now.table = None
        if self.uneven and problem is None and payload is None:
            # every rank's splits ride with the agreement (`riding_table`), or go in `checked`
            payload = self.riding_table(now)
            carried = super()._agree(timeout, problem, payload)
            if carried and payload is not None:
                now.table = payload.dst.reshape(self.channel.size, -1)
            return False
        if problem is not None or x is None:  # x: set by `plan` where the blocks leave early
            return super()._agree(timeout, problem, payload)
        agreement, src = self.state.agreement, self.adapter.flat(x)
        ahead = send_ahead(agreement, self.channel, src)
        agreement.ahead = ahead
        try:
            super()._agree(timeout, problem, payload)
        finally:
            agreement.ahead = ()
        now.pending, now.number = ahead, self.state.calls
        return False

    def riding_table(self, now: _Now) -> Payload | None:
        """The payload that carries this rank's row of `checked`'s table with the agreement: the
        table's int64 words, zero but for this rank's row, summed (every rank's row lands in its
        place, exactly), where the agreement's slot holds them (`payload_descriptor`: a function
        of the rank count every rank computes alike); else None."""
        descriptor, sends = self.table_rides, now.sends
        if descriptor == NO_PAYLOAD or sends is None:
            return None
        size = self.channel.size
        table = np.zeros((size, 2 * size + 1), np.int64)
        table[self.channel.rank] = now.row(size)
        return Payload(descriptor, table.reshape(-1), np.empty(table.size, np.int64))

    def eager(self, nbytes: int) -> bool:
        """Whether this call's blocks leave ahead of the agreement: auto's equal blocks of host NumPy
        arrays, at ranks and sizes where that was measured to pay (`EAGER_UPTO`). A function of
        what the header carries, so every rank that agrees decides alike."""
        return leaves_ahead(self.state, self.adapter, self.options.algorithm, self.uneven, nbytes)

    # -- per call ---------------------------------------------------------------------------------

    def fits(self, x: Any, out: Any) -> bool:
        """A warm call's question: ``x`` (and ``out``) are what the full path would take."""
        adapter = self.adapter
        if not self.uneven:
            return bool(adapter.ready(x, out))
        if not adapter.ready(x, None):
            return False
        if out is None:
            return True
        try:
            return problem_with_out(adapter, x, out, self.rest, None) is None
        except (TypeError, ValueError):
            return False

    def plan(
        self,
        x: Any,
        out: Any,
        sends: Sequence[int] | None,
        recvs: Sequence[int] | None,
        check: bool,
    ) -> Exception | None:
        """This call's splits, checked here (no communication), kept for `move`; the problem with
        them, if any (the agreement makes it every rank's)."""
        now = self.now
        now.check, now.shape, now.pending, now.out_rows, now.table = check, None, None, -1, None
        now.x = x if self.early and check else None  # the blocks that leave ahead (`_agree`)
        size = self.channel.size
        try:
            if not self.uneven:
                now.sends = now.recvs = None
                now.shape = None if out is not None else tuple(self.adapter.shape(x))
                return None
            if sends is None:  # recv_splits= alone: x's first axis cut into G equal blocks
                if self.rows % size:
                    raise ValueError(
                        f"x's first axis ({self.rows}) does not split into {size} equal blocks; "
                        "pass send_splits="
                    )
                sends = [self.rows // size] * size
            now.sends = splits(sends, size, "send_splits")
            if sum(now.sends) != self.rows:
                raise ValueError(
                    f"send_splits sum to {sum(now.sends)}, but x has {self.rows} rows (its first axis)"
                )
            now.recvs = None if recvs is None else splits(recvs, size, "recv_splits")
            now.out_rows = out_rows(self.adapter, out)
            if now.recvs is not None and out is not None:
                rows = self.adapter.shape(out)[0]
                if rows != sum(now.recvs):
                    raise ValueError(f"out has {rows} rows, but recv_splits sum to {sum(now.recvs)}")
        except (TypeError, ValueError) as error:
            return type(error)(f"{CALLER}: {error}")
        return None

    # -- the data --------------------------------------------------------------------------------

    def layout(self, out: Any) -> Layout:
        """This call's layout; uneven: the receive counts exchanged and checked first, the same
        verdict on every rank (module docstring)."""
        if not self.uneven:
            return self.equal_layout
        now, channel, items = self.now, self.channel, self.row_items
        sends, recvs = now.sends, now.recvs
        assert sends is not None
        if channel.size == 1:
            problem = _problem(channel.rank, sends, recvs, out_rows(self.adapter, out))
            if problem is not None:
                raise ValueError(f"{CALLER}: {problem}")
            recvs = sends
        elif now.check and channel.size <= TABLE_RANKS:
            recvs = self.checked()
        elif recvs is None or now.check:
            got = tuple(channel.counts(list(sends)))
            problem = _problem(channel.rank, got, recvs, out_rows(self.adapter, out))
            if now.check:
                if channel.verdict(problem is not None):
                    reports = channel.comm.allgather(problem)  # every rank is here: the verdict came
                    raise ValueError(f"{CALLER}: " + "; ".join(r for r in reports if r))
            elif problem is not None:
                raise ValueError(f"{CALLER}: {problem}")
            recvs = got
        now.shape = (sum(recvs), *self.rest)
        return Layout.of(tuple(s * items for s in sends), tuple(r * items for r in recvs))

    def checked(self) -> tuple[int, ...]:
        """The receive counts, from a table of every rank's splits (`_Now.row`), carried by the
        agreement or gathered here: every rank sees every rank's and finds the same problems, so
        all raise the same error, or none, without a second exchange."""
        channel, size = self.channel, self.channel.size
        table = self.now.table
        if table is None:  # not carried by the agreement (`riding_table`): its own all-gather
            table = channel.table(self.now.row(size))
        splits = table.tolist()  # read as lists: NumPy's per-element reads cost more than the checks
        got = tuple(row[channel.rank] for row in splits)
        if max(max(row[size:]) for row in splits) < 0:  # no rank gave recv_splits= or out=
            return got
        problems = []
        for q, row in enumerate(splits):
            told = None if row[size] < 0 else tuple(row[size : 2 * size])
            arrives = tuple(other[q] for other in splits)
            rows = row[2 * size]
            problem = _problem(q, arrives, told, None if rows < 0 else rows)
            if problem is not None:
                problems.append(problem)
        if problems:
            raise ValueError(f"{CALLER}: " + "; ".join(problems))
        return got

    def move(self, x: Any, out: Any) -> tuple[Any, Any]:
        """The all-to-all on flat native views; returns (the result's flat view, the user's output)."""
        adapter, channel = self.adapter, self.channel
        layout = self.layout(out)
        src = adapter.flat(x)
        if out is None:
            shape = self.now.shape if self.uneven else tuple(adapter.shape(x))
            out, dst = adapter.allocate(x, shape)
        else:
            dst = adapter.flat(out)
        tracer = tracing.TRACER
        if tracer.on:
            tracer.begin(ALLTOALL, self.ran or self.options.algorithm, channel, src, dst)
        pending, self.now.pending = self.now.pending, None
        number, where = self.now.number, Where.AGREEMENT
        if pending is None and self.early and not self.now.check and channel.size > 1:
            # check=False: the same pattern, every block at once, with no agreement before it
            pending = send_ahead(self.state.agreement, channel, src)
            number, where = 0, Where.ALGORITHM  # no agreed call (its flight record's 0)
        if pending is not None:  # the blocks went with the header: received now that the ranks agree
            agreement = self.state.agreement
            receive(agreement, src, dst, pending, number, channel.timeout or 0.0, self.what, where)
            if self.compiled is None and kernels.ACTIVE == "c":
                self.compiled = self.compiled_for(self.spec, src, dst, layout)
        elif channel.size > 1 and (self.uneven or src.size):  # uneven: a rank with nothing still meets
            spec = self.spec if self.settled else self.settle(-1 if self.uneven else src.nbytes)
            compiled = self.compiled if kernels.ACTIVE == "c" and not tracer.on else False
            if compiled is None or (compiled is not False and self.uneven):
                compiled = self.compiled_for(spec, src, dst, layout)  # by the layout: uneven ones vary
                if not self.uneven and compiled is not None:  # equal blocks: one for the signature
                    self.compiled = compiled
            if not (compiled and compiled.run(src, dst, channel.timeout)):
                spec.run(channel, src, dst, layout)
        elif dst.size:  # one rank: its own block only
            dst[...] = src[: dst.size]
            local_copy(dst, src[: dst.size])
        if tracer.on:
            tracer.end()
        return dst, out

    # -- the warm call in C (`hpcring.core.exchange_caller`) ---------------------------------------

    def _warmable(self, x: Any) -> bool:
        """Whether a warm call in C can run this call on ``x`` whole: equal blocks of a NumPy array,
        under MPI_THREAD_MULTIPLE (or the main thread alone)."""
        return not (
            self.uneven or self.serial is not None or self.adapter is not NUMPY or type(x) is not np.ndarray
        )

    def _viewable(self) -> bool:
        """Equal blocks of arrays with NumPy views of their memory (CPU tensors): their warm call
        in C runs on those views (`run`)."""
        viewless = getattr(self.adapter, "host_view", None) is None
        return not (self.uneven or self.serial is not None or viewless)

    def _warm(self, key: tuple[Any, ...], program: Any) -> Any:
        """The C warm call of `run`'s ``key`` moving its data by ``program``; its output, where no
        out= is given, made by numpy.empty_like (x's shape, dtype and layout: C order)."""
        _, _, shape, dtype, algorithm, out_none, _, _ = key
        kind = (ALLTOALL, None, algorithm, 0, False, None, out_none, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        ahead = self.eager(nbytes)  # the blocks leave ahead of the agreement (`send_ahead`)
        return self._core_warm(kind, shape, dtype, program, False, -1, NO_PAYLOAD, np.empty_like, ahead)

    def settle(self, nbytes: int) -> Spec:
        """auto's choice, made once for this signature: by the size of equal blocks; for uneven
        ones (``nbytes`` < 0) among the algorithms that run them, one for every size."""
        known = algorithms.uneven(ALLTOALL) if self.uneven else algorithms.choices(ALLTOALL)
        name = self.spec.choose(self.channel, nbytes, False, known)
        self.spec, self.ran, self.settled = algorithms.spec(ALLTOALL, name), name, True
        return self.spec

    def compiled_for(self, spec: Spec, src: Any, dst: Any, layout: Layout) -> Any:
        """The compiled program of ``spec`` for this layout (`Call.compile`, keyed by the layout
        too): None the first time a kind is seen, False where there is none."""
        if kernels.ACTIVE != "c" or not core.active():
            return None
        adapter = self.adapter
        if not adapter.direct or adapter.device or type(src) is not np.ndarray:
            return False
        channel = self.channel
        key = (ALLTOALL, spec.name, src.size, dst.size, src.dtype, layout)
        programs = channel.resource("compiled-programs", dict)
        made = programs.get(key)
        if made is None:
            if len(programs) >= 256:  # uneven layouts that never repeat: keep the table small
                programs.clear()
            programs[key] = _SEEN
            return None
        if made is _SEEN:
            try:
                recording = record(spec, EXCHANGING, channel, src, dst, layout=layout)
                made = core.program(recording, src, dst)[0] or False
            except Unrecordable:
                made = False
            programs[key] = made
        return made


# ---- the blocks sent ahead of the agreement ------------------------------------------------------


def leaves_ahead(state: CommState, adapter: Adapter, algorithm: Any, uneven: bool, nbytes: int) -> bool:
    """Whether an all-to-all of ``nbytes`` per rank on ``state``'s communicator sends its blocks
    ahead of the agreement (`Exchange.eager`), and so runs `AHEAD`'s pattern."""
    return (
        not uneven
        and adapter is NUMPY
        and state.agreement.exchanging
        and eager_for(state.agreement.size, nbytes)
        and algorithms.spec(ALLTOALL, algorithm).choose is not None  # auto, the chooser
    )


def auto_runs(comm: MPI.Intracomm, x: Any) -> str | None:
    """What auto runs for an all-to-all of equal blocks of ``x`` on ``comm`` where that is decided
    before the tuning table (`AHEAD`, where its blocks leave ahead of the agreement), else None:
    how the bench names its auto rows. Collective where it makes ``comm``'s state."""
    adapter = adapter_for(x)
    nbytes = adapter.size(x) * adapter.dtype(x).itemsize
    return AHEAD if leaves_ahead(state_of(comm), adapter, "auto", False, nbytes) else None


def ahead_upto(size: int) -> int | bool | None:
    """The bytes per rank up to which equal NumPy blocks leave ahead of the agreement on ``size``
    ranks (None: any; False: none, where the agreement exchanges no messages or it did not pay)."""
    if size not in EAGER_UPTO or not exchanges(size):
        return False
    return EAGER_UPTO[size]


def eager_for(size: int, nbytes: int) -> bool:
    """Whether equal blocks of ``nbytes`` per rank on ``size`` ranks leave ahead of the agreement
    (where it exchanges messages, `Exchange.eager`: measured there)."""
    if size not in EAGER_UPTO:
        return False
    limit = EAGER_UPTO[size]
    return limit is None or nbytes <= limit


def send_ahead(agreement: Agreement, channel: Channel, src: np.ndarray) -> list[Any]:
    """``src``'s blocks sent to every other rank on the agreement's communicator (TAG_AHEAD),
    before the agreement (or, unchecked, without one): their requests. What left counts in
    ``channel``'s traffic, as a program's sends do (core.c's send_ahead counts it alike)."""
    comm, size, rank = agreement.comm, agreement.size, agreement.rank
    raw, block = src.view(np.uint8), src.nbytes // size
    peers = [q for q in range(size) if q != rank]
    channel.traffic.sent += block * len(peers)
    return [comm.Isend([raw[q * block : (q + 1) * block], MPI.BYTE], q, TAG_AHEAD) for q in peers]


def receive(
    agreement: Agreement,
    src: Any,
    dst: Any,
    pending: list[Any],
    number: int,
    timeout: float,
    what: str,
    where: Where = Where.AGREEMENT,
) -> None:
    """The blocks sent ahead, received into ``dst`` now that every rank agreed, this rank's own
    copied; then the sends done. Posted only now, even into an output the call made: before the
    agreement a receive could take a block of another size, and Open MPI 5.0 writes a longer
    message of rendezvous size past the end of the receive buffer (its error says truncated).
    ``where``: what a stall says this rank waited in (check=False: the data exchange)."""
    comm, size, rank = agreement.comm, agreement.size, agreement.rank
    raw, block = dst.view(np.uint8), dst.nbytes // size
    peers = [q for q in range(size) if q != rank]
    requests = [comm.Irecv([raw[q * block : (q + 1) * block], MPI.BYTE], q, TAG_AHEAD) for q in peers]
    if block:
        items = dst.size // size
        own, mine = dst[rank * items : (rank + 1) * items], src[rank * items : (rank + 1) * items]
        own[...] = mine
        local_copy(own, mine)
    agreement.wait(Both(*requests, *pending), number, timeout, what, where=where)


# ---- checks without communication --------------------------------------------------------------


def out_rows(adapter: Adapter, out: Any) -> int:
    """The rows of ``out`` (-1: no out=)."""
    return -1 if out is None else int(adapter.shape(out)[0])


def _problem(
    rank: int, arrives: tuple[int, ...], recvs: tuple[int, ...] | None, rows: int | None
) -> str | None:
    """What is wrong with rank ``rank``'s receive side, where the ranks send it ``arrives``: its
    ``recv_splits`` (None: not given) or the ``rows`` of its out= (None or -1: none)."""
    if recvs is not None and arrives != recvs:
        wrong = [i for i in range(len(arrives)) if arrives[i] != recvs[i]]
        return f"rank {rank}'s recv_splits do not match what the ranks send it: " + "; ".join(
            f"recv_splits[{i}] is {recvs[i]}, rank {i} sends {arrives[i]}" for i in wrong
        )
    if rows is not None and rows >= 0 and rows != sum(arrives):
        return f"rank {rank}'s out has {rows} rows, but the ranks send it {sum(arrives)} ({list(arrives)})"
    return None


def splits(values: Sequence[int], size: int, name: str) -> tuple[int, ...]:
    """``values`` as G non-negative integers; TypeError or ValueError saying what is wrong."""
    try:
        made = tuple(operator.index(v) for v in values)
    except TypeError:
        raise TypeError(f"{name} must be {size} integers, got {values!r}") from None
    if len(made) != size:
        raise ValueError(f"{name} must have one entry per rank ({size}), got {len(made)}")
    if any(v < 0 for v in made):
        raise ValueError(f"{name} must not be negative, got {list(made)}")
    return made


def problem_with_out(
    adapter: Adapter, x: Any, out: Any, rest: tuple[int, ...], shape: tuple[int, ...] | None
) -> str | None:
    """What is wrong with ``out`` for an all-to-all of ``x`` (``shape``: the output's, where
    known; else only its rows' shape ``rest``), or None. Raises what the adapter raises."""
    if not adapter.owns(out):
        return (
            f"out must be a {type(x).__module__}.{type(x).__name__} like x, "
            f"got {type(out).__module__}.{type(out).__name__}"
        )
    adapter.check_device(out, "out")
    flags = adapter.flags(out)
    if not flags.c_contiguous:
        return "out must be C-contiguous"
    if not flags.writeable:
        return "out is read-only"
    out_shape, dtype = tuple(adapter.shape(out)), adapter.dtype(x)
    if adapter.dtype(out) != dtype:
        return f"out must have x's dtype {dtype}, got {adapter.dtype(out)}"
    if shape is not None and out_shape != shape:
        return f"out must have x's shape {shape}, got {out_shape}"
    if not out_shape or out_shape[1:] != rest:
        return f"out's rows must have x's row shape {rest}, got shape {out_shape}"
    if adapter.shares_memory(x, out):
        return "out overlaps x; an all-to-all reads x while it writes out"
    return None


def validate(x: Any, out: Any, uneven: bool, size: int) -> tuple[Adapter, np.dtype, tuple[int, ...]]:
    """(adapter, dtype, shape of ``x``), or TypeError/ValueError (the caller adds its name)."""
    adapter = adapter_for(x)
    dtype = adapter.dtype(x)
    if not supported(dtype):
        raise TypeError(f"dtype {dtype} is not supported; use one of {', '.join(DTYPE_NAMES)}")
    if not adapter.flags(x).c_contiguous:
        fix = getattr(adapter, "contiguous_fix", "xp.ascontiguousarray(x)")
        raise ValueError(f"x must be C-contiguous (pass {fix})")
    adapter.check_device(x, "x")
    shape = tuple(adapter.shape(x))
    if not shape:
        raise ValueError("x must have a first axis to split into blocks, got a 0-d array")
    if not uneven and shape[0] % size:
        raise ValueError(
            f"x's first axis ({shape[0]}) does not split into {size} equal blocks; "
            "pass send_splits= for uneven blocks"
        )
    if out is not None:
        problem = problem_with_out(adapter, x, out, shape[1:], None if uneven else shape)
        if problem is not None:
            raise TypeError(problem) if problem.startswith("out must be a ") else ValueError(problem)
    return adapter, dtype, shape


def check_memory(channel: Channel, spec: Spec, count: int, dtype: np.dtype) -> None:
    """MemoryError, before anything is allocated, where the algorithm's scratch cannot fit."""
    priced = algorithms.priced(spec, count, dtype.itemsize, channel.size)
    need = (priced.scratch_bytes or (lambda *a: 0))(count, dtype.itemsize, channel.size, channel.rank)
    need -= channel.scratch_held()
    if need <= 0:
        return
    available = channel.adapter.available_bytes()
    limit = config.current().memory_limit
    if limit is not None:
        available = limit if available is None else min(available, limit)
    if available is not None and need > available:
        raise MemoryError(
            f"algorithm {spec.name!r} needs {format_bytes(need)} more scratch on rank {channel.rank} "
            f"for {count} elements, but only {format_bytes(available)} is available; "
            "algorithm='pairwise' needs none"
        )


# ---- the front door ------------------------------------------------------------------------------


def run(
    x: Any,
    out: Any,
    algorithm: Any,
    comm: Any,
    check: bool,
    timeout: float | None,
    sends: Sequence[int] | None,
    recvs: Sequence[int] | None,
) -> Any:
    """`hpcring.alltoall`: a warm call where this communicator has run the signature, else the
    full path, which keeps its call for the next time."""
    uneven = sends is not None or recvs is not None
    key = None
    adapter = known_adapter(x)
    if adapter is not None:
        try:
            device = adapter.current_device() if adapter.device else None
            shape, dtype = adapter.shape(x), adapter.dtype(x)
            key = (ALLTOALL, adapter, shape, dtype, algorithm, out is None, device, uneven)
            state = known_state(_WORLD if comm is None else comm)
            made = None if state is None else state.warm.get(key)
            ready = made is not None and made.ready(x, out)
        except Exception:
            key, ready = None, False
        if ready:
            fast = made.fast
            if fast and not uneven:  # a CPU tensor's warm call in C, on NumPy views
                result = viewed(fast, adapter, x, out, check, timeout)
                if result is not NotImplemented:
                    return result
            result = made(x, out, check, timeout, made.plan(x, out, sends, recvs, check))
            if made.fast is None and made.compiled:  # from now on in C, where the compiled core takes it
                made.fast = made.compiled_warm(_WORLD if comm is None else comm, key, x)
            return result
    return first(x, out, algorithm, comm, check, timeout, sends, recvs, key)


def first(
    x: Any,
    out: Any,
    algorithm: Any,
    comm: Any,
    check: bool,
    timeout: float | None,
    sends: Sequence[int] | None,
    recvs: Sequence[int] | None,
    key: Any = None,
) -> Any:
    """Validate, build the `Exchange`, run it, and keep it under ``key`` (None: not reusable)."""
    comm = intracomm(comm, CALLER)
    try:
        made, problem = prepare(x, out, algorithm, comm, check, timeout, sends, recvs)
    except Exception as error:  # check=False: this rank's own input error
        from .ulfm import first_call_failed  # here: only a failure loads it

        dump_on_error(error)
        failure = first_call_failed(comm, error, CALLER)
        if failure is not None:
            raise failure from error
        raise
    result = made(x, out, check, timeout, problem)
    if key is not None and problem is None and (made.settled or made.channel.size == 1):
        keep_warm(made, key)
    return result


def prepare(
    x: Any,
    out: Any,
    algorithm: Any,
    comm: MPI.Intracomm,
    check: bool,
    timeout: float | None,
    sends: Sequence[int] | None,
    recvs: Sequence[int] | None,
) -> tuple[Exchange, Exception | None]:
    """The call to run and this rank's problem with it (with ``check`` the agreement makes it
    every rank's error; without, it is raised here)."""
    uneven = sends is not None or recvs is not None
    options = Options(ALLTOALL, None, algorithm)
    problem: Exception | None = None
    adapter: Adapter | None = None
    dtype: np.dtype | None = None
    shape: tuple[int, ...] = ()
    size = comm.Get_size()
    try:
        spec = algorithms.spec(ALLTOALL, algorithm)
        if uneven and spec.equal_only:
            raise ValueError(
                f"algorithm {algorithm!r} runs equal blocks only; for send_splits= choose one of "
                f"{', '.join(algorithms.uneven(ALLTOALL))} or auto"
            )
        adapter, dtype, shape = validate(x, out, uneven, size)
    except (TypeError, ValueError) as error:
        error = type(error)(f"{CALLER}: {error}")
        if not check:
            raise error from None
        problem, adapter = error, None
        try:
            spec = algorithms.spec(ALLTOALL, algorithm)
        except ValueError:
            spec = algorithms.spec(ALLTOALL, "pairwise")
    state = state_of(comm, timeout)
    channel = state.channel(NUMPY if adapter is None else adapter)
    state.agreement.settings = channel.config
    row_items = int(np.prod(shape[1:], dtype=np.int64)) if shape else 0
    if adapter is not None and dtype is not None:
        try:
            count = adapter.size(x)
            if spec.choose is not None and not uneven:
                name = channel.cached(choice_key(ALLTOALL, count * dtype.itemsize, False))
                if name is not None:
                    spec = algorithms.spec(ALLTOALL, name)
            check_memory(channel, spec, count, dtype)
        except (MemoryError, TypeError, ValueError) as error:
            error = type(error)(f"{CALLER}: {error}")
            if not check:
                raise error from None
            problem = error
    row = ExchangeRow(
        collective=ALLTOALL,
        count=None if adapter is None else (UNEVEN - row_items if uneven else adapter.size(x)),
        dtype=dtype if adapter is not None else None,
        op=None,
        algorithm=algorithm,
        array=None if adapter is None else adapter.type_name,
        placement=None,
        root=0,
        settings=channel.config.digest(),
        wire=None,
    )
    made = Exchange(options, state, channel, adapter or NUMPY, spec, row, uneven, shape)
    if made.early:  # the blocks leave ahead, pairwise's pattern, in every call (`AHEAD`)
        made.spec = algorithms.spec(ALLTOALL, AHEAD)
    if made.early or spec.choose is None or spec.name != algorithm:
        made.settled, made.ran = True, made.spec.name
    if problem is None:
        problem = made.plan(x, out, sends, recvs, check)
        if problem is not None and not check:
            raise problem
    return made, problem


# What the front ends call: `run`, with its warm NumPy all-to-alls of equal blocks run in C in
# front of it where the compiled core runs (`hpcring.core.exchange_caller`); `run` itself where not.
run = core.exchange_caller(run)

__all__ = ["AHEAD", "CALLER", "Exchange", "ExchangeRow", "auto_runs", "first", "prepare", "run", "splits"]
