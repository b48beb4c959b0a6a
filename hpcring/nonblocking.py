"""The non-blocking collectives: `iallreduce`, `ireduce_scatter`, `iallgather`, `ibroadcast`,
`ialltoall` run while the caller goes on computing.

Each user communicator gets one progress engine (`Progress`): hpcring's second duplicate of it
(made with its state by the first hpcring call on it, which is collective and blocking:
`hpcring.comm`) and, under MPI_THREAD_MULTIPLE (mpi4py's default), one worker thread. The engine
runs the submitted collectives one after another, in submission order, through the call engine
(so validation, the agreement step and every algorithm come along unchanged), on that duplicate:
the main thread may still call the blocking collectives on the same communicator, on the first
duplicate, while requests are in flight. Once the state exists, a call only submits: it never
blocks.

Why a thread and not MPI_Iallreduce: the algorithms are written in Python over point-to-point
calls, and a request must make progress while Python computes. mpi4py releases the GIL inside
every MPI call, and NumPy releases it inside matmul and large element-wise kernels, so the
worker's messages move while the main thread computes.

Under a thread level below MPI_THREAD_MULTIPLE no thread may call MPI beside the caller's, so
no worker is started: a request runs, in the caller's thread, when it (or a later request of the
same communicator) is first tested or waited on, in submission order (`progress_mode()` says
which; so does `hpcring.info()`). Only MPI's own non-blocking collectives progress while such a
caller computes: `hpcring.Intracomm.Iallreduce` posts MPI_Iallreduce there (docs/embedding.md).

Rules: every rank submits the same sequence of calls on a communicator (a mismatch is
caught by the agreement step and raised by `Request.wait` on every rank); the buffer
belongs to hpcring until `wait()` returns.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from mpi4py import MPI

from .algorithms import ALLGATHER, ALLREDUCE, BROADCAST, REDUCE_SCATTER
from .arrays import adapter_for
from .comm import CommState, attached, intracomm, state_of
from .engine import call


class Request:
    """A submitted collective: `test()` polls, `wait()` blocks and returns the result (or raises)."""

    def __init__(self, progress: Progress | None = None) -> None:
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._progress = progress  # below MPI_THREAD_MULTIPLE: whose queue runs this request
        self._then: list[Callable[[Request], None]] = []  # run once finished, where it finished
        self._then_lock = threading.Lock()
        self.started: float | None = None  # time.perf_counter() when the worker began it
        self.finished: float | None = None

    def test(self) -> bool:
        """True once the collective has finished (successfully or not); never raises. Never blocks
        under MPI_THREAD_MULTIPLE; below it, the first test runs the collective (module docstring)."""
        if not self._done.is_set() and self._progress is not None:
            self._progress.run_until(self)
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until finished; return what the blocking collective returns, or raise what it raised.

        ``timeout`` (seconds) bounds this wait only: TimeoutError leaves the request running (below
        MPI_THREAD_MULTIPLE the collective runs here, bounded by its own timeout= instead)."""
        if not self._done.is_set() and self._progress is not None:
            self._progress.run_until(self)
        if not self._done.wait(timeout):
            raise TimeoutError(f"hpcring: request not finished after {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self._result

    def join(self) -> None:
        """Block until finished, raising nothing (`error` says how it ended)."""
        if not self._done.is_set() and self._progress is not None:
            self._progress.run_until(self)
        self._done.wait()

    @property
    def error(self) -> BaseException | None:
        """What the collective raised, once finished (None: it succeeded, or is still running)."""
        return self._error

    @property
    def seconds(self) -> float:
        """How long the collective itself ran (0 until finished)."""
        if self.started is None or self.finished is None:
            return 0.0
        return self.finished - self.started

    def then(self, callback: Callable[[Request], None]) -> None:
        """Call ``callback(request)`` once it has finished, on the thread that finished it (at once,
        here, if it has): how an MPI generalized request that stands for it is completed."""
        with self._then_lock:
            if not self._done.is_set():
                self._then.append(callback)
                return
        callback(self)

    def _run(self, call: Callable[[], Any]) -> None:
        self.started = time.perf_counter()
        try:
            self._result = call()
        except BaseException as error:  # handed to wait(), on the caller's thread
            self._error = error
        finally:
            self.finished = time.perf_counter()
            with self._then_lock:
                self._done.set()
                callbacks, self._then = self._then, []
            for callback in callbacks:
                callback(self)


def progress_mode() -> str:
    """How requests progress in this process: 'thread' (overlap) or 'inline' (in the caller's
    thread, when it tests or waits)."""
    if not MPI.Is_initialized():
        return "unknown (MPI not initialized)"
    return "thread" if MPI.Query_thread() >= MPI.THREAD_MULTIPLE else "inline"


_Job = tuple[Request, Callable[[], Any]]


class Progress:
    """The progress engine of one user communicator: hpcring's second duplicate of it and, under
    MPI_THREAD_MULTIPLE, one worker thread (module docstring). Made without communicating, once
    the communicator's state exists."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        background = state_of(comm).background
        assert background is not None, "a communicator's state has its second duplicate"
        self.comm: MPI.Intracomm = background
        self.state: CommState = state_of(background)  # adopted with it: no further duplicate
        self.threaded = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._queue: deque[_Job] = deque()  # below MPI_THREAD_MULTIPLE: submitted, not yet run
        self._running = threading.RLock()  # below it: one thread runs the queue (SERIALIZED)
        self._thread: threading.Thread | None = None
        if self.threaded:
            self._thread = threading.Thread(target=self._work, name="hpcring-progress", daemon=True)
            self._thread.start()
            _engines.add(self)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            request, call = job
            request._run(call)

    def defer(self, call: Callable[[], Any]) -> Request:
        """Queue ``call`` behind every call submitted before it; return its Request at once. The
        worker runs it; below MPI_THREAD_MULTIPLE, the caller's first test or wait of it (or of a
        later request) does."""
        if self._thread is not None:
            request = Request()
            self._jobs.put((request, call))
        else:
            request = Request(self)
            self._queue.append((request, call))
        return request

    def submit(self, call: Callable[[], Any]) -> Request:
        """Run ``call`` after every call submitted before it: on the worker; below
        MPI_THREAD_MULTIPLE, now, in the caller (after running those)."""
        if self._thread is not None:
            return self.defer(call)
        self.run_until(None)
        request = Request()
        request._run(call)
        return request

    def run_until(self, request: Request | None) -> None:
        """Below MPI_THREAD_MULTIPLE: run the queued calls, in order, up to ``request`` (None: all)."""
        if self._thread is not None:
            return
        with self._running:
            while self._queue and (request is None or not request._done.is_set()):
                queued, call = self._queue.popleft()
                queued._run(call)

    def stop(self) -> None:
        """Stop the worker after the requests already submitted (it may still be inside one,
        finishing a framework's future, when the caller has moved on)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def close(self) -> None:
        """Stop the worker (the communicator's state frees the duplicate)."""
        self.stop()


_engines: weakref.WeakSet[Progress] = weakref.WeakSet()  # those whose worker runs


@atexit.register  # registered after mpi4py's MPI_Finalize, so it runs before it
def _stop_workers() -> None:
    """Join every worker before the interpreter shuts down: a daemon thread still inside a
    framework's C++ (torch completing a DDP hook's future) when Python finalizes is killed
    there, and the process aborts ("terminate called without an active exception")."""
    for engine in list(_engines):
        engine.stop()


def progress_for(comm: MPI.Intracomm | None, caller: str = "hpcring.iallreduce") -> Progress:
    """The progress engine of ``comm`` (COMM_WORLD if None): collective and blocking only where
    no hpcring call has been made on the communicator yet (it makes its state, `hpcring.comm`).

    Cached with hpcring's other per-communicator state (`hpcring.comm.attached`), and closed when
    the user frees the communicator.
    """
    comm = intracomm(comm, caller)
    return attached(comm, "engine", lambda: Progress(comm))


def _handoff(x: Any) -> Callable[[], AbstractContextManager[None]]:
    try:
        return adapter_for(x).handoff(x)
    except TypeError:  # not an array: let allreduce's validation report it on every rank
        return nullcontext


def _start(
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
) -> Request:
    """Submit ``collective`` to the progress engine of ``comm`` and return its Request."""
    progress = progress_for(comm, f"hpcring.i{collective}")
    entered = _handoff(x)

    private = progress.comm

    def run() -> Any:
        with entered():
            return call(collective, x, out, op, algorithm, private, check, timeout, root, reproducible, wire)

    return progress.defer(run)


def iallreduce(
    x: Any,
    *,
    op: str | MPI.Op = "sum",
    algorithm: str = "ring",
    comm: MPI.Intracomm | None = None,
    out: Any = None,
    check: bool = True,
    timeout: float | None = None,
    reproducible: bool = False,
    wire: str | None = None,
) -> Request:
    """Start `hpcring.allreduce(x, ...)` and return at once with a `Request`.

    Same arguments and guarantees as `allreduce`; errors (bad input, disagreement between
    ranks, a stall) are raised by `Request.wait()`, on every rank. Do not touch ``x`` (or
    ``out``) until `wait()` returns, and submit the same calls in the same order on every rank.
    """
    return _start(ALLREDUCE, x, out, op, algorithm, comm, check, timeout, 0, reproducible, wire)


def ireduce_scatter(
    x: Any,
    *,
    op: str | MPI.Op = "sum",
    algorithm: str = "ring",
    comm: MPI.Intracomm | None = None,
    out: Any = None,
    check: bool = True,
    timeout: float | None = None,
) -> Request:
    """Start `hpcring.reduce_scatter(x, ...)`; `Request.wait()` returns this rank's part."""
    return _start(REDUCE_SCATTER, x, out, op, algorithm, comm, check, timeout)


def iallgather(
    x: Any,
    *,
    algorithm: str = "ring",
    comm: MPI.Intracomm | None = None,
    out: Any = None,
    check: bool = True,
    timeout: float | None = None,
) -> Request:
    """Start `hpcring.allgather(x, ...)`; `Request.wait()` returns the gathered array."""
    return _start(ALLGATHER, x, out, None, algorithm, comm, check, timeout)


def ibroadcast(
    x: Any,
    *,
    root: int = 0,
    algorithm: str = "ring",
    comm: MPI.Intracomm | None = None,
    check: bool = True,
    timeout: float | None = None,
) -> Request:
    """Start `hpcring.broadcast(x, ...)`; `Request.wait()` returns ``x`` (a jax.Array: a new one)."""
    return _start(BROADCAST, x, None, None, algorithm, comm, check, timeout, root)


def ialltoall(
    x: Any,
    *,
    send_splits: Any = None,
    recv_splits: Any = None,
    algorithm: str = "auto",
    comm: MPI.Intracomm | None = None,
    out: Any = None,
    check: bool = True,
    timeout: float | None = None,
) -> Request:
    """Start `hpcring.alltoall(x, ...)`; `Request.wait()` returns the received blocks. Do not touch
    ``x`` (or ``out``) until `wait()` returns."""
    from . import exchange  # here: a code that never calls alltoall never loads it

    progress = progress_for(comm, "hpcring.ialltoall")
    entered = _handoff(x)
    private = progress.comm

    def run() -> Any:
        with entered():
            return exchange.run(x, out, algorithm, private, check, timeout, send_splits, recv_splits)

    return progress.defer(run)
