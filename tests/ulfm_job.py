"""A job for tests/test_elastic.py: one rank dies inside an hpcring collective, the others must raise
RankFailedError at once, shrink, and go on; then again, on the survivors, for the next case.

    mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self -n G python tests/ulfm_job.py CASE...

A CASE is ``what:victim:death``: ``what`` the collective and algorithm (`CALLS`), ``victim`` the
rank (of the current communicator) that dies, ``death`` how: ``kill`` (SIGKILL), ``exit``
(os._exit) or ``crash`` (a segmentation fault). Every rank runs the collective back to back;
the victim's timer thread dies after DIES_AFTER seconds, so inside one. Lines printed (the test
reads them, times are time.time()):

    DIED case C rank R at T
    RAISED case C rank R at T failed F what W        (F: the ranks the error names)
    SHRUNK case C rank R size S seconds X ok B       (B: the survivors' all-reduce was right)
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import hpcring

DIES_AFTER = 0.3  # seconds of collectives before the victim dies
COUNT = 1 << 16  # float32 elements: a few exchanges per call, so a death lands inside one


def _reproducible(comm: MPI.Intracomm, x: np.ndarray) -> Any:
    return hpcring.allreduce(x, algorithm="ring", comm=comm, reproducible=True)


def _nonblocking(comm: MPI.Intracomm, x: np.ndarray) -> Any:
    return hpcring.iallreduce(x, algorithm="ring", comm=comm).wait()


def _planned(comm: MPI.Intracomm, x: np.ndarray) -> Callable[[], Any]:
    return hpcring.plan(x, algorithm="mpi", comm=comm)


def _allreduce(name: str) -> Callable[[MPI.Intracomm, np.ndarray], Any]:
    return lambda comm, x: hpcring.allreduce(x, algorithm=name, comm=comm)


ALLREDUCES = ("ring", "naive", "ps", "rabenseifner", "hierarchical", "mpi")
CALLS: dict[str, Callable[[MPI.Intracomm, np.ndarray], Any]] = {
    **{f"allreduce-{name}": _allreduce(name) for name in ALLREDUCES},
    "reduce_scatter-ring": lambda comm, x: hpcring.reduce_scatter(x, algorithm="ring", comm=comm),
    "allgather-ring": lambda comm, x: hpcring.allgather(x[: COUNT // 8], algorithm="ring", comm=comm),
    "broadcast-binomial": lambda comm, x: hpcring.broadcast(x, root=0, algorithm="binomial", comm=comm),
    "reproducible-ring": _reproducible,
    "iallreduce-ring": _nonblocking,
}


def die(how: str) -> None:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit":
        os._exit(9)
    else:  # a crash: a segmentation fault in C
        ctypes.string_at(0)


def run_case(number: int, comm: MPI.Intracomm, what: str, victim: int, how: str) -> MPI.Intracomm:
    rank = comm.Get_rank()
    x = np.ones(COUNT, dtype=np.float32)
    planned = _planned(comm, x) if what == "plan-mpi" else None
    call = (lambda comm, x: planned()) if planned is not None else CALLS[what]
    call(comm, x)  # warm: every rank has its state for the case
    comm.Barrier()
    if rank == victim:

        def dying() -> None:
            print(f"DIED case {number} rank {rank} at {time.time():.6f}", flush=True)
            die(how)

        threading.Timer(DIES_AFTER, dying).start()
    try:
        while True:
            x.fill(1)
            call(comm, x)
    except hpcring.RankFailedError as error:
        raised = time.time()
        names = ",".join(map(str, error.failed))
        print(f"RAISED case {number} rank {rank} at {raised:.6f} failed {names} what {error}", flush=True)
    if planned is not None:
        planned.free()
    began = time.perf_counter()
    survivors = hpcring.shrink(comm)
    seconds = time.perf_counter() - began
    y = np.full(1000, survivors.Get_rank() + 1, dtype=np.float32)
    hpcring.allreduce(y, algorithm="ring", comm=survivors)
    size = survivors.Get_size()
    ok = bool((y == size * (size + 1) / 2).all()) and len(set(survivors.allgather(y.tobytes()))) == 1
    print(f"SHRUNK case {number} rank {rank} size {size} seconds {seconds:.6f} ok {ok}", flush=True)
    return survivors


def main(argv: list[str]) -> int:
    comm = MPI.COMM_WORLD
    hpcring.elastic.require(comm, "tests/ulfm_job.py")
    for number, case in enumerate(argv):
        what, victim, how = case.split(":")
        comm = run_case(number, comm, what, int(victim), how)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
