"""Waiting on MPI requests: as fast as spinning on MPI_Test, yet bounded by a deadline.

A waiting rank tests its request in a loop, as MPI's own wait does (and, like it, yields the
core inside each test where the library was told ranks outnumber cores: Open MPI's
``mpi_yield_when_idle``, which ``mpiexec --oversubscribe`` sets). Blocking in ``MPI_Wait``
instead, with a watchdog to wake it at the deadline, was measured slower here: on Open MPI 5 a
non-blocking collective waited for with ``MPI_Wait`` took 3.1-144 us where the test loop took
3.3-16 us (2 ranks, 16 words). So `Waiter.wait` tests, reads the clock every few tests, looks
for other ranks' stall notices about once a millisecond, and past SPIN_FOR naps between tests:
a rank that late is milliseconds away, and a waiting rank should not hold a core that long.

A stall notice is a few int64s (`NOTICE`: who sent it, its call, the peer it waited for, where
it waited). On hpcring's private duplicate a receive stays posted for the next one. Before the
duplicate exists (the first call's ``Idup``) there is none: nothing of hpcring's travels on a
communicator the user owns, where a receive of the user's with ``MPI.ANY_TAG`` would take a
notice as data, so that wait sends and looks for none (``notices=False``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
import weakref
from collections import deque
from typing import Any

import numpy as np
from mpi4py import MPI

from . import config
from .errors import StallError
from .flight import Where, stall_detail

TAG_NOTICE = 32001  # "I stopped waiting": a stall notice; the algorithms use small tags
SPIN_FOR = 0.02  # seconds of testing without a pause: a rank 3 ms late is seen at once
NAP = 2e-4  # seconds between tests after that
# Where cores are scarce (`sharing`): a waiting rank that spins keeps the rank it waits for off
# the core, so it tests this long, then naps between tests this long.
SHARED_SPIN_FOR = 1e-4
SHARED_NAP = 5e-5
# The launcher's count of the ranks on this node (Open MPI, MPICH's Hydra, SLURM's srun; PMIx).
_LOCAL_SIZE = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMIX_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


def sharing() -> bool:
    """Whether waits give their core away early: HPCRING_WAIT=share, or (auto) where the launcher
    says this node runs more ranks than it has cores (Open MPI's runtime says so itself,
    ``OMPI_MCA_mpi_oversubscribe``). Not where another program preempts a rank that has a core of
    its own: a yield would hand that program the core for its whole time slice."""
    policy = config.current().wait
    if policy in ("share", "spin"):
        return policy == "share"
    if os.environ.get("OMPI_MCA_mpi_oversubscribe", "").strip().lower() in ("1", "true", "yes"):  # noqa: SIM112
        return True
    for name in _LOCAL_SIZE:
        text = os.environ.get(name, "").split("(")[0].strip()  # SLURM: "4(x2)"
        if text.isdigit():
            return int(text) > (os.cpu_count() or 1)
    return False


NOTICE_EVERY = 1e-3  # seconds between looks for another rank's stall notice
GRACE = 1.0  # seconds at most a rank that stopped waiting listens for the others' notices
SETTLE = 0.2  # seconds a rank woken by a notice listens for the last unheard rank (`Waiter.missing`)

NOTICE = 4  # int64s in a notice: rank, call number, peer waited for (-1: all), where


_SHARING = [False]  # `sharing()`, as `share` last set it (the compiled core's waits follow it too)


def share(on: bool | None = None) -> bool:
    """Set whether waits give their core away early (None: `sharing()`), here and in the
    compiled core; returns the setting."""
    _SHARING[0] = sharing() if on is None else on
    for listener in SHARING_LISTENERS:
        listener(_SHARING[0])
    return _SHARING[0]


def shared() -> bool:
    """Whether waits give their core away early now (as `share` last set it)."""
    return _SHARING[0]


SHARING_LISTENERS: list[Any] = []  # the compiled core's `waiting`, where it loaded


_POSTED: weakref.WeakSet[Waiter] = weakref.WeakSet()  # waiters that posted a notice receive
_AT_EXIT: list[Any] = []  # the exit handler that closes them, once registered


def _close_at_exit(waiter: Waiter) -> None:
    """Close ``waiter`` at interpreter exit, before mpi4py's MPI_Finalize (which runs after
    Python's atexit, too late for Python callbacks): a communicator never freed (COMM_WORLD's
    duplicate) kept its notice receive posted to the end, and MPICH over UCX printed a warning
    on stdout for each."""
    if not _AT_EXIT:
        _AT_EXIT.append(atexit.register(lambda: [w.close() for w in list(_POSTED)]))
    _POSTED.add(waiter)


# Communicators on which a wait of this process gave up (by handle). Messages sent on them may
# never be received: a rank that skipped a call leaves the others' data and stall notices queued
# at it. MPICH gives a freed communicator's context id to the next communicator it makes, and a
# message still queued under that id is then received there: a stall notice raises a StallError
# in a healthy call, a data message is taken as data. A communicator stays unusable for a new one
# while any of its ranks holds it, so the ranks that gave up on it keep it (`free`).
_GAVE_UP: set[int] = set()


def gave_up(comm: MPI.Comm) -> None:
    """Note that a wait on ``comm`` gave up: `free` keeps it."""
    _GAVE_UP.add(MPI._handleof(comm))


def free(comm: MPI.Comm) -> bool:
    """Free ``comm`` (one hpcring made), unless a wait on it gave up: that one is kept for the
    rest of the process (`_GAVE_UP`). Whether it was freed."""
    if MPI._handleof(comm) in _GAVE_UP:
        return False
    comm.Free()
    return True


def idle_barrier(comm: Any) -> None:
    """A barrier that sleeps between polls: ranks waiting here leave the cores to those at work."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.0005)


