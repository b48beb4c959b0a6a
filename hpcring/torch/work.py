"""torch's side of a collective in flight: a `Work` whose future completes when the data is there,
and the `Completer` thread that completes them.

hpcring's non-blocking collectives (`hpcring.nonblocking`) return a `Request` that makes
progress in the background; torch wants a ``Work`` whose ``torch.futures.Future`` completes
by itself (DDP chains its next step on the future and never calls ``wait``). The thread that
finishes the Work's last request (hpcring's progress thread, `Request.then`) runs what is left
to do once the data is there (a copy out of a staging buffer) and completes the future, or
fails it with the error hpcring raised (on every rank alike); a thread that waits on the Work
itself (a synchronous collective: ``work.wait()`` right after it is issued) waits on the
requests directly and may finish it first, so the caller wakes when the data is there, not a
thread switch later. A Work made of other Works waits on them in the group's `Completer`
thread, in submission order.

At exit every completer is joined (`atexit`, before mpi4py's MPI_Finalize): a daemon thread
still inside torch's C++ when Python finalizes (completing a future runs its callbacks) would
be stopped there, and a thread stopped inside C++ aborts the process ("terminate called without
an active exception").
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from mpi4py import MPI  # noqa: F401  (imported before the atexit below registers: it runs first)

from ..nonblocking import Request


class Work(dist.Work):
    """One collective (or a few issued as one) of the hpcring process group, in flight.

    ``wait()`` blocks until the data is there and raises what hpcring raised (on every rank: a
    `hpcring.StallError` naming the missing rank, a ValueError for ranks that disagree);
    ``get_future()`` is completed by the group's `Completer` with ``result`` (the output
    tensors), or failed with that error. ``is_completed()`` never blocks.
    """

    def __init__(self, result: list[torch.Tensor], name: str, value: Any = None) -> None:
        super().__init__()
        self._result = result
        self._value = result if value is None else value  # what the future holds (a hook's: a tensor)
        self.name = name  # the collective, for messages
        # Made when asked for: a synchronous collective finished in its caller needs neither
        self._future: torch.futures.Future[Any] | None = None
        self._event: threading.Event | None = None
        self._done = False
        self._error: BaseException | None = None
        self._requests: Sequence[Any] = ()  # hpcring's requests, and what runs once they are done
        self._then: Callable[[], None] | None = None
        self._finishing = threading.RLock()  # guards the finish, the event's and the future's making

    def attach(self, requests: Sequence[Any], then: Callable[[], None] | None) -> None:
        self._requests, self._then = requests, then

    def complete(self) -> None:
        """Wait for every request (each one, even after a failure: none left running), then run
        what is left to do and finish, once, in whichever thread gets here first."""
        if self._done:
            return
        error: BaseException | None = None
        for request in self._requests:
            try:
                request.wait()
            except BaseException as failed:
                error = error or failed
        with self._finishing:
            if self._done:
                return
            if error is None and self._then is not None:
                try:
                    self._then()
                except BaseException as failed:
                    error = failed
            self._finish(error)

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the collective is done; raise its error. ``timeout`` (torch's; 0 or None:
        none) bounds this wait only: hpcring's own timeout bounds the collective."""
        if not self._done:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else None
            if not seconds and self._requests:
                self.complete()  # this thread waits on the requests itself
            if not self._done:
                with self._finishing:
                    event = self._event = self._event or threading.Event()
                    if self._done:
                        event.set()
                if not event.wait(seconds if seconds else None):
                    raise TimeoutError(f"hpcring backend: {self.name} not done after {seconds:g} s")
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future[Any]:
        with self._finishing:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._done:
                    self._settle(self._future)
            return self._future

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def finish(self, error: BaseException | None) -> None:
        """The data is there (or ``error``): wake waiters, complete the future."""
        with self._finishing:
            self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        self._error = error
        self._done = True
        if self._event is not None:
            self._event.set()
        if self._future is not None:
            self._settle(self._future)

    def _settle(self, future: torch.futures.Future[Any]) -> None:
        if self._error is None:
            future.set_result(self._value)
        else:
            future.set_exception(self._error)


class Finished:
    """A collective run to its end in the caller's thread: a request that is done, with its result
    or its error (what `hpcring.nonblocking.Request.wait` gives)."""

    __slots__ = ("error", "result")

    def __init__(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        try:
            self.result = call(*args, **kwargs)
        except BaseException as failed:  # raised by wait(), as a request's is
            self.error = failed

    def wait(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


_Job = tuple[Work, Sequence[Any], Callable[[], None] | None]


class Completer:
    """One thread that completes a process group's Works in submission order (see the module)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _running.add(self)

    def add(self, work: Work, requests: Sequence[Any], then: Callable[[], None] | None = None) -> Work:
        """Complete ``work`` once every request in ``requests`` is done and ``then()`` has run:
        hpcring's requests complete it themselves, on the thread that finishes the last of them
        (`Request.then`: no thread switch to this one); anything else (other Works) in order here."""
        work.attach(requests, then)
        if all(isinstance(r, Finished) for r in requests):  # run in the caller: done already
            work.complete()
            return work
        if all(isinstance(r, Request) for r in requests):
            left = [len(requests)]
            counting = threading.Lock()

            def finished(_: Request) -> None:
                with counting:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    work.complete()

            for request in requests:
                request.then(finished)
            return work
        self._jobs.put((work, requests, then))
        return work

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job[0].complete()

    def stop(self) -> None:
        """Complete what was submitted, then end the thread (idempotent)."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        _running.discard(self)


_running: weakref.WeakSet[Completer] = weakref.WeakSet()


@atexit.register  # registered after mpi4py's MPI_Finalize (imported above), so it runs before it
def _stop_all() -> None:
    for completer in list(_running):
        completer.stop()


def done(result: list[torch.Tensor], name: str, error: BaseException | None = None) -> Work:
    """A Work complete already (a collective with nothing to move, or one run in its caller),
    with ``error`` if it failed: no other thread knows it yet, so nothing to lock or wake."""
    work = Work(result, name)
    work._finish(error)
    return work


__all__ = ["Completer", "Finished", "Work", "done"]
