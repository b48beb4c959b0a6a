"""The call engine: every collective hpcring runs goes through one `Call` per signature.

A signature is what cannot change between two calls of a loop: the collective, the array kind,
shape and dtype, the op, the algorithm, the placement, the root, the wire and reproducible=, on
one communicator. The full path (`first`) validates the call once, through the array's adapter,
asks `hpcring.algorithms` its one question (the Spec that runs), prices its scratch, and builds
the `Call`; every later call of the signature finds it in the communicator's warm table (`call`)
and only asks the adapter whether this array is one the full path would take (`ready`).

The Call owns what a call needs on every run, each in one place: the timeout resolution, the
exclusion (one collective at a time per communicator), the flight slot, the agreement row
(`hpcring.agreement.Row`), and the transforms it applies around the algorithm: wire= runs it on
a `hpcring.wire.WireChannel`, reproducible=True runs it on integer words (`hpcring.exact`).
Error messages name the collective that was called. The front ends (`hpcring.collectives`,
`hpcring.nonblocking`, `hpcring.persistent`, `hpcring.accumulator`, `hpcring.wrap`,
`hpcring.training`) are thin: they say which collective and hand the arguments here.

Where the compiled core runs (`hpcring.core`), a Call's data movement from its second run on is
the algorithm's steps recorded as a table (`hpcring.program`) and run in C with the GIL
released; and a warm NumPy all-reduce, broadcast, reduce-scatter or all-gather runs in C from
the arguments to the result (`Call.compiled_warm`: the same key, exclusion, flight record and
agreement), coming back to the methods below only on slow paths. This file stays the reference
both cores are tested against.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from . import algorithms, config, core, kernels, tracing
from .agreement import NO_PAYLOAD, REPRODUCIBLE, Both, Payload, Row, payload_descriptor
from .agreement import collective as agreement_collective
from .algorithms import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCE_SCATTER, Spec
from .algorithms.base import choice_key
from .arrays import NUMPY, Adapter, adapter_for, known_adapter
from .channel import Channel
from .comm import CommState, intracomm, known_state, state_of
from .errors import StallError
from .flight import AGREEMENT, MASK, MOVING, Where, clock, dump_on_error
from .ops import NAMES as DTYPE_NAMES
from .ops import OPS, Op, check_op, op_name, supported
from .partition import segment
from .polling import abandon
from .records import Record
from .tracing import local_copy
from .units import format_bytes

WARM_CALLS = 256  # kinds of call remembered per communicator
PROGRAMS = 256  # compiled programs kept per channel (`Call.compile`)
_SEEN = "seen"  # a program's kind was seen once: recorded the next time
# How a collective's run function is called (`hpcring.algorithms.base`): (ch, src, dst, op),
# (ch, src, dst), (ch, buf, root) or, the all-to-all's (`hpcring.exchange`), (ch, src, dst, layout).
REDUCING, GATHERING, ROOTED, EXCHANGING = "reducing", "gathering", "rooted", "exchanging"
FORMS = {
    ALLREDUCE: REDUCING,
    REDUCE_SCATTER: REDUCING,
    ALLGATHER: GATHERING,
    BROADCAST: ROOTED,
    ALLTOALL: EXCHANGING,
}
_WORLD = MPI.COMM_WORLD
_serialized = threading.Lock()  # under MPI_THREAD_SERIALIZED, one MPI call at a time in all


class Options(Record):
    """What a call was asked to do, beyond its arrays: fixed for its signature.

    ``check`` and ``timeout`` are not here: they may change from call to call without changing
    what runs, so each run takes them (a warm table keyed by them would split one signature)."""

    collective: str
    op: str | None  # None: a collective that reduces nothing
    algorithm: str
    root: int = 0
    wire: str | None = None
    reproducible: bool = False

    @property
    def caller(self) -> str:
        return f"hpcring.{self.collective}"


class Call:
    """Everything about one kind of call that cannot change between calls: worked out by the
    full path once, then reused by every warm call of its signature on the communicator."""

    __slots__ = (
        "adapter",
        "agreers",
        "channel",
        "compiled",
        "exact",
        "fast",
        "flight",
        "form",
        "fuse",
        "in_place",
        "mean",
        "options",
        "out_shape",
        "parts",
        "planning",
        "ran",
        "ready",
        "reduction",
        "returns_x",
        "row",
        "serial",
        "settled",
        "single",
        "spec",
        "state",
        "timeout",
        "what",
        "words",
    )

    def __init__(
        self,
        options: Options,
        state: CommState,
        channel: Channel,
        adapter: Adapter,
        spec: Spec,
        row: Row,
        reduction: Op | None,
        in_place: bool | None,
        out_shape: tuple[int, ...] | None,
    ) -> None:
        self.options, self.state, self.channel, self.adapter = options, state, channel, adapter
        self.spec, self.row, self.reduction, self.in_place = spec, row, reduction, in_place
        self.out_shape = out_shape  # the output a call makes where no out= is given
        # An all-reduce in place and a broadcast hand back x itself (out= a view of x's bytes is x)
        self.returns_x = bool(in_place) and options.collective in (ALLREDUCE, BROADCAST)
        self.form = FORMS[options.collective]
        self.words = row.words()  # the agreement's row, encoded once
        self.flight = state.flight  # the communicator's recorder, one attribute away on every call
        self.mean = reduction is not None and reduction.name == "mean"
        self.ran: str | None = None if spec.choose else spec.name  # what runs (auto: once chosen)
        self.settled = spec.choose is None  # auto: its choice for this size is made
        self.exact = False  # reproducible=True: the sum runs on integer words (`hpcring.exact`)
        self.parts: list[Any] | None = None  # an ExactSum's local contributions, where it calls
        self.fuse = NO_PAYLOAD  # what rides with the agreement (`fusion`), once known
        self.planning = False  # a plan's run (`planned`): its failures name the plan's agreed call
        level = _thread_level()
        self.single = level < MPI.THREAD_SERIALIZED  # MPI allows the main thread alone
        self.serial = _serialized if level == MPI.THREAD_SERIALIZED else None
        self.timeout = state.timeout  # HPCRING_TIMEOUT as the communicator took it (None: unread)
        self.ready = _READY[options.collective](adapter, self)
        args = [f"op={options.op!r}"] if options.op else []
        args += [f"root={options.root}"] if options.collective == BROADCAST else []
        # The call as a StallError names it: hpcring.allreduce(op='sum', algorithm='ring')
        self.what = f"{options.caller}({', '.join([*args, f'algorithm={options.algorithm!r}'])})"
        # The compiled core (`hpcring.core`): the recorded program of the data movement (None: not
        # yet; False: none) and the warm call run in C (None: not yet; False: none).
        self.compiled: Any = None
        self.fast: Any = None
        # The agreement of the Python path's calls, run in C (`agreer`), per payload descriptor
        self.agreers: dict[tuple[int, int, int], Any] | None = None

    def _enter(self) -> None:
        """One collective at a time per communicator, and none from threads MPI was not set up for:
        two threads interleaving collectives on one communicator would match each other's
        messages, so the second is refused instead of corrupting both."""
        if self.single and threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                f"{self.options.caller}: called from a second thread, but MPI was initialized without "
                "thread support; initialize MPI with MPI_THREAD_MULTIPLE (mpi4py's default) to use threads"
            )
        if not self.state.busy.acquire(blocking=False):
            raise RuntimeError(
                f"{self.options.caller}: another thread is running a collective on this communicator; "
                "give each thread its own communicator (comm.Dup())"
            )
        if self.serial is not None:
            self.serial.acquire()

    def _leave(self) -> None:
        if self.serial is not None:
            self.serial.release()
        self.state.busy.release()

    def _agree(self, timeout: float, problem: Exception | None, payload: Payload | None = None) -> bool:
        """The ranks' agreement on this call (nothing to agree on for one rank), with the call's
        data riding along where ``payload`` is given: True where it did, on every rank."""
        if self.channel.size > 1:
            state = self.state
            state.calls = number = state.calls + 1
            # in C where the compiled core has it (a problem, or an all-to-all's blocks sent ahead
            # of it, take the Python path, which says and drains them)
            if problem is None and not state.agreement.ahead:
                agreer = self.agreer(NO_PAYLOAD if payload is None else payload.descriptor)
                if agreer:
                    if payload is None:
                        return agreer.agree(number, None, None, timeout)
                    return agreer.agree(number, payload.src, payload.dst, timeout)
            return state.agreement(
                [number, *self.words],
                self.row,
                problem,
                timeout=timeout,
                what=self.what,
                caller=self.options.caller,
                payload=payload,
            )
        return False

    def agreer(self, descriptor: tuple[int, int, int]) -> Any:
        """The agreement of this call carrying a payload of ``descriptor`` (NO_PAYLOAD: none), run
        in C (`hpcring.core.warm` without a program: its ``agree``), made once; False where the
        compiled core cannot run it (under MPI_THREAD_SERIALIZED too: the Python path serializes),
        None while the compiled core is off (asked again)."""
        agreers = self.agreers
        if agreers is None:
            agreers = self.agreers = {}
        made = agreers.get(descriptor)
        if made is not None:
            return made
        if not core.active():
            return None
        made = False
        if self.serial is None:
            code, _, count = descriptor
            itemsize = kernels.DTYPES[code].itemsize if code >= 0 else 1
            agreement_collective(compiled=True)  # the compiled agreement's datatype and op, made once
            state = self.state
            kind = ("agreement", None, None, 0, False, None, True, None)
            try:
                made = core.warm(
                    self, kind, (max(count, 0),), itemsize, state, self.flight, state.busy,
                    self.channel, self.timeout, state.comm, tuple(self.words), self.single,
                    False, False, -1, descriptor, None,
                )  # fmt: skip
            except ValueError:  # a payload the compiled agreement's slot does not hold
                made = False
        agreers[descriptor] = made
        return made

    def fusion(self, planned: bool = False) -> tuple[int, int, int]:
        """The descriptor of this call's data where it rides with the agreement: an all-reduce that
        runs the library's own (`Spec.rides`) on host memory, small enough for the agreement's
        slot, of a dtype and op whose reductions commute bitwise
        (`hpcring.agreement.payload_descriptor`); else NO_PAYLOAD. It rides only where it does on
        every rank (the agreement's header says), else it moves after."""
        adapter, reduction = self.adapter, self.reduction
        if (
            self.options.collective != ALLREDUCE
            or not (self.settled and self.spec.rides)
            or self.exact
            or adapter.device
            or not adapter.direct
            or reduction is None
            or self.row.count is None
            or self.row.dtype is None
        ):
            return NO_PAYLOAD
        return payload_descriptor(
            self.row.dtype,
            reduction.ufunc,
            self.row.count,
            self.channel.size,
            self.state.exchange_ranks,
            self.in_place,
            planned,
        )

    def agree(
        self, timeout: float | None, problem: Exception | None = None, nbytes: int | None = None
    ) -> None:
        """The agreement alone (a plan's, made once), or ``problem`` raised on every rank; with
        ``nbytes``, auto then makes its choice for that size (every rank is here)."""
        timeout = resolve_timeout(self.state, timeout)
        self._enter()
        try:
            self.channel.timeout = timeout or None
            self._agree(timeout, problem)
            if problem is None and nbytes is not None and not self.settled:
                self.settle(nbytes)
        except MPI.Exception as error:
            from .ulfm import rank_failed  # here: only a failure loads it

            failure = rank_failed(self, error, self.state.calls, moving=False)
            if failure is None:
                raise
            raise failure from error
        finally:
            self._leave()
        if problem is not None:
            raise problem

    def __call__(
        self, x: Any, out: Any, check: bool, timeout: float | None, problem: Exception | None = None
    ) -> Any:
        """Agree (with ``check``), then move the data, or raise ``problem`` on every rank.

        Each call is recorded in the communicator's flight recorder (`hpcring.flight`): a slot
        reused every 64 calls, a few attribute stores and two clock reads."""
        if timeout is None:  # the communicator's HPCRING_TIMEOUT (docs/configuration.md: fixed at first use)
            timeout = self.timeout
            if timeout is None:
                timeout = config.current().timeout  # a bad value raises here, on every rank alike
        # The exclusion (`_enter`, `_leave`), written out: this runs on every call.
        if self.single and threading.current_thread() is not threading.main_thread():
            self._enter()  # raises, saying why
        busy, serial = self.state.busy, self.serial
        if not busy.acquire(False):
            self._enter()  # raises, saying why
        if serial is not None:
            serial.acquire()
        try:
            self.channel.timeout = timeout or None  # every wait of the call is bounded by it
            flight = self.flight
            seq = flight.seq = flight.seq + 1
            slot = flight.slots[seq & MASK]
            slot.call = self
            slot.phase = AGREEMENT
            slot.start = clock()
            try:
                carried = False
                if check and self.fuse is not NO_PAYLOAD and problem is None and not tracing.TRACER.on:
                    src, dst, out = self.buffers(x, out)  # the data rides with the agreement (a
                    # traced call's moves apart: the trace shows its steps)
                    carried = self._agree(timeout, problem, Payload(self.fuse, src, dst))
                elif check:
                    self._agree(timeout, problem)
                slot.number = self.state.calls if check else 0  # 0: not agreed on
                if problem is not None:  # a single rank: nothing to agree on
                    raise problem
                slot.phase = MOVING
                if carried:  # one collective moved the data too
                    if self.mean:
                        self.channel.xp.true_divide(dst, self.channel.size, out=dst)
                    if self.compiled is None and kernels.ACTIVE == "c":  # for the warm call in C
                        self.compiled = self.compile(self.spec, src, dst)
                else:
                    dst, out = self.move(x, out)
            except BaseException as error:
                slot.number = self.state.calls if check else 0
                # MPI's fault tolerance (ULFM): a rank died, or a survivor revoked the communicator
                from .ulfm import rank_failed  # here: only a failure loads it

                failure = rank_failed(self, error, slot.number, moving=slot.phase == MOVING)
                flight.failed(slot, failure or error)
                if isinstance(error, (StallError, MPI.Exception)):  # MPI may still use what
                    abandon(error)  # the frames hold (a stall, a failed rank, any MPI error)
                if failure is not None:
                    raise failure from error
                raise
            slot.end = clock()  # done: an end after the start (a failed call negates its phase)
        finally:
            if serial is not None:
                serial.release()
            busy.release()
        made = x if self.returns_x else out
        if self.adapter.immutable:  # JAX: a new array of the result; CUDA torch: after its stream waits
            like = x if made is None else made
            if self.out_shape is None:  # the result has the shape of x (or out): every kind knows that
                return self.adapter.result(dst, like)
            return self.adapter.result(dst, like, self.out_shape)
        return made

    def buffers(self, x: Any, out: Any) -> tuple[Any, Any, Any]:
        """(the input's flat native view, the result's, ``out``: the user's output, made here
        where the collective makes one)."""
        adapter = self.adapter
        src = adapter.flat(x)
        if self.out_shape is not None:  # reduce_scatter, allgather without out=: a new array
            out, dst = adapter.allocate(x, self.out_shape)
        elif self.returns_x:  # x itself (out= a view of x's bytes is x too)
            dst = src
        else:
            dst = adapter.flat(out)
        return src, dst, out

    def move(self, x: Any, out: Any) -> tuple[Any, Any]:
        """The collective itself, on flat native views; returns (the result's flat view, ``out``:
        the user's output, made here where the collective makes one; for JAX, None)."""
        channel = self.channel
        src, dst, out = self.buffers(x, out)
        tracer = tracing.TRACER
        if tracer.on:
            tracer.begin(self.options.collective, self.ran or self.options.algorithm, channel, src, dst)
        if self.exact:  # ---- reproducible sums: integer words (hpcring/exact.py) ----
            self.exact_sum(src, dst)
        elif channel.size > 1 and src.size > 0:
            spec = self.spec if self.settled else self.settle(src.nbytes)
            compiled = self.compiled if kernels.ACTIVE == "c" and not tracer.on else False
            if compiled is None:  # None until recorded (the first run of a kind is Python's), then kept
                compiled = self.compiled = self.compile(spec, src, dst)
            if not (compiled and compiled.run(src, dst, self.channel.timeout)):
                try:
                    form = self.form  # how the collective's run function is called (`Spec`)
                    if form is REDUCING:
                        spec.run(self.channel, src, dst, self.reduction)
                    elif form is GATHERING:
                        spec.run(self.channel, src, dst)
                    else:
                        spec.run(self.channel, dst, self.options.root)
                except BaseException:
                    if self.channel.wire is not None:  # a WireChannel: its wire buffers back to the pool
                        self.channel.settle()
                    raise
            if self.mean:
                channel.xp.true_divide(dst, channel.size, out=dst)
        else:  # one rank, or no data: nothing to exchange, only x to copy where it goes
            compiled = self.compiled if kernels.ACTIVE == "c" and not tracer.on else False
            if compiled is None:  # recorded too, so the warm call runs in C (`compiled_warm`)
                compiled = self.compiled = self.compile(ALONE[self.form], src, dst)
            if not (compiled and compiled.run(src, dst, self.channel.timeout)) and dst is not src:
                dst[...] = src[: dst.size]
                local_copy(dst, src[: dst.size])
        if tracer.on:
            tracer.end()
        return dst, out

    def settle(self, nbytes: int) -> Spec:
        """auto's choice for this call, made now (collective the first time for a size on a
        channel: every rank is inside this call, after the agreement), kept from now on; and
        whether its wire narrows here (`Spec.keep_wire`)."""
        chooser, collective = self.spec, self.options.collective
        in_place = bool(self.in_place) and collective == ALLREDUCE  # auto's tables tell only its placement
        name = chooser.choose(self.channel, nbytes, in_place, algorithms.choices(collective))
        chosen = algorithms.spec(collective, name)
        if self.channel.wire is not None and not chooser.keep_wire(self.channel, chosen):
            self.channel = self.state.channel(self.adapter)  # wire= where it does not pay: sent as it is
        self.spec, self.ran, self.settled = chosen, name, True
        self.fuse = self.fusion()
        return chosen

    def exact_sum(self, src: Any, dst: Any) -> None:
        """reproducible=True: inside the steps of an algorithm that comes in two phases (the ring,
        Rabenseifner; auto's choice for the size of the words), in the compiled core from the
        second call of a kind on; else the whole all-reduce twice, on codes then on words."""
        from . import exact  # here: only reproducible=True needs it

        channel, accumulated = self.channel, self.parts is not None
        parts = [src] if self.parts is None else self.parts
        spec = self.spec
        if channel.size > 1 and dst.size and channel.xp is np:
            if spec.choose is not None:
                nbytes = dst.size * 8 * exact.format_of(dst.dtype).words
                name = spec.choose(channel, nbytes, True, algorithms.choices(ALLREDUCE))
                spec = algorithms.spec(ALLREDUCE, name)
                self.ran = name
            if spec.split is not None:
                if not accumulated and kernels.ACTIVE == "c" and not tracing.TRACER.on:
                    compiled = self.compile(spec, src, dst, exact_op=self.options.op)
                    if compiled and compiled.run(src, dst, channel.timeout):
                        return
                split = spec.split(channel, dst.size)
                exact.fused(channel, split, parts, dst, self.options.op, accumulated=accumulated)
                return
        exact.run(channel, self.reduce_words, parts, dst, self.options.op, accumulated=accumulated)

    def reduce_words(self, buf: Any, op: str) -> None:
        """reproducible=True: one all-reduce of ``buf`` in place by this call's algorithm (auto
        chooses for what travels: the codes, then the words); in the compiled core from the
        second call of a kind on (`compile`)."""
        spec = self.spec
        if spec.choose is not None:
            name = spec.choose(self.channel, buf.nbytes, True, algorithms.choices(ALLREDUCE))
            spec = algorithms.spec(ALLREDUCE, name)
            self.ran = name
        if kernels.ACTIVE == "c" and not tracing.TRACER.on:
            compiled = self.compile(spec, buf, buf, OPS[op])
            if compiled and compiled.run(buf, buf, self.channel.timeout):
                return
        spec.run(self.channel, buf, buf, OPS[op])

    # ---- the compiled core (`hpcring.core`) -------------------------------------------------

    def compile(
        self, spec: Spec, src: Any, dst: Any, reduction: Op | None = None, exact_op: str | None = None
    ) -> Any:
        """The compiled program of ``spec`` on arrays shaped and placed as ``src`` and ``dst``, kept
        with the channel (every Call of that shape shares it): None the first time a kind is seen
        (its run in Python makes the algorithm's schedules) and whenever the compiled core is off;
        then recorded from the algorithm (`hpcring.program`), or False where there is none (not
        host memory MPI reads directly, or an algorithm that does what a table cannot hold)."""
        adapter = self.adapter
        if not core.active():
            return None  # not now (HPCRING_CORE, or hpcring.kernels.using): asked again later
        if not adapter.direct or adapter.device or type(src) is not np.ndarray:
            return False
        channel = self.channel
        wire = channel.wire
        op = reduction if reduction is not None else self.reduction
        # dst a part of src (reduce-scatter in place), src a row of dst (all-gather in place), or apart
        placed = "same" if dst is src else _offset_inside(dst, src)
        if placed is None and (row := _offset_inside(src, dst)) is not None:
            placed = ("row", row)
        key = (spec.collective, spec.name, src.size, dst.size, src.dtype, placed, op, self.options.root, wire)
        if exact_op is not None:  # reproducible=True inside the algorithm's steps (`exact_sum`)
            key = ("exact", exact_op, *key)
        programs = channel.resource("compiled-programs", dict)
        made = programs.get(key)
        if made is None:
            if len(programs) >= PROGRAMS:  # a code that never repeats a shape: keep the table small
                programs.clear()
            programs[key] = _SEEN
            return None
        if made is _SEEN:
            # the compiled core's, from a kind's second run on
            from .program import Unrecordable, record, record_exact

            try:
                if exact_op is not None:
                    recording = record_exact(spec, channel, src, dst, exact_op)
                else:
                    recording = record(spec, self.form, channel, src, dst, op, self.options.root, wire)
                made = core.program(recording, src, dst)[0] or False
            except Unrecordable:
                made = False
            programs[key] = made
        return made

    def compiled_warm(self, comm: Any, key: tuple[Any, ...], x: Any) -> Any:
        """The warm call of this kind run in C from now on (`hpcring.core.warm`), or False where
        the compiled core cannot take it whole: not a NumPy all-reduce, broadcast, reduce-scatter
        or all-gather, no program, another thread level than MPI_THREAD_MULTIPLE's or the main
        thread's, a mean it does not divide. Listed in the communicator's table, found by the
        user's communicator's handle."""
        if not core.active():
            return None  # asked again on a later call
        if not self.compiled:
            return False
        if not self._warmable(x):
            # a CPU tensor's: run on NumPy views of its memory from `call`, where the Python
            # look-up found it; not listed (the C front door finds ndarrays, whose row differs)
            return self._warm(key, self.compiled) if self._viewable() else False
        from .comm import attached  # the table lives and dies with the communicator's state

        table = attached(comm, "compiled-warm-calls", lambda: core.table(comm))
        made = self._warm(key, self.compiled)
        table.add(made)
        return made

    def planned(self, x: Any, out: Any, request: Any, op: Any, timeout: float | None) -> Any:
        """A plan's run in C (`hpcring.plan`): its persistent request started and waited for
        within the timeout, with this call's exclusion and flight record, and no agreement; a
        callable of no arguments, or None where the compiled core cannot take it."""
        if not core.active() or not self._warmable(x):
            return None
        # Its own Call, whose Spec says it does not block: the run's wait is bounded by its own
        # timeout (`plan_waited`), so the watchdog, which ends a job stuck in a blocking library
        # call, must not take it for one.
        import copy  # here: the module costs a first call 1-2 ms (its Jython probe searches sys.path)

        run = copy.copy(self)
        run.spec = self.spec._replace(blocking=False)
        run.planning = True
        key = (ALLREDUCE, self.adapter, self.adapter.shape(x), x.dtype, op, self.ran, out is None)
        if not isinstance(request, MPI.Request):  # a two-rank plan (`hpcring.persistent.Pair`)
            run.fuse = request.descriptor  # its op's (it may carry more than a call's agreement)
            request = request.program
        made = run._warm((*key, None, 0, None, False), request)
        return functools.partial(made.run, x, out, timeout)

    def _warmable(self, x: Any) -> bool:
        """Whether a warm call in C can run this call on ``x`` whole (`compiled_warm`)."""
        return not (
            self.serial is not None
            or self.adapter is not NUMPY
            or type(x) is not np.ndarray
            or self.options.collective not in (ALLREDUCE, BROADCAST, REDUCE_SCATTER, ALLGATHER)
            or self.exact
            or (self.mean and x.dtype not in (np.float32, np.float64))
        )

    def _viewable(self) -> bool:
        """Whether this call's arrays have NumPy views of their memory that a warm call in C runs
        on (an adapter's ``host_view``: CPU tensors), under the conditions `_warmable` sets for an
        ndarray."""
        dtype = self.row.dtype
        return not (
            getattr(self.adapter, "host_view", None) is None
            or self.serial is not None
            or self.options.collective not in (ALLREDUCE, BROADCAST, REDUCE_SCATTER, ALLGATHER)
            or self.exact
            or dtype is None
            or (self.mean and dtype not in (np.float32, np.float64))
        )

    def _warm(self, key: tuple[Any, ...], program: Any) -> Any:
        """The C warm call of engine.call's ``key`` moving its data by ``program`` (a compiled
        program, or a plan's persistent request)."""
        _, _, shape, dtype, op, algorithm, out_none, _, root, wire, reproducible = key
        mean = -1
        if self.mean:
            mean = 2 if dtype == np.float32 else 3  # the kernels' codes (hpcring.kernels.DTYPE_CODES)
        kind = (self.options.collective, op, algorithm, root, reproducible, wire, out_none, dtype)
        if self.options.collective in (REDUCE_SCATTER, ALLGATHER):
            made, layout = self._layout(shape, dtype)
            made = made if out_none else None
            return self._core_warm(kind, shape, dtype, program, False, mean, self.fuse, made, False, layout)
        return self._core_warm(kind, shape, dtype, program, self.returns_x, mean, self.fuse)

    def _layout(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[Any, tuple[Any, ...]]:
        """A reduce-scatter's or an all-gather's warm call in C: (what makes its result where no out=
        is given, called with x; the layout the compiled `ready` checks out= against, as
        `_ready_gathered` does: (form, the result's bytes, x's own part's byte offset in x or x's
        row's in out, in place, auto's (schedules, key, choice) or None))."""
        channel, collective = self.channel, self.options.collective
        itemsize, count = dtype.itemsize, math.prod(shape)
        if collective == REDUCE_SCATTER:
            start, stop = segment(count, channel.size, channel.rank)
            made: tuple[int, ...] = (stop - start,)
            form, part = 1, start * itemsize
        else:
            made, form, part = (channel.size, *shape), 2, channel.rank * count * itemsize
        # auto: warm while the channel holds its choice still, as `_ready_gathered` asks (one rank
        # chooses nothing: its call runs ALONE)
        chosen = None
        if channel.size > 1 and algorithms.spec(collective, self.options.algorithm).choose is not None:
            chosen = (channel.schedules(), choice_key(collective, count * itemsize, False), self.ran)
        layout = (form, math.prod(made) * itemsize, part, bool(self.in_place), chosen)
        return functools.partial(_allocate, made), layout

    def _core_warm(
        self,
        kind: tuple[Any, ...],
        shape: Any,
        dtype: np.dtype,
        program: Any,
        returns_x: bool,
        mean: int,
        fuse: tuple[int, int, int],
        allocate: Any = None,
        ahead: bool = False,
        layout: tuple[Any, ...] | None = None,
    ) -> Any:
        """`hpcring.core.warm` for this call: the signature ``kind`` as the compiled front door
        matches it, the rest from this call's state; ``allocate`` makes an output where no out=
        is given (an all-to-all's, a reduce-scatter's, an all-gather's), else None; ``ahead``, an
        all-to-all's blocks sent ahead of the agreement (`hpcring.exchange.send_ahead`);
        ``layout``, a reduce-scatter's or an all-gather's result (`_layout`)."""
        agreement_collective(compiled=True)  # the compiled agreement's datatype and op, made once
        return core.warm(
            self,
            kind,
            tuple(shape),
            dtype.itemsize,
            self.state,
            self.flight,
            self.state.busy,
            self.channel,
            self.timeout,
            self.state.comm,
            tuple(self.words),
            self.single,
            returns_x,
            self.spec.blocking,
            mean,
            fuse,
            program,
            allocate,
            ahead,
            layout,
        )

    def plan_waited(self, request: MPI.Prequest, timeout: float | None) -> None:
        """A plan's run in C went on past its spinning: wait within ``timeout`` (None: no limit),
        or raise StallError naming the ranks that never started theirs."""
        waiter = self.state.agreement.waiter
        if isinstance(request, tuple):  # a two-rank plan's (receive, send, ...)
            request = Both(*request[:2])
        woke = waiter.bounded(request, timeout)
        if woke is not None:
            raise waiter.stall(woke, f"{self.what} plan", timeout or 0.0, self.state.calls)

    def resolve_timeout(self, timeout: float | None) -> float:
        """The compiled warm call's timeout where the communicator has none read (a bad value raises)."""
        return resolve_timeout(self.state, timeout)

    def compiled_stalled(
        self,
        request: MPI.Request,
        number: int,
        timeout: float,
        deadline: float | None = None,
        where: int = Where.AGREEMENT,
    ) -> None:
        """The compiled warm call's agreement went on past its spinning: wait as the Python path
        does (until ``deadline``, the agreement's, where it has one), or raise StallError naming
        the ranks that did not arrive (``where``: an unchecked all-to-all's blocks wait in the data
        exchange)."""
        self.state.agreement.wait(request, number, timeout, self.what, deadline, Where(where))

    def compiled_disagreed(self, number: int, ahead: tuple[MPI.Request, ...] = ()) -> None:
        """The compiled warm call's agreement showed a difference: raise what every rank raises
        (``ahead``: the sends of an all-to-all's blocks sent ahead of it, done first)."""
        agreement = self.state.agreement
        agreement.ahead = ahead
        agreement.disagree([number, *self.words], self.row, None, self.options.caller)

    def compiled_failed(self, slot: Any, error: BaseException, check: bool) -> None:
        """A compiled warm call raised after taking its flight slot: recorded as the Python path
        records a failure (the requests a StallError leaves pending are kept), and an MPI error
        that is a failed rank (ULFM) raised as the RankFailedError the Python path raises."""
        from .ulfm import rank_failed  # here: only a failure loads it

        slot.number = self.state.calls if check or self.planning else 0
        failure = rank_failed(self, error, slot.number, moving=slot.phase == MOVING)
        self.flight.failed(slot, failure or error)
        if isinstance(error, (StallError, MPI.Exception)):
            abandon(error)
        if failure is not None:
            raise failure from error


def _alone(ch: Any, src: Any, dst: Any, *_: Any) -> None:
    """Every collective on one rank: the result is the input, copied where it goes."""
    if dst is not src:
        dst[...] = src[: dst.size]


# What a call on one rank, or of no data, runs, by form: recorded as any algorithm is, so its
# warm call runs in C too (a broadcast's buffer is its result already)
ALONE = {
    REDUCING: Spec(run=_alone, name="alone", collective="one rank"),
    GATHERING: Spec(run=_alone, name="alone", collective="one rank"),
    ROOTED: Spec(run=lambda ch, buf, root: None, name="alone", collective="one rank"),
}


# ---- the warm path ---------------------------------------------------------------------------


def call(
    collective: str,
    x: Any,
    out: Any,
    op: Any,
    algorithm: Any,
    comm: Any,
    check: bool,
    timeout: float | None,
    root: Any = 0,
    reproducible: bool = False,
    wire: Any = None,
    parts: list[Any] | None = None,
) -> Any:
    """Run ``collective`` on ``x``: a warm call where this communicator has run its signature,
    else the full path, which keeps its call for the next time. Anything a warm lookup cannot
    take (an unhashable op, an array kind it does not know) takes the full path, whose
    validation says what is wrong. (An `ExactSum`'s call, ``parts``, is never warm.)"""
    key = None
    if out is x and collective == ALLREDUCE:  # out=x is in place: the same call as out=None, warm too
        out = None
    adapter = known_adapter(x)
    if adapter is not None:
        try:  # an adapter's question that raises (a dtype it has no name for) is the full path's
            device = adapter.current_device() if adapter.device else None
            key = (
                collective,
                adapter,
                adapter.shape(x),
                adapter.dtype(x),
                op,
                algorithm,
                out is None,
                device,
                root,
                wire,
                reproducible,
            )
            state = known_state(_WORLD if comm is None else comm)
            made = None if state is None else state.warm.get(key)
            ready = made is not None and made.ready(x, out)
        except Exception:
            key, ready = None, False
        if ready:
            fast = made.fast
            if fast and (result := viewed(fast, adapter, x, out, check, timeout)) is not NotImplemented:
                return result
            result = made(x, out, check, timeout)
            if made.fast is None and made.compiled:  # from now on in C, where the compiled core takes it
                made.fast = made.compiled_warm(_WORLD if comm is None else comm, key, x)
            return result
    if parts is not None:
        key = None
    return first(
        Options(collective, op, algorithm, root, wire, reproducible), x, out, comm, check, timeout, key, parts
    )


def viewed(fast: Any, adapter: Adapter, x: Any, out: Any, check: bool, timeout: float | None) -> Any:
    """A warm call in C (``fast``, found by the Python look-up: its row says ``x``'s kind) run on
    NumPy views of the memory of arrays that have them (the adapter's ``host_view``: CPU
    tensors); the result as the user's kind (x, out, or the output made, wrapped), or
    NotImplemented: another kind, or the Python path must take it."""
    view = getattr(adapter, "host_view", None)
    if view is None:
        return NotImplemented
    xv, ov = view(x), None if out is None else view(out)
    result = fast.call(xv, ov, check, timeout)
    if result is NotImplemented or result is xv:
        return x if result is xv else result
    return out if out is not None else adapter.from_host(result)


# ---- the full path ---------------------------------------------------------------------------


def first(
    options: Options,
    x: Any,
    out: Any,
    comm: Any,
    check: bool,
    timeout: float | None,
    key: Any = None,
    parts: list[Any] | None = None,
) -> Any:
    """Validate, build the Call, run it, and keep it under ``key`` (the front end's warm key:
    None, not reusable) where its signature tells its placement."""
    comm = intracomm(comm, options.caller)
    try:
        made, problem = prepare(options, x, out, comm, check, timeout, parts)
    except Exception as error:  # check=False: this rank's own input error (check=True agrees on it)
        from .ulfm import first_call_failed  # here: only a failure loads it

        dump_on_error(error)
        failure = first_call_failed(comm, error, options.caller)  # a rank died in the duplicate
        if failure is not None:
            raise failure from error
        raise
    result = made(x, out, check, timeout, problem)
    if key is not None and problem is None and _cacheable(made, out):
        keep_warm(made, key)
    return result


def keep_warm(made: Call, key: Any) -> None:
    """``made`` as its communicator's warm call of ``key``. A code that never repeats a shape keeps
    the table small: at WARM_CALLS it is emptied, and the warm calls in C go with it."""
    warm = made.state.warm
    if len(warm) >= WARM_CALLS:
        warm.clear()
        compiled = made.state.made.get("compiled-warm-calls")
        if compiled is not None:
            compiled.clear()
    warm[key] = made


def _cacheable(made: Call, out: Any) -> bool:
    """Whether the warm key tells this call's placement: out= a view of x's own bytes (in place)
    is not what ``out is None`` says; nor is an auto whose choice was priced before it was made."""
    if made.exact or (not made.settled and made.channel.size > 1):
        return False
    collective = made.options.collective
    if collective == ALLREDUCE:
        return made.in_place == (out is None)
    return True  # reduce_scatter, allgather: their warm call asks the placement (`_ready_gathered`)


def prepare(
    options: Options,
    x: Any,
    out: Any,
    comm: MPI.Intracomm,
    check: bool,
    timeout: float | None = None,
    parts: list[Any] | None = None,
) -> tuple[Call, Exception | None]:
    """The call to run and this rank's problem with it (with ``check``, the agreement makes it
    every rank's error; without, it is raised here). Validation through the adapter, the
    communicator's state (its first call duplicates it), the Spec that runs, the memory guard."""
    caller, collective = options.caller, options.collective
    problem: Exception | None = None
    adapter: Adapter | None = None
    reduction: Op | None = None
    in_place: bool | None = None
    out_shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None
    op = options.op
    try:
        spec = algorithms.spec(collective, options.algorithm)
        if op is not None:
            op = op_name(op)  # mpi4py's MPI.SUM, MAX, MIN, PROD -> their names
        adapter, reduction, in_place, dtype, out_shape = validate(options, x, out, op, comm)
        if reduction is not None and not adapter.device:
            kernels.tested(dtype)  # its compiled reductions checked against NumPy's, once
    except (TypeError, ValueError) as error:
        error = type(error)(f"{caller}: {error}")
        if not check:
            raise error from None
        problem, adapter = error, None
        if not isinstance(op, str):  # an op refused (MPI.LAND, not an op at all): unknown, as the row says
            op = None
        try:  # the Spec only names the call in the flight record now: the agreement will raise
            spec = algorithms.spec(collective, options.algorithm)
        except ValueError:
            spec = algorithms.spec(collective, "ring")
    state = state_of(comm, timeout)
    channel = state.channel(NUMPY if adapter is None else adapter)
    state.agreement.settings = channel.config  # what a settings mismatch names
    exact_path = False
    if adapter is not None and dtype is not None:
        try:
            count = adapter.size(x)
            if options.reproducible:  # ---- reproducible sums: hpcring/exact.py ----
                from . import exact

                exact_path = exact.check(op, dtype, accumulated=parts is not None)
            if options.wire is not None:  # ---- wire compression: hpcring/wire.py ----
                from . import wire as wires  # here: only wire= needs it

                narrowed = wires.check(options.wire, dtype, spec, options.reproducible, bool(adapter.device))
                if narrowed is not None:
                    channel = wires.channel(channel, narrowed)
            if spec.refuses is not None and (refusal := spec.refuses(adapter)):
                raise TypeError(refusal)
            if spec.choose is not None:  # auto, where it has chosen for this size already
                placed = bool(in_place) and collective == ALLREDUCE
                name = _chosen(spec, channel, count * dtype.itemsize, placed)
                if name is not None:
                    spec = algorithms.spec(collective, name)
            check_memory(options, channel, spec, count, dtype, exact_path, parts is not None)
        except (MemoryError, TypeError, ValueError) as error:
            error = type(error)(f"{caller}: {error}")
            if not check:
                raise error from None
            problem = error
    row = Row(
        collective=collective,
        count=None if adapter is None else adapter.size(x),
        dtype=dtype if adapter is not None else None,
        op=None if op is None else op + REPRODUCIBLE if options.reproducible else op,
        algorithm=options.algorithm,
        array=None if adapter is None else adapter.type_name,
        placement=in_place if collective == ALLREDUCE else None,  # what MPI_IN_PLACE asks to agree
        root=options.root if isinstance(options.root, int) else -1,
        settings=channel.config.digest(),
        wire=options.wire if isinstance(options.wire, str) else None,
    )
    made = Call(options, state, channel, adapter or NUMPY, spec, row, reduction, in_place, out_shape)
    if spec.choose is None or spec.name != options.algorithm:  # a Spec chosen already: what runs
        made.settled, made.ran = True, spec.name
    made.exact, made.parts = exact_path, parts
    if made.settled:
        made.fuse = made.fusion()
    return made, problem


def _chosen(spec: Spec, channel: Channel, nbytes: int, in_place: bool) -> str | None:
    """auto's choice for a size on this channel where a call has made it (local: no communication)."""
    return channel.cached(choice_key(spec.collective, nbytes, in_place))


def _allocate(shape: tuple[int, ...], x: Any) -> np.ndarray:
    """A warm reduce-scatter's or all-gather's result in C where no out= is given: the NumPy
    adapter's own (`NumPyAdapter.allocate`)."""
    return NUMPY.allocate(x, shape)[0]


# Per collective, from the adapter and the call: whether a warm call of the same key can run on
# (x, out) as it is, without the full path's validation.
_READY: dict[str, Callable[[Adapter, Call], Callable[[Any, Any], bool]]] = {
    ALLREDUCE: lambda adapter, made: adapter.ready,
    BROADCAST: lambda adapter, made: lambda x, out: out is None and adapter.ready(x, None),
}


def _ready_gathered(adapter: Adapter, made: Call) -> Callable[[Any, Any], bool]:
    """reduce_scatter and allgather: ``x`` contiguous on this rank's device (it is only read), and
    ``out`` absent (a new one is made) or one the full path's own check (`_output`) takes as this
    call was made: apart from x, or in place (an FSDP step passes its own each time). An
    all-to-all's out= is its own `exchange` call's question."""
    collective, channel, count = made.options.collective, made.channel, made.row.count
    own = None  # reduce_scatter: this rank's part of x, as validate cuts it
    if collective == REDUCE_SCATTER and count is not None and count >= 0:  # a count, not a marker
        own = segment(count, channel.size, channel.rank)
    # auto: warm while its channel still holds the choice this call runs (the channel keeps a few
    # schedules; one dropped is chosen again from the table, as the full path then does)
    try:
        spec = algorithms.spec(collective, made.options.algorithm)
    except ValueError:  # a bad algorithm: its call is never warm
        spec = None
    chooser = spec is not None and spec.choose is not None
    nbytes = 0 if count is None or made.row.dtype is None else count * made.row.dtype.itemsize

    def ready(x: Any, out: Any) -> bool:
        if chooser and _chosen(spec, channel, nbytes, False) != made.ran:
            return False
        try:
            adapter.check_device(x, "x")
            if not adapter.flags(x).c_contiguous:
                return False
            if out is None:
                return True
            dtype = adapter.dtype(x)
            if own is not None:
                in_place = _output(adapter, x, out, (own[1] - own[0],), dtype, own)
            elif collective == ALLGATHER:
                shape = (channel.size, *adapter.shape(x))
                in_place = _output(adapter, x, out, shape, dtype, None, channel.rank * adapter.size(x))
            else:
                return False
        except (TypeError, ValueError):  # an out the full path refuses: it says why there
            return False
        return in_place == made.in_place

    return ready


_READY[REDUCE_SCATTER] = _READY[ALLGATHER] = _READY[ALLTOALL] = _ready_gathered  # (all-to-all: out=None)


# ---- validation: one place, through the adapter ----------------------------------------------


def validate(
    options: Options, x: Any, out: Any, op: str | None, comm: MPI.Intracomm
) -> tuple[Adapter, Op | None, bool, np.dtype, tuple[int, ...] | None]:
    """Local checks, no communication: (adapter, op, in place, x's dtype, the shape of the output
    the call makes where no out= is given) or TypeError/ValueError (the caller adds its name).

    Every question about ``x`` and ``out`` goes to the adapter that owns ``x``."""
    collective = options.collective
    adapter = adapter_for(x)
    dtype = adapter.dtype(x)
    if not supported(dtype):
        names = ", ".join(DTYPE_NAMES)
        raise TypeError(f"dtype {dtype} is not supported; use one of {names}")
    reduction = None
    if collective in (ALLREDUCE, REDUCE_SCATTER):
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; choose one of {', '.join(OPS)}")
        reduction = OPS[op]
        check_op(reduction, dtype)
    if collective == BROADCAST:
        root = options.root
        if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < comm.Get_size():
            raise ValueError(
                f"root must be a rank of the communicator, 0 to {comm.Get_size() - 1}; got {root!r}"
            )
    flags = adapter.flags(x)
    if not flags.c_contiguous:
        fix = getattr(adapter, "contiguous_fix", "xp.ascontiguousarray(x)")
        raise ValueError(
            f"x must be C-contiguous (pass {fix}, and copy the result back where it is in place)"
        )
    adapter.check_device(x, "x")
    size, rank, shape, count = comm.Get_size(), comm.Get_rank(), adapter.shape(x), adapter.size(x)
    if collective in (ALLREDUCE, BROADCAST):
        if collective == BROADCAST and out is not None:
            raise TypeError("broadcast works in place: it takes no out=")
        in_place = _in_place(adapter, x, out, shape, dtype, flags)
        return adapter, reduction, in_place, dtype, None
    if collective == REDUCE_SCATTER:
        start, stop = segment(count, size, rank)
        made: tuple[int, ...] = (stop - start,)
        in_place = _output(adapter, x, out, made, dtype, own=(start, stop))
    else:
        made = (size, *shape)
        in_place = _output(adapter, x, out, made, dtype, own=None, row=rank * count)
    return adapter, reduction, in_place, dtype, made if out is None else None


def _in_place(adapter: Adapter, x: Any, out: Any, shape: Any, dtype: np.dtype, flags: Any) -> bool:
    """Whether an all-reduce (or a broadcast) writes ``x`` itself; raises for an ``out`` it cannot take."""
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
            raise ValueError("x is read-only; pass out= for an out-of-place result")
        return True
    if not owned:
        raise TypeError(
            f"out must be a {type(x).__module__}.{type(x).__name__} like x, "
            f"got {type(out).__module__}.{type(out).__name__}"
        )
    out_shape, out_dtype = adapter.shape(out), adapter.dtype(out)
    if out_shape != shape or out_dtype != dtype:
        raise ValueError(
            f"out must have x's shape {shape} and dtype {dtype}, got {out_shape} and {out_dtype}"
        )
    _writable_output(adapter, out)
    if overlaps:
        raise ValueError("out overlaps x; pass out=None (or out=x) for in place")
    return False


def _output(
    adapter: Adapter,
    x: Any,
    out: Any,
    shape: tuple[int, ...],
    dtype: np.dtype,
    own: tuple[int, int] | None,
    row: int = 0,
) -> bool:
    """Whether a reduce-scatter (``own``: this rank's part of x) or an all-gather (x is the row
    starting at element ``row`` of out) runs in place; raises for an ``out`` it cannot take."""
    if out is None:
        return False
    if not adapter.owns(out):
        raise TypeError(
            f"out must be a {type(x).__module__}.{type(x).__name__} like x, "
            f"got {type(out).__module__}.{type(out).__name__}"
        )
    out_shape, out_dtype = adapter.shape(out), adapter.dtype(out)
    count = math.prod(shape)
    if adapter.size(out) != count or out_dtype != dtype or (own is None and out_shape != shape):
        want = f"{count} elements" if own is not None else f"shape {shape}"
        raise ValueError(f"out must have {want} and dtype {dtype}, got shape {out_shape} and {out_dtype}")
    _writable_output(adapter, out)
    if not adapter.shares_memory(x, out):
        return False
    flat_x, flat_out = adapter.flat(x), adapter.flat(out)
    if own is not None and algorithms.base.same_memory(flat_out, flat_x[own[0] : own[1]]):
        return True  # out is x's own part: in place (x's other parts are then scratch)
    if own is None and algorithms.base.same_memory(flat_x, flat_out[row : row + flat_x.size]):
        return True  # x is this rank's row of out: in place
    raise ValueError("out overlaps x other than as " + ("x's own part" if own else "x's row of out"))


def _writable_output(adapter: Adapter, out: Any) -> None:
    flags = adapter.flags(out)
    if not flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    adapter.check_device(out, "out")
    if not flags.writeable:
        raise ValueError("out is read-only")


# ---- the memory guard ------------------------------------------------------------------------


def check_memory(
    options: Options,
    channel: Channel,
    spec: Spec,
    count: int,
    dtype: np.dtype,
    exact_path: bool = False,
    accumulated: bool = False,
) -> None:
    """MemoryError, before anything is allocated, when the call's scratch cannot fit.

    The limit is the memory the adapter still has (HPCRING_MEMORY_LIMIT caps it, for a job that
    shares its node or device with other work). A chooser (auto) not yet chosen for this size
    is priced as its untuned default."""
    size, rank, itemsize = channel.size, channel.rank, dtype.itemsize
    priced = algorithms.priced(spec, count, itemsize, size)

    def scratch_of(n: int, nbytes: int) -> int:
        return priced.scratch_bytes(n, nbytes, size, rank) if priced.scratch_bytes else 0

    scratch = scratch_of(count, itemsize)
    if exact_path:
        from . import exact

        scratch = exact.scratch_bytes(channel, dtype, count, scratch_of, accumulated)
    need = scratch - channel.scratch_held()
    pool = 0
    if channel.wire is not None:  # wire=: its pool holds about one narrowed copy in flight
        from . import wire as wires

        pool = max(wires.pool_bytes(count, channel.wire) - channel.pool_held(), 0)
        need = max(need, 0) + pool
    if need <= 0:
        return
    available = channel.adapter.available_bytes()
    limit = config.current().memory_limit
    if limit is not None:
        available = limit if available is None else min(available, limit)
    if available is None or need <= available:
        return
    ring = algorithms.spec(options.collective, "ring")
    least = ring.scratch_bytes(count, itemsize, size, rank) if ring.scratch_bytes else 0
    name, have = options.algorithm, format_bytes(available)
    if exact_path:
        raise MemoryError(
            f"reproducible=True with algorithm {name!r} needs {format_bytes(need)} more scratch on rank "
            f"{rank} for {count} elements (its integer words: {exact.WORD_BYTES[itemsize]} bytes per "
            f"element), but only {have} is available; without reproducible=True, algorithm='ring' "
            f"needs {format_bytes(least)}"
        )
    if pool:
        raise MemoryError(
            f"algorithm {name!r} with wire={channel.wire.name!r} needs {format_bytes(need)} more on "
            f"rank {rank} for {count} elements (scratch, and {format_bytes(pool)} of wire buffers), but "
            f"only {have} is available; without wire=, algorithm='ring' needs {format_bytes(least)}"
        )
    raise MemoryError(
        f"algorithm {name!r} needs {format_bytes(need)} more scratch on rank {rank} for {count} "
        f"elements on {size} ranks, but only {have} is available; algorithm='ring' needs "
        f"{format_bytes(least)}"
    )


# ---- timeouts and thread levels ----------------------------------------------------------------


def default_timeout() -> float:
    """Seconds to wait for every rank to arrive: HPCRING_TIMEOUT, else 300; 0 waits forever."""
    return config.current().timeout


def resolve_timeout(state: CommState, timeout: float | None) -> float:
    """The timeout of one run on ``state``'s communicator: ``timeout``, else HPCRING_TIMEOUT as
    the communicator took it (a bad value raises, on every rank alike)."""
    if timeout is not None:
        return timeout
    return state.timeout if state.timeout is not None else default_timeout()


_level: list[int] = []  # MPI's thread level, fixed once MPI is initialized


def _thread_level() -> int:
    if not _level:
        _level.append(MPI.Query_thread())
    return _level[0]


def _offset_inside(part: np.ndarray, whole: np.ndarray) -> int | None:
    """The byte offset of ``part`` inside ``whole`` (a reduce-scatter's own part), or None: apart."""
    a, b = part.__array_interface__["data"][0], whole.__array_interface__["data"][0]
    return a - b if b <= a and a + part.nbytes <= b + whole.nbytes and part.nbytes > 0 else None


python_call = call  # the Python call, behind the compiled core's front door below where that runs
_NAMES = call.__code__.co_varnames[: call.__code__.co_argcount]
ARGUMENTS = _NAMES[:-1]  # call's, but ``parts``, in order
_DEFAULTS = dict(zip(_NAMES[-len(call.__defaults__) :], call.__defaults__, strict=True))


def front(function: Callable[..., Any], collective: str, **given: Any) -> Callable[..., Any]:
    """``function``, a front end that hands x and its keywords on to `call` by name (``collective``
    first, ``given`` for what it does not take, `call`'s defaults after), behind the compiled
    core's front door where it runs (`hpcring.core.front`: a warm NumPy call enters C without
    the function's Python frame); else ``function`` itself."""
    keywords = function.__kwdefaults__ or {}
    if not set(keywords) <= set(ARGUMENTS):
        return function
    values = {**_DEFAULTS, **keywords, **given, "collective": collective, "x": None}
    arguments = tuple(values[name] for name in ARGUMENTS)
    return core.front(function, arguments, tuple((name, ARGUMENTS.index(name)) for name in keywords))


# What the front ends call: `call`, with its warm NumPy calls run in C in front of it where the
# compiled core runs (`hpcring.core.caller`); `call` itself where it does not.
call = core.caller(call)

__all__ = [
    "EXCHANGING",
    "FORMS",
    "WARM_CALLS",
    "Call",
    "Options",
    "call",
    "check_memory",
    "default_timeout",
    "first",
    "prepare",
    "resolve_timeout",
]
