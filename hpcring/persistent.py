"""Persistent calls: `hpcring.plan` validates and agrees once, then runs again and again.

An inner loop that all-reduces the same buffers every iteration (a solver's residual, a
training step's bucket) pays the checks once, when the plan is made: the ranks agree on
the call then, as `hpcring.allreduce` does before every call, and each run moves data
only. With `mpi` a small plan runs through one node's shared memory (`shared_plan`) or the
agreement's exchange without its header (`Pair` on two ranks, `Steps` on three or four), and
any other holds MPI-4's persistent all-reduce (``MPI_Allreduce_init``) on the buffers, started
and waited for as MPI starts and waits it; every wait is bounded by the timeout, so a rank that
never starts its plan becomes a `StallError` on the others.
hpcring's own algorithms run their prebuilt schedules: each start is the engine's call
without the agreement (its exclusion, flight record and bounded waits included).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import numpy as np
from mpi4py import MPI

from . import core, engine, kernels, polling, ulfm
from .agreement import (
    GIVE,
    NO_PAYLOAD,
    RESULT,
    SWAP,
    TAKE,
    Both,
    combine_payload,
    exchanges,
    payload_descriptor,
    steps,
)
from .algorithms import ALLREDUCE
from .arrays import NUMPY
from .comm import intracomm
from .engine import Call, Options, prepare, resolve_timeout
from .ulfm import rank_failed

PAIR_TAGS = 32100, 668  # a two-rank plan's tag: the first, and how many (by the plan's agreed call number)

# A plan whose ranks share one node's memory, of up to SHARED_BYTES, all-reduces through a
# shared-memory segment where the compiled core runs (`shared_plan`; hpcring/_c/shared.h): each
# rank writes its input and a run number, and reduces every rank's input in rank order, with no
# message. Every rank reads the others' inputs whole, G - 1 of them, so past SHARED_BYTES it
# pays no more. 2 ranks, float32, input written before each run, in place: 0.83x the bare
# MPI_Allreduce's time at 8 B, 0.44x at 4 KiB, 0.69x at 64 KiB (docs/embedding.md); past it
# 1.21x at 256 KiB, 1.05x at 1 MiB, 1.22x at 4 MiB.
SHARED_BYTES = 64 << 10
SHARED_RANKS = 8


# In place, a two-rank plan of more than this many bytes exchanges halves (`Pair`'s ``halves``).
# Writing the buffer just sent costs here what the exchange does: the other rank has just read
# it, and each cache line written goes back to this core. 2 ranks, written before each run, us:
# the whole buffer sent, then summed into it: 8.3 at 16 KiB, 26 at 32 KiB, 54 at 64 KiB; bare
# MPI_Allreduce in place 8.2, 9.4-11.7, 14.0-14.4 (Open MPI's ring there: halves).
PAIR_WHOLE_IN_PLACE = 16 << 10


class Pair:
    """A two-rank plan of an `mpi` all-reduce of up to `hpcring.agreement.PAIR_SLOT` bytes
    (`hpcring.agreement.slot_bytes`, planned): a persistent send of the input and receive of the other's,
    and the agreement's own op applied here (bitwise commutative: both ranks get the same bits,
    the bits a checked call gets). Under Open MPI 5 the persistent all-reduce cost 1.1-1.2x the
    blocking call at 8 B-4 KiB on two ranks; this one message each way costs less.

    ``halves`` (in place, above `PAIR_WHOLE_IN_PLACE`): rank 0 owns the first half, rank 1 the
    rest; each sends the other's half, combines its own with what came, then the two send their
    results. No rank writes a part the other has just read."""

    def __init__(
        self,
        comm: MPI.Intracomm,
        src: Any,
        dst: Any,
        descriptor: tuple[int, int, int],
        tag: int,
        halves: bool = False,
    ) -> None:
        self.src, self.dst, self.descriptor = src, dst, descriptor
        peer = 1 - comm.Get_rank()
        self.halves = halves
        if not halves:
            self.scratch = np.empty(src.nbytes, np.uint8)
            self.requests = [
                comm.Recv_init([self.scratch, MPI.BYTE], peer, tag),
                comm.Send_init([src, MPI.BYTE], peer, tag),
            ]
            self._both = Both(*self.requests)
            return
        mine, theirs = self.parts(src.nbytes, src.itemsize, comm.Get_rank())
        self.mine = mine
        self.scratch = np.empty(mine.stop - mine.start, np.uint8)
        data = dst.view(np.uint8)
        # the same tag both times: MPI matches one sender's messages of one tag in order
        self.requests = [
            comm.Recv_init([self.scratch, MPI.BYTE], peer, tag),
            comm.Send_init([data[theirs], MPI.BYTE], peer, tag),
            comm.Recv_init([data[theirs], MPI.BYTE], peer, tag),
            comm.Send_init([data[mine], MPI.BYTE], peer, tag),
        ]
        self._both = Both(*self.requests[:2])
        self._second = False  # the results' exchange is started

    @staticmethod
    def parts(nbytes: int, itemsize: int, rank: int) -> tuple[slice, slice]:
        """(this rank's half, the other's) in bytes: rank 0 the first half of the elements, rank 1
        the rest (core.c's pair_half splits alike)."""
        half = nbytes // itemsize // 2 * itemsize
        first, second = slice(0, half), slice(half, nbytes)
        return (first, second) if rank == 0 else (second, first)

    @property
    def program(self) -> tuple[Any, ...]:
        """What the compiled plan runs (`hpcring.engine.Call.planned`): (receive, send, scratch)
        and, halved, the results' (receive, send)."""
        return (*self.requests[:2], self.scratch, *self.requests[2:])

    def Start(self) -> None:  # MPI.Prequest's names, which the plan and its waits call
        MPI.Prequest.Startall(self.requests[:2])
        if self.halves:
            self._second = False
            self._both = Both(*self.requests[:2])

    def Test(self) -> bool:
        if not self._both.Test():
            return False
        if not self.halves or self._second:
            return True
        self._combine(self.mine)  # this rank's half is final: send it, take the other's
        self._second = True
        MPI.Prequest.Startall(self.requests[2:])
        self._both = Both(*self.requests[2:])
        return self._both.Test()

    def Free(self) -> None:
        for request in self.requests:
            request.Free()

    def finish(self) -> None:
        """The result, once both requests are done: this rank's input (op) the other's (halved:
        done as the halves came)."""
        if not self.halves:
            if self.dst is not self.src:
                self.dst.view(np.uint8)[...] = self.src.view(np.uint8)
            self._combine(slice(0, self.src.nbytes))

    def _combine(self, part: slice) -> None:
        _combine_into(self.descriptor, self.scratch, self.dst.view(np.uint8)[part])


def _combine_into(descriptor: tuple[int, int, int], theirs: np.ndarray, into: np.ndarray) -> None:
    """``into`` (bytes) combined with ``theirs`` (bytes) by a payload's op (``descriptor``): the
    agreement's op, bitwise commutative, so every rank that combines the same two gets the same bits."""
    code, op, _ = descriptor
    dtype = kernels.DTYPES[code]
    combine_payload(code, op, theirs.view(dtype), into.view(dtype))


# A plan of 3 or 4 ranks (`hpcring.agreement.exchanges`) of up to this many bytes runs `Steps`;
# a larger one MPI's persistent all-reduce. Every step's message stays short, where MPI's own
# all-reduce takes the same tree of blocking messages. 4 ranks on 2 cores, MPI calls from C,
# medians of 9 passes of 500 runs: 8 B, the bare MPI_Allreduce 4.3-5.7 us, Steps' tree 0.93-1.11x
# of it, MPI's persistent all-reduce (started, then tested) 1.7-1.8x (in other runs, where the
# bare call took 6.4-6.9 us, 0.95-1.09x and 1.0-1.1x); 512 B: 0.94-1.02x and 1.05-1.06x; from
# 2 KiB the persistent all-reduce did as well (0.86-1.12x, the tree 1.01-1.06x).
STEPS_BYTES = 1 << 10


class Steps:
    """A plan of 3 or 4 ranks of an `mpi` all-reduce of up to `STEPS_BYTES`: the agreement's
    exchange without its header (`hpcring.agreement.steps`: recursive doubling, the third of three
    ranks folding in first and getting the result last), each step's receive and send posted
    afresh, and the agreement's op applied here (bitwise commutative: every rank gets the same
    bits, the bits a checked call gets). Its results accumulate in ``dst``. The compiled core runs
    the same steps (core.c's ``run_steps``, from `program`), so ranks on either path meet."""

    def __init__(
        self, comm: MPI.Intracomm, src: Any, dst: Any, descriptor: tuple[int, int, int], tag: int
    ) -> None:
        self.comm, self.tag, self.descriptor = comm, tag, descriptor
        self.src, self.dst = src.view(np.uint8), dst.view(np.uint8)
        self.steps = steps(comm.Get_rank(), comm.Get_size())
        self.scratch = np.empty(src.nbytes, np.uint8)  # what a step receives to combine
        self._at = len(self.steps)  # the step under way (all done: none)
        self._current = self.src  # this rank's contribution so far
        self._both = Both()

    @property
    def program(self) -> tuple[Any, ...]:
        """What the compiled plan runs (`hpcring.engine.Call.planned`): (scratch, tag)."""
        return (self.scratch, self.tag)

    def Start(self) -> None:  # MPI.Prequest's names, which the plan and its waits call
        self._at, self._current = 0, self.src
        self._post()

    def _post(self) -> None:
        kind, peer = self.steps[self._at]
        recv = send = MPI.REQUEST_NULL
        if kind != GIVE:
            into = self.dst if kind == RESULT else self.scratch
            recv = self.comm.Irecv([into, MPI.BYTE], peer, self.tag)
        if kind in (GIVE, SWAP):
            send = self.comm.Isend([self._current, MPI.BYTE], peer, self.tag)
        self._both = Both(recv, send)

    def Test(self) -> bool:
        while self._at < len(self.steps):
            if not self._both.Test():
                return False
            kind, _ = self.steps[self._at]
            if kind in (TAKE, SWAP):  # into dst: what came (op) this rank's so far
                if self._current is not self.dst:
                    self.dst[...] = self._current
                _combine_into(self.descriptor, self.scratch, self.dst)
                self._current = self.dst
            elif kind == RESULT:
                self._current = self.dst
            self._at += 1
            if self._at < len(self.steps):
                self._post()
        return True

    def Free(self) -> None:
        """Nothing persistent to free: each step's requests end with it."""

    def finish(self) -> None:
        """The result is in ``dst`` once the last step is done."""


def shared_plan(call: Call, src: np.ndarray, dst: np.ndarray) -> Any:
    """The plan's all-reduce through shared memory (hpcring._core.Shared), where every rank of the
    plan can take it; else None, on every rank alike. Collective: every rank of an agreed plan is
    here. What the ranks agree on decides first (rank count, payload, one node: the topology is
    collective the first time); then rank 0 makes the segment, the others open it, and all of
    them say whether they can: the compiled core loaded; no ULFM launch (a rank that dies must
    become MPI's error, which a wait on memory never sees); and every rank with a core of its
    own (`polling.shared` off). Where ranks outnumber cores, measured with 4 ranks on 2 cores:
    spinning waits took a scheduler tick, about 2 ms a run; yielding ones did well alone (a step
    loop of 192 B beside a busy process: 0.34 ms a step, the checked call 0.36), but with the
    code's MPI_Allgather in each step they took 1.45-1.85 ms, by messages 0.75-0.77, the checked
    call 0.43-0.46 (and holding every rank until all had read the run changed nothing)."""
    channel = call.channel
    if not 2 <= channel.size <= SHARED_RANKS or call.adapter is not NUMPY or not channel.config.shared_memory:
        return None
    reduction, row = call.reduction, call.row
    if reduction is None or row.dtype is None or row.count is None:
        return None
    descriptor = payload_descriptor(row.dtype, reduction.ufunc, row.count, room=SHARED_BYTES)
    if descriptor is NO_PAYLOAD or channel.topology().nodes != 1:
        return None
    module = core.mpi_core()[0] if core.active() and not ulfm.enabled() and not polling.shared() else None
    comm, rank = call.state.comm, channel.rank
    channel.arrive("a plan's shared memory")  # every rank is here: the next collectives are bounded
    segment: Any = None
    name = None
    if rank == 0 and module is not None:
        with contextlib.suppress(OSError, ValueError):  # no segment here, or arrays it refuses
            segment = module.Shared(None, True, channel.size, rank, src, dst, *descriptor)
            name = segment.name
    name = comm.bcast(name, root=0)
    if rank != 0 and module is not None and name is not None:
        with contextlib.suppress(OSError, ValueError):
            segment = module.Shared(name, False, channel.size, rank, src, dst, *descriptor)
    every = comm.allreduce(segment is not None, op=MPI.LAND)
    if rank == 0 and segment is not None:
        segment.unlink()  # every rank holds it open (or none will): the name is not needed
    if not every:
        if segment is not None:
            segment.Free()
        return None
    return segment


class Plan:
    """One all-reduce on fixed buffers, made by `hpcring.plan`: call it (or start, then wait)."""

    def __init__(
        self, call: Call, x: Any, out: Any, timeout: float | None, comm: MPI.Intracomm, op: str | MPI.Op
    ) -> None:
        self._call, self._x, self._out, self._timeout = call, x, out, timeout
        self.algorithm = call.ran  # what runs (`auto`'s choice)
        self._where = self._buffers()  # what the buffers were: a plan on changed ones is refused
        self._request: Any = None  # an MPI.Prequest, a Pair, or a Shared (`shared_plan`)
        self._started = self._freed = False
        self._active = False  # the persistent request is started and not yet seen complete
        adapter, spec = call.adapter, call.spec
        if spec.persistent is not None and call.channel.size > 1 and adapter.size(x) > 0:
            src = adapter.flat(x)
            dst = src if call.in_place else adapter.flat(out)
            size = call.channel.size
            stepped = size == 2 or exchanges(size, call.state.exchange_ranks)
            paired = call.fusion(planned=True) if stepped else NO_PAYLOAD
            if size > 2 and adapter.nbytes(x) > STEPS_BYTES:
                paired = NO_PAYLOAD
            shared = shared_plan(call, src, dst) if spec.rides else None
            if shared is not None:
                self._request = shared
            elif paired is not NO_PAYLOAD and adapter is NUMPY:
                # the tag from the plan's agreed call number: the same on every rank
                tag = PAIR_TAGS[0] + call.state.calls % PAIR_TAGS[1]
                halves = call.in_place and adapter.nbytes(x) > PAIR_WHOLE_IN_PLACE
                if size == 2:
                    self._request = Pair(call.state.comm, src, dst, paired, tag, halves)
                else:
                    self._request = Steps(call.state.comm, src, dst, paired, tag)
            else:
                self._request = spec.persistent(call.channel, src, dst, call.reduction)
        # p() on NumPy arrays, where the compiled core runs: with a persistent request (`mpi`), its
        # start and bounded wait in C; on hpcring's own algorithms the engine's warm call without
        # the agreement, run in C from its second time on (start() and the Python path are a few
        # frames of Python more per run).
        self._whole: Any = None
        if self._request is not None:
            self._whole = call.planned(x, out, self._request, op, timeout)
        elif adapter is NUMPY and core.active():
            args = (ALLREDUCE, x, out, op, call.ran, comm, False, timeout, 0, False, None)
            self._whole = functools.partial(engine.call, *args)
        # What p() runs at once, with nothing to check first (None while started or freed, and
        # where the buffers may move, a torch tensor's): p() is the inner loop's call, and where
        # ranks share cores each attribute it reads before the run shows (tools/call_cost.py,
        # 4 ranks on 2 cores, 8 B in place, 8 runs each: median 1.17x the bare call through the
        # checks, 0.96x straight).
        fixed = self._request is None or adapter.fixed_memory
        self._fast = self._direct = self._whole if fixed else None

    def _buffers(self) -> tuple[Any, ...]:
        adapter, x, out = self._call.adapter, self._x, self._out
        where = (adapter.data_pointer(adapter.flat(x)), adapter.nbytes(x))
        if not self._call.in_place:
            where += (adapter.data_pointer(adapter.flat(out)), adapter.nbytes(out))
        return where

    def _refuse_moved(self) -> None:
        """ValueError where the buffers may move (a torch tensor's) and did since the plan was made."""
        if not self._call.adapter.fixed_memory and self._buffers() != self._where:
            raise ValueError("hpcring.plan: the buffers changed since the plan was made (make a new plan)")

    @property
    def persistent(self) -> bool:
        """Whether a started run proceeds while the caller computes (MPI's persistent request),
        rather than running to the end inside `start`."""
        return self._request is not None

    def __call__(self) -> Any:
        """Run the all-reduce once and return its result (``x`` in place, else ``out``)."""
        run = self._direct
        if run is None and self._whole is not None and not (self._started or self._freed):
            self._refuse_moved()  # a persistent request on buffers that may move: checked each run
            run = self._whole
        if run is None:
            self.start()
            return self.wait()
        try:
            return run()
        except BaseException:
            if self._request is not None:
                self._active = True  # the request may still be running inside MPI: `free` leaves it be
            raise

    def start(self) -> None:
        """Start the all-reduce: with a persistent request (`mpi`) it runs while the caller
        computes, until `wait`; hpcring's own algorithms run here, to the end."""
        if self._freed:
            raise RuntimeError("hpcring.plan: this plan was freed")
        if self._started:
            raise RuntimeError("hpcring.plan: started twice without a wait in between")
        self._refuse_moved()
        self._started = True
        self._direct = None  # p() takes the checked path until the wait, which refuses it
        if self._request is not None:
            self._request.Start()
            self._active = True
        else:
            out = None if self._call.in_place else self._out
            self._call(self._x, out, False, self._timeout)  # the call, without the agreement

    def wait(self) -> Any:
        """Wait for the started all-reduce and return its result; StallError where a rank does
        not take part within the timeout."""
        if not self._started:
            raise RuntimeError("hpcring.plan: wait without a start")
        self._started = False
        self._direct = None if self._freed else self._fast
        call = self._call
        if self._request is not None:
            timeout = resolve_timeout(call.state, self._timeout)
            waiter = call.state.agreement.waiter
            try:
                woke = waiter.bounded(self._request, timeout)
            except MPI.Exception as error:  # MPI's fault tolerance: a rank died (`hpcring.ulfm`)
                failure = rank_failed(call, error, call.state.calls, moving=True)
                if failure is None:
                    raise
                raise failure from error  # the request stays active: `free` leaves it be
            if woke is not None:  # the request stays active inside MPI: `free` leaves it be
                raise waiter.stall(woke, f"{call.what} plan", timeout, call.state.calls)
            self._active = False
            if isinstance(self._request, Pair | Steps):
                self._request.finish()
            if call.mean:
                dst = call.adapter.flat(self._x if call.in_place else self._out)
                call.channel.xp.true_divide(dst, call.channel.size, out=dst)
        return self._x if call.in_place else self._out

    def free(self) -> None:
        """Release the persistent request now (a plan that is garbage collected releases it too).
        A request a stall or a failed rank left active is not freed: MPI forbids freeing an
        active collective request (MPICH crashed later where it was), and cannot cancel one."""
        if not self._freed and self._request is not None and not self._active and not MPI.Is_finalized():
            self._request.Free()
        self._freed = True
        self._direct = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to free
            self.free()


def plan(
    x: Any,
    *,
    op: str | MPI.Op = "sum",
    algorithm: str = "auto",
    comm: MPI.Intracomm | None = None,
    out: Any = None,
    timeout: float | None = None,
) -> Plan:
    """An all-reduce of ``x`` (into ``out``, or in place) to run again and again: ``p()``, or
    ``p.start()`` ... ``p.wait()``. Collective: every rank makes the same plan, and the ranks
    agree on it here as `hpcring.allreduce` does before every call (a mismatch or a bad
    argument on any rank raises on every rank); each run then moves data only. Do not resize
    or reallocate the buffers while the plan lives: a plan on changed buffers is refused."""
    comm = intracomm(comm, "hpcring.plan")
    if out is x:  # in place, as hpcring.allreduce takes out=x: the same plan as out=None
        out = None
    call, problem = prepare(Options(ALLREDUCE, op, algorithm), x, out, comm, True, timeout)
    if problem is None and call.adapter.immutable:  # the kind is agreed: every rank refuses alike
        problem = TypeError("hpcring.plan: these arrays cannot be written in place; use hpcring.allreduce")
    call.agree(timeout, problem, nbytes=None if problem else call.adapter.nbytes(x))  # auto chooses
    return Plan(call, x, out, timeout, comm, op)
