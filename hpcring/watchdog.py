"""The one wait hpcring leaves to MPI, watched: the `mpi` algorithm's blocking MPI_Allreduce.

Every other wait of a call polls against its timeout (`hpcring.polling`). `mpi` keeps MPI's
blocking call because its non-blocking form measured up to 50% slower (docs/reliability.md),
and the agreement before it catches a rank that skips the call or comes late. A rank frozen
*inside* it (a debugger, SIGSTOP, a node that stops) would still leave the others blocked there
for good, in C, where no Python code of theirs runs. So a watchdog thread reads each
communicator's flight record (`hpcring.flight`) a few times a second, at no cost to the calls:
one that has been inside MPI_Allreduce longer than its timeout plus GRACE tells the other ranks
it stopped waiting (a stall notice, as any wait does), listens a moment for theirs, prints
which ranks did not answer, writes the flight record where ``HPCRING_FLIGHT_RECORDER`` asks,
and ends the job with MPI_Abort: the one way out of a blocking collective. The thread runs only
where MPI was initialized with MPI_THREAD_MULTIPLE (mpi4py's default), the thread level at which
it may call MPI while the main thread is blocked inside it.
"""

from __future__ import annotations

import sys
import threading
import time

from mpi4py import MPI

from . import flight
from .polling import ALGORITHM

PERIOD = 0.25  # seconds between looks at the records
GRACE = 0.25  # seconds past a call's timeout before the watchdog acts (then it listens 1 s)
BLOCKING = frozenset({"mpi"})  # algorithms whose data exchange is one blocking MPI call

_started = False
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
        for ref in list(flight._recorders):
            recorder = ref()
            if recorder is not None:
                stuck = overdue(recorder, flight.clock())
                if stuck is not None:
                    end_the_job(recorder, stuck)


def overdue(recorder: flight.Recorder, now: float) -> flight.Slot | None:
    """The call of ``recorder`` that has been inside a blocking MPI_Allreduce past its timeout
    plus GRACE, if there is one (a done call has its end after its start)."""
    slot = recorder.current()
    if slot is None or slot.phase != flight.MOVING or slot.end >= slot.start:
        return None
    call = slot.call
    timeout = getattr(call.channel, "timeout", None)
    if not timeout or now - slot.start <= timeout + GRACE:
        return None
    if flight.facts(call).get("ran") not in BLOCKING:
        return None
    return slot


def end_the_job(recorder: flight.Recorder, slot: flight.Slot) -> None:
    """Name the ranks that did not say they were waiting too, keep the record, and abort."""
    call, number = slot.call, slot.number
    what = f"the MPI_Allreduce of call {number} ({flight.summary(flight.facts(call))})"
    error = call.channel.waiter.stall(recorder.rank, what, call.channel.timeout, number, -1, ALGORITHM)
    waited = flight.clock() - slot.start
    sys.stderr.write(
        f"rank {recorder.rank}: {error}\n"
        f"rank {recorder.rank}: blocked in MPI_Allreduce for {waited:.1f} s, which hpcring cannot "
        "interrupt (algorithm 'mpi'): it ends the job (MPI_Abort)\n"
    )
    sys.stderr.flush()
    flight.dump_on_error(error)
    MPI.COMM_WORLD.Abort(1)


__all__ = ["BLOCKING", "GRACE", "overdue", "watch"]