class Waiter:
    """Deadline-bounded waits on one communicator, cut short by other ranks' stall notices.

    ``notices=False`` (a communicator hpcring does not own: the user's, before hpcring has its
    duplicate): nothing is sent on it and nothing looked for; a wait ends at its deadline."""

    def __init__(self, comm: MPI.Intracomm, notices: bool = True) -> None:
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.notices = notices
        self.tag = TAG_NOTICE
        self._incoming = np.zeros(NOTICE, dtype=np.int64)
        self._notice: MPI.Request | None = None  # the receive posted for the next notice
        self._sent: list[Any] = []  # notices in flight, and their buffers, kept alive
        self.heard: dict[int, list[int]] = {}  # rank -> its notice, as received
        self.flight: Any = None  # the communicator's flight recorder, where there is one

    def _arrived(self) -> bool:
        """Whether a notice came in (it is then in ``_incoming``)."""
        if not self.notices:
            return False
        if self._notice is None:
            self._notice = self.comm.Irecv(self._incoming, MPI.ANY_SOURCE, self.tag)
            _close_at_exit(self)
        if not self._notice.Test():
            return False
        self._notice = None  # posted again at the next look
        return True

    def _take_notice(self) -> int:
        """The rank whose notice just came in, its payload kept in ``heard``."""
        words = self._incoming.tolist()
        self.heard[words[0]] = words
        return words[0]

    def wait(self, request: MPI.Request, deadline: float | None) -> int | None:
        """Wait for ``request``. None once it completes; otherwise the rank that ended the wait:
        this one at ``deadline`` (None: never), or another that sent a stall notice."""
        test = request.Test
        for _ in range(64):
            if test():
                return None
        spin_for, nap = (SHARED_SPIN_FOR, SHARED_NAP) if _SHARING[0] else (SPIN_FOR, NAP)
        start = looked = time.monotonic()
        while True:
            for _ in range(16):
                if test():
                    return None
            now = time.monotonic()
            if deadline is not None:
                if now > deadline:
                    return self.rank
                if now - looked > NOTICE_EVERY:
                    looked = now
                    if self._arrived():
                        return self._take_notice()
            if now - start > spin_for:
                time.sleep(nap)

    def bounded(self, request: MPI.Request, timeout: float | None) -> int | None:
        """`wait` for at most ``timeout`` seconds from now (None or 0: no limit); the clock is
        read only once the first tests failed, so a request already done costs one test."""
        if request.Test():
            return None
        return self.wait(request, time.monotonic() + timeout if timeout else None)

    def close(self) -> None:
        """Cancel the receive posted for notices, so that freeing the communicator leaves no
        operation pending on it."""
        notice, self._notice = self._notice, None
        if notice is not None and not MPI.Is_finalized():
            with contextlib.suppress(MPI.Exception):  # a revoked communicator (a rank died): gone too
                notice.Cancel()
                notice.Wait()

    def notify_all(self, call: int = -1, peer: int = -1, where: int = Where.AGREEMENT) -> None:
        """Tell every other rank that this one stopped waiting (tiny messages, sent eagerly)."""
        gave_up(self.comm)  # from here on a message may travel that no rank receives
        if not self.notices:
            return
        word = np.array([self.rank, call, peer, where], dtype=np.int64)
        self._sent.append(word)
        for r in range(self.size):
            if r != self.rank:
                self._sent.append(self.comm.Isend(word, r, self.tag))

    def listen(self, seconds: float, heard: set[int], enough: int, settle: float) -> set[int]:
        """Collect other ranks' notices for up to ``seconds``, until every rank is heard, or
        until ``enough`` ranks are heard and ``settle`` seconds have passed."""
        now = time.monotonic()
        end, settled = now + seconds, now + settle
        heard |= set(self.heard)
        while self.notices and len(heard) < self.size and time.monotonic() < end:
            if len(heard) >= enough and time.monotonic() >= settled:
                break
            if self._arrived():
                heard.add(self._take_notice())
            else:
                time.sleep(1e-3)
        return heard

    def missing(self, woke: int, call: int = -1, peer: int = -1, where: int = Where.AGREEMENT) -> list[int]:
        """The slow path of a stall: tell every other rank, listen GRACE seconds for theirs, and
        return the ranks not heard from (this rank itself where every other one was heard: it
        is the one that arrived after the others had given up).

        Once a single rank is left unheard it is the missing one: the call did not complete,
        so some rank is not in it, and every rank that waits (in this call or another) answers
        a notice within milliseconds. A rank whose own deadline ended the wait stops there. A
        rank woken by a notice listens SETTLE seconds more, since it may be the late one: then
        every other rank gave up before it came, their notices are all on their way, and it
        names itself."""
        self.notify_all(call, peer, where)
        own = woke == self.rank
        heard = self.listen(GRACE, {self.rank, woke}, self.size - 1, 0.0 if own else SETTLE)
        return sorted(set(range(self.size)) - heard) or [self.rank]

    def stall(
        self,
        woke: int,
        what: str,
        timeout: float,
        call: int = -1,
        peer: int = -1,
        where: int = Where.AGREEMENT,
    ) -> StallError:
        """The StallError for a wait that ``woke`` ended: the missing ranks, and what every heard
        rank said it was waiting for (``waiting``)."""
        missing = self.missing(woke, call, peer, where)
        if self.flight is not None:  # where every rank was, from this rank's record and the notices
            detail = stall_detail(self.flight, missing, call, self.heard)
        else:
            detail = self.describe()
            detail = f"; {detail}" if detail else ""
        error = StallError(missing, what, timeout, detail=detail)
        error.waiting = dict(self.heard)
        return error

    def describe(self) -> str:
        """What the ranks that gave up were waiting for, from their notices."""
        parts = []
        for rank, (_, call, peer, where) in sorted(self.heard.items()):
            place = Where(where).words if where in tuple(Where) else "?"
            on = f" for rank {peer}" if peer >= 0 else ""
            parts.append(f"rank {rank} waited{on} in {place}" + (f" of call {call}" if call > 0 else ""))
        return "; ".join(parts)


