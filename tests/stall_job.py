"""A job that tests/test_stall.py launches under mpiexec: one rank skips its first call, or
stops itself (SIGSTOP) in the middle of an algorithm; every other rank must raise StallError
naming it in time, and the job must end, non-zero, without hanging in MPI_Finalize.

    stall_job.py skip RANK            RANK never makes the first call on a fresh WORLD.Dup()
    stall_job.py freeze RANK ALGO [WARM]
                                      RANK stops itself after its first exchange of ALGO, in
                                      the call after WARM warm-up calls (default 1)
                                      (mpi: just before MPI_Allreduce; the watchdog aborts the job)

Every rank prints one line ``RESULT rank=R ...`` and exits 1 after a StallError (3 otherwise).

The frozen rank stops itself inside the Channel's methods, which only the pure-Python core calls
(the compiled core runs the algorithm's recorded steps in C): it runs on the Python core, so it
freezes where the test says, while the others run the core the job runs (the compiled one where
it is built: its waits and agreement are what they test). Both cores send the same messages.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import hpcring
from hpcring import kernels, polling
from hpcring.channel import Channel

TIMEOUT = 2.0
WORLD = MPI.COMM_WORLD


def report(**fields: object) -> None:
    words = " ".join(f"{key}={value}" for key, value in fields.items())
    # One write, newline included: Hydra forwards what each write gave, and with PYTHONUNBUFFERED
    # print's separate write of the newline let another rank's line land in between.
    print(f"RESULT rank={WORLD.rank} {words}\n", end="", flush=True)


def main(mode: str, target: int, algorithm: str = "ring", warmups: str = "1") -> int:
    pids = WORLD.allgather(os.getpid())
    comm = WORLD.Dup()
    x = np.ones(1 << 16, dtype=np.float64)
    hpcring.allreduce(x.copy(), comm=MPI.COMM_SELF)  # imports done: the time measured is the wait
    if mode == "freeze" and WORLD.rank == target:  # the Python core, whose Channel is patched below
        kernels.select("python")
    if mode == "freeze":
        for _ in range(int(warmups)):  # the compiled core: 1, the program in C; 2, the whole call
            hpcring.allreduce(x.copy(), comm=comm, algorithm=algorithm, timeout=TIMEOUT)
        if WORLD.rank == target and algorithm == "mpi":  # freeze just before MPI_Allreduce
            blocking = Channel.allreduce

            def frozen(ch: Channel, *args: object) -> None:
                os.kill(os.getpid(), signal.SIGSTOP)
                blocking(ch, *args)

            Channel.allreduce = frozen
        elif WORLD.rank == target:
            plain, steps = Channel.sendrecv, []

            def stopping(ch: Channel, *args: object) -> None:
                plain(ch, *args)
                steps.append(1)
                if len(steps) == 1:  # the call has started: freeze here, mid-algorithm
                    os.kill(os.getpid(), signal.SIGSTOP)

            Channel.sendrecv = stopping
    elif WORLD.rank == target:  # skip: never makes the first call; stays until the others gave up
        # Said first: once another rank has left with its error, the launcher may end this one
        # before its sleep is over (seen once in CI's serial phase, under load).
        report(skipped=1)
        time.sleep(TIMEOUT + 4)
        return 1
    start = time.monotonic()
    try:
        hpcring.allreduce(x, comm=comm, algorithm=algorithm, timeout=TIMEOUT)
    except hpcring.StallError as error:
        elapsed = time.monotonic() - start
        report(stall=1, missing=",".join(map(str, error.missing)), elapsed=f"{elapsed:.2f}")
        print(f"rank {WORLD.rank}: {error}\n", end="", flush=True)  # one write, as report()
        if mode == "freeze" and WORLD.rank == min(r for r in range(WORLD.size) if r != target):
            # Once every other survivor has stopped listening for notices (a woken rank that
            # answered them in time would be heard, and the one listening would name itself):
            time.sleep(polling.GRACE + 0.5)
            os.kill(pids[target], signal.SIGCONT)  # wake the frozen rank: it must end too
        return 1
    except Exception as error:  # the frozen rank, woken: any hpcring error, never a hang
        report(error=type(error).__name__)
        return 1
    report(completed=1)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:]))
