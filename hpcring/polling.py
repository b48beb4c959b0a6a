"""Waiting on MPI requests: as fast as MPI's own wait, yet bounded by a deadline.

A blocking ``MPI_Wait`` is the fastest way to wait (the library's own progress loop, which
also knows whether to yield the core when ranks outnumber cores), but it cannot time out.
`Waiter.wait` gets both: it spins briefly, then blocks in ``MPI_Waitany`` on the request and
on one receive posted for the communicator's stall notices, and a watchdog thread sends this
rank such a notice at the deadline. Either a notice from another rank (it gave up waiting)
or the watchdog's own wakes the wait, which then returns False. Without
MPI_THREAD_MULTIPLE the watchdog cannot call MPI, so the wait polls instead, spinning and
then napping.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Any

import numpy as np
from mpi4py import MPI

TAG_NOTICE = 32001  # "I stopped waiting": a stall notice; the algorithms use small tags
SPINS = 256  # tests before blocking: the last rank is usually microseconds away
NAP = 2e-4  # seconds between tests where the wait has to poll (no MPI_THREAD_MULTIPLE)


def idle_barrier(comm: Any) -> None:
    """A barrier that sleeps between polls: ranks waiting here leave the cores to those at work."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.0005)


class _Watchdog:
    """One thread for the process: at each armed deadline it sends a stall notice to its own rank."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, Any] = {}  # token -> the Waiter to wake
        self._tokens = itertools.count()
        self._sent: list[Any] = []  # the notices' send requests, kept until they complete
        threading.Thread(target=self._run, name="hpcring-watchdog", daemon=True).start()

    def arm(self, deadline: float, waiter: Waiter) -> int:
        with self._cond:
            token = next(self._tokens)
            self._armed[token] = waiter
            heapq.heappush(self._heap, (deadline, token))
            if self._heap[0][1] == token:
                self._cond.notify()
            return token

    def disarm(self, token: int) -> bool:
        """Forget ``token``; False where its notice was already sent (the waiter must take it)."""
        with self._cond:
            return self._armed.pop(token, None) is not None

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)  # disarmed
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, token = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                waiter = self._armed.pop(token)
                self._sent = [r for r in self._sent if not r.Test()]
                self._sent.append(waiter.comm.Isend(waiter.word, waiter.rank, TAG_NOTICE))


_watchdog: _Watchdog | None = None
_watchdog_lock = threading.Lock()


def _the_watchdog() -> _Watchdog:
    global _watchdog
    if _watchdog is None:
        with _watchdog_lock:
            if _watchdog is None:
                _watchdog = _Watchdog()
    return _watchdog


class Waiter:
    """Deadline-bounded waits on one communicator, woken by stall notices (its own or others')."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.word = np.array([self.rank], dtype=np.int64)  # a notice's payload: who sent it
        self._incoming = np.zeros(1, dtype=np.int64)
        self._notice: MPI.Request | None = None  # the receive posted for the next notice
        self.threaded = MPI.Query_thread() >= MPI.THREAD_MULTIPLE

    def _posted(self) -> MPI.Request:
        if self._notice is None:
            self._notice = self.comm.Irecv(self._incoming, MPI.ANY_SOURCE, TAG_NOTICE)
        return self._notice

    def _take_notice(self) -> int:
        """The rank whose notice the posted receive got; the receive is posted again later."""
        self._notice = None
        return int(self._incoming[0])

    def wait(self, request: MPI.Request, deadline: float | None) -> int | None:
        """Wait for ``request``. None once it completes; otherwise the rank whose notice woke
        the wait (this rank's own at ``deadline``, or another rank that stopped waiting)."""
        test = request.Test
        for _ in range(SPINS):
            if test():
                return None
        if deadline is None:
            request.Wait()
            return None
        if not self.threaded:
            return self._poll(request, deadline)
        notice = self._posted()
        watchdog = _the_watchdog()
        token = watchdog.arm(deadline, self)
        index = MPI.Request.Waitany([request, notice])
        if watchdog.disarm(token) or index == 1:
            return None if index == 0 else self._take_notice()
        notice.Wait()  # done, but the watchdog's notice was on its way: take it, or it wakes the next wait
        self._take_notice()
        return None

    def _poll(self, request: MPI.Request, deadline: float) -> int | None:
        notice = self._posted()
        while not request.Test():
            if notice.Test():
                return self._take_notice()
            if time.monotonic() > deadline:
                return self.rank
            time.sleep(NAP)
        return None

    def notify_all(self) -> None:
        """Tell every other rank that this one stopped waiting (tiny messages, sent eagerly)."""
        for r in range(self.size):
            if r != self.rank:
                self.comm.Isend(self.word, r, TAG_NOTICE)

    def listen(self, seconds: float, heard: set[int]) -> set[int]:
        """Collect other ranks' notices for up to ``seconds`` (until every rank is heard)."""
        end = time.monotonic() + seconds
        while len(heard) < self.size and time.monotonic() < end:
            if self._posted().Test():
                heard.add(self._take_notice())
            else:
                time.sleep(1e-3)
        return heard