def cancel(request: MPI.Request) -> None:
    """Cancel a receive that will not complete (a stall): MPI may then free its buffer's use."""
    with contextlib.suppress(MPI.Exception):
        request.Cancel()


# What a stall left pending: each request an all-reduce's frames held when it raised StallError
# (a request holds its buffer). Never freed, not even as the interpreter exits: mpi4py calls
# MPI_Finalize after Python has torn its objects down, and an mpi4py request still active when
# dropped lets its buffer go while MPI keeps the operation (Open MPI crashed in MPI_Finalize,
# progressing a rendezvous send out of a freed array, after a rank frozen mid-Rabenseifner was
# woken). Only the requests are kept, not the frames: a stalled call's arrays go as usual.
ABANDONED: list[MPI.Request] = []


def abandon(error: BaseException) -> None:
    """Keep every request ``error``'s frames hold (and so its buffer) alive for good."""
    import ctypes  # here: only a stall comes this way

    tb = error.__traceback__
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            found = [value] if isinstance(value, MPI.Request) else []
            if not found and isinstance(getattr(value, "requests", None), list):  # agreement.Both
                value = value.requests
            if isinstance(value, (list, tuple, deque)):  # the ring's requests in flight
                found = [item for item in value if isinstance(item, MPI.Request)]
            for request in found:
                if request:  # not yet MPI_REQUEST_NULL: MPI may still use its buffer
                    ABANDONED.append(request)
                    ctypes.pythonapi.Py_IncRef(ctypes.py_object(request))  # outlives the teardown
        tb = tb.tb_next


def arrive(waiter: Waiter, timeout: float | None, what: str, call: int = -1) -> None:
    """A bounded barrier before a collective that has no non-blocking form or takes a Python
    object (a split, a broadcast of a table): every rank is known to be there, or StallError."""
    woke = waiter.bounded(waiter.comm.Ibarrier(), timeout)
    if woke is not None:
        raise waiter.stall(woke, what, timeout or 0.0, call, -1, Where.SETUP)
