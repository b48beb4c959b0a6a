"""The waits hpcring leaves to a library, watched: the blocking collectives (`Spec.blocking`).

Every other wait of a call polls against its timeout (`hpcring.polling`). `mpi` keeps MPI's
blocking calls because the non-blocking all-reduce measured up to 50% slower (docs/reliability.md),
and the agreement before it catches a rank that skips the call or comes late. A rank frozen
*inside* it (a debugger, SIGSTOP, a node that stops) would still leave the others blocked there
for good, in C, where no Python code of theirs runs. So a watchdog thread reads each
communicator's flight record (`hpcring.flight`) a few times a second, at no cost to the calls:
one whose algorithm declares itself blocking and that has been inside it longer than its
timeout plus GRACE tells the other ranks
it stopped waiting (a stall notice, as any wait does), listens a moment for theirs, prints
which ranks did not answer, writes the flight record where ``HPCRING_FLIGHT_RECORDER`` asks,
and ends the job with MPI_Abort: the one way out of a blocking collective. Under MPI's fault
tolerance, where the library knows of a failed rank, a revoke is the way out instead: the blocked
call returns and raises RankFailedError, no abort (one still inside a timeout after the revoke
ends the job all the same). The thread runs only where MPI was initialized
with MPI_THREAD_MULTIPLE (mpi4py's default), the thread level at which it may call MPI while the
main thread is blocked inside it.
"""

from __future__ import annotations

import sys
import threading
import time

from mpi4py import MPI

from . import flight
from .errors import abort_job

PERIOD = 0.25  # seconds between looks at the records
GRACE = 0.25  # seconds past a call's timeout before the watchdog acts (then it listens, up to 1 s)

_started = False
_REVOKED: dict[tuple[int, float], float] = {}  # a blocked call (slot, start) -> its first revoke
_lock = threading.Lock()


def watch() -> None:
    """Start the watchdog thread, once per process, where MPI allows a second thread to call it."""
    global _started
    if _started:
        return
    with _lock:
        if _started or MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            return
        _started = True
        threading.Thread(target=_run, name="hpcring-watchdog", daemon=True).start()


def _run() -> None:
    while not MPI.Is_finalized():
        time.sleep(PERIOD)
        _look()


def _look() -> None:
    """One look at every live record. A function of its own, so that no record stays referenced
    from this thread while it sleeps: a freed communicator's calls, channels and scratch must go
    when the garbage collector finds them, not when the watchdog next wakes."""
    for recorder in flight.live():
        stuck = overdue(recorder, flight.clock())
        if stuck is not None:
            end_the_job(recorder, stuck)


def overdue(recorder: flight.Recorder, now: float) -> flight.Slot | None:
    """The call of ``recorder`` that has been inside a blocking library collective past its timeout
    plus GRACE, if there is one (a done call has its end after its start)."""
    slot = recorder.current()
    if slot is None or slot.phase != flight.MOVING or slot.end >= slot.start:
        return None
    call = slot.call
    timeout = getattr(call.channel, "timeout", None)
    if not timeout or now - slot.start <= timeout + GRACE:
        return None
    if not call.spec.blocking:  # what runs (auto: its choice) declares it (`Spec.blocking`)
        return None
    return slot


def end_the_job(recorder: flight.Recorder, slot: flight.Slot) -> None:
    """Name the ranks that did not say they were waiting too, keep the record, and abort; under
    MPI's fault tolerance, where a rank is known to have failed, revoke instead: the blocked call
    then returns, and raises RankFailedError (`hpcring.ulfm`)."""
    from . import ulfm  # here: only a blocked call loads it

    call, number = slot.call, slot.number
    if ulfm.enabled() and ulfm.failed_ranks(call.state.comm):
        # A revoke frees the blocked call at once; if it has not, a call timeout later, the job
        # ends as below (seen once under load: two survivors stayed inside MPI_Allreduce).
        first = _REVOKED.setdefault((id(slot), slot.start), flight.clock())
        if flight.clock() - first <= call.channel.timeout:
            ulfm.revoke_state(call.state)
            return
    what = f"the blocking {call.row.collective} of call {number} ({flight.summary(flight.facts(call))})"
    error = call.channel.waiter.stall(
        recorder.rank, what, call.channel.timeout, number, -1, flight.Where.ALGORITHM
    )
    waited = flight.clock() - slot.start
    sys.stderr.write(
        f"rank {recorder.rank}: {error}\n"
        f"rank {recorder.rank}: blocked in the library's own collective for {waited:.1f} s, which "
        f"hpcring cannot interrupt (algorithm {call.ran!r}): it ends the job (MPI_Abort)\n"
    )
    flight.dump_on_error(error)
    abort_job(1)


__all__ = ["GRACE", "overdue", "watch"]
