"""The non-blocking collectives: `iallreduce`, `ireduce_scatter`, `iallgather`, `ibroadcast`
run while the caller goes on computing.

Each user communicator gets one worker thread and its own duplicate of the communicator,
both made collectively on the first non-blocking call on it (`Progress`). The worker runs the
submitted collectives one after another, in submission order, through the engine (so
validation, the agreement step and every algorithm come along unchanged). Because the
worker owns its duplicate, the main thread may still call the blocking collectives on the
same communicator while requests are in flight.

Why a thread and not MPI_Iallreduce: the algorithms are written in Python over
point-to-point calls, and a request must make progress while Python computes. mpi4py
releases the GIL inside every MPI call, and NumPy releases it inside matmul and large
element-wise kernels, so the worker's messages move while the main thread computes.

Rules: every rank submits the same sequence of calls on a communicator (a mismatch is
caught by the agreement step and raised by `Request.wait` on every rank); the buffer
belongs to hpcring until `wait()` returns. Under an MPI thread level below
MPI_THREAD_MULTIPLE no thread is started: each call runs at once, in the caller, and its
request is already complete (`progress_mode()` says which; so does `hpcring.info()`).
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from mpi4py import MPI

from .algorithms import ALLGATHER, ALLREDUCE, BROADCAST, REDUCE_SCATTER
from .arrays import adapter_for
from .comm import attached, duplicate, intracomm, state_of
from .engine import call


class Request:
    """A submitted collective: `test()` polls, `wait()` blocks and returns the result (or raises)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self.started: float | None = None  # time.perf_counter() when the worker began it
        self.finished: float | None = None

    def test(self) -> bool:
        """True once the collective has finished (successfully or not); never blocks, never raises."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until finished; return what the blocking collective returns, or raise what it raised.

        ``timeout`` (seconds) bounds this wait only: TimeoutError leaves the request running.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"hpcring: request not finished after {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def seconds(self) -> float:
        """How long the collective itself ran (0 until finished)."""
        if self.started is None or self.finished is None:
            return 0.0
        return self.finished - self.started

    def _run(self, call: Callable[[], Any]) -> None:
        self.started = time.perf_counter()
        try:
            self._result = call()
        except BaseException as error:  # handed to wait(), on the caller's thread
            self._error = error
        finally:
            self.finished = time.perf_counter()
            self._done.set()


def progress_mode() -> str:
    """How requests progress in this process: 'thread' (overlap) or 'inline' (no overlap)."""
    if not MPI.Is_initialized():
        return "unknown (MPI not initialized)"
    return "thread" if MPI.Query_thread() >= MPI.THREAD_MULTIPLE else "inline"


_Job = tuple[Request, Callable[[], Any]]


class Progress:
    """The progress engine: one worker thread and one private communicator per user communicator
    (made collectively)."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.comm = duplicate(comm, None)  # bounded by HPCRING_TIMEOUT, as every first call
        state_of(self.comm)  # allreduce's own duplicate, made here: the worker runs no Dup
        self.threaded = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if self.threaded:
            self._thread = threading.Thread(target=self._work, name="hpcring-progress", daemon=True)
            self._thread.start()
            _engines.add(self)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            request, call = job
            request._run(call)

    def submit(self, call: Callable[[], Any]) -> Request:
        request = Request()
        if self._thread is None:
            request._run(call)
        else:
            self._jobs.put((request, call))
        return request

    def stop(self) -> None:
        """Stop the worker after the requests already submitted (it may still be inside one,
        finishing a framework's future, when the caller has moved on)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def close(self) -> None:
        """Stop the worker, and free the communicator."""
        self.stop()
        if not MPI.Is_finalized() and self.comm != MPI.COMM_NULL:
            self.comm.Free()


_engines: weakref.WeakSet[Progress] = weakref.WeakSet()  # those whose worker runs


@atexit.register  # registered after mpi4py's MPI_Finalize, so it runs before it
def _stop_workers() -> None:
    """Join every worker before the interpreter shuts down: a daemon thread still inside a
    framework's C++ (torch completing a DDP hook's future) when Python finalizes is killed
    there, and the process aborts ("terminate called without an active exception")."""
    for engine in list(_engines):
        engine.stop()


def progress_for(comm: MPI.Intracomm | None, caller: str = "hpcring.iallreduce") -> Progress:
    """The progress engine of ``comm`` (COMM_WORLD if None); collective the first time on a
    communicator.

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

    return progress.submit(run)


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
