"""A job that tests/test_dropin_levels.py launches under mpiexec at a given MPI thread level
(MPI4PY_RC_THREAD_LEVEL): the issue's program 1 through hpcring.Intracomm, as the first call on a
communicator and on a warm one, with each algorithm, then hpcring's requests in MPI's own Waitall
beside the code's own, and hpcring.iallreduce returning before the others arrive.

Every rank prints one line ``RESULT rank=R level=L ok=1`` (ok=0 and what failed otherwise), and
exits 0; a hang is the test's timeout.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

import hpcring

WORLD = MPI.COMM_WORLD
LEVELS = {
    MPI.THREAD_SINGLE: "single",
    MPI.THREAD_FUNNELED: "funneled",
    MPI.THREAD_SERIALIZED: "serialized",
    MPI.THREAD_MULTIPLE: "multiple",
}


def program_1(comm: hpcring.Intracomm) -> list[str]:
    """Rank 0: Iallreduce, then Send to every other rank; the others: Recv (ANY_TAG), then
    Iallreduce; every rank completes its request in MPI's own Waitall. What went wrong, if anything."""
    sent = np.array([11, 22, 33, 44], dtype=np.int64)
    got = np.zeros(4, dtype=np.int64)
    x, total = np.full(5, WORLD.rank + 1.0), np.empty(5)
    start = time.monotonic()
    if WORLD.rank == 0:
        request = comm.Iallreduce(x, total, op=MPI.SUM)
        returned = time.monotonic() - start
        for peer in range(1, WORLD.size):
            comm.Send(sent, dest=peer, tag=5)
    else:
        comm.Recv(got, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
        request = comm.Iallreduce(x, total, op=MPI.SUM)
        returned = 0.0
    MPI.Request.Waitall([request])
    wrong = []
    if returned > 0.5:
        wrong.append(f"Iallreduce took {returned:.2f} s to return")
    if not (total == WORLD.size * (WORLD.size + 1) / 2).all():
        wrong.append(f"sum {total.tolist()}")
    if WORLD.rank != 0 and not np.array_equal(got, sent):
        wrong.append(f"received {got.tolist()}")
    return wrong


def mixed(comm: hpcring.Intracomm) -> list[str]:
    """An Iallreduce among the code's own Isend and Irecv, all in one MPI Waitall."""
    size, rank = WORLD.size, WORLD.rank
    into, total = np.empty(3), np.empty(4)
    requests = [
        comm.Irecv(into, source=(rank - 1) % size, tag=3),
        comm.Iallreduce(np.full(4, 1.0), total, op=MPI.SUM),
        comm.Isend(np.full(3, float(rank)), dest=(rank + 1) % size, tag=3),
    ]
    MPI.Request.Waitall(requests)
    wrong = []
    if not (total == size).all() or not (into == (rank - 1) % size).all():
        wrong.append(f"mixed: sum {total.tolist()}, received {into.tolist()}")
    return wrong


def library(comm: MPI.Intracomm) -> list[str]:
    """hpcring.iallreduce on a warm communicator: it returns while the last rank is away."""
    if WORLD.rank == WORLD.size - 1:
        time.sleep(0.5)
    x = np.full(6, 1.0)
    start = time.monotonic()
    request = hpcring.iallreduce(x, comm=comm, algorithm="ring", timeout=10)
    returned = time.monotonic() - start
    request.wait()
    wrong = []
    if returned > 0.3:
        wrong.append(f"hpcring.iallreduce took {returned:.2f} s to return")
    if not (x == WORLD.size).all():
        wrong.append(f"library sum {x.tolist()}")
    return wrong


def main() -> int:
    wrong: list[str] = []
    for algorithm in ("mpi", "ring"):
        plain = WORLD.Dup()
        comm = hpcring.Intracomm(plain, algorithm=algorithm, timeout=10)
        wrong += [f"{algorithm} first call: {w}" for w in program_1(comm)]
        comm.Allreduce(MPI.IN_PLACE, np.zeros(1), op=MPI.SUM)  # hpcring's communicators made
        wrong += [f"{algorithm} warm: {w}" for w in program_1(comm)]
        wrong += [f"{algorithm}: {w}" for w in mixed(comm)]
        wrong += library(plain)
        plain.Free()
    level = LEVELS.get(MPI.Query_thread(), "?")
    words = f"ok={int(not wrong)}" + ("".join(f" | {w}" for w in wrong) if wrong else "")
    print(f"RESULT rank={WORLD.rank} level={level} {words}\n", end="", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
