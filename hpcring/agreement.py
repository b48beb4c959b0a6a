"""Agreement before data moves: every rank arrives, with the same call, or all raise.

Each rank sends one small row (call number, count, dtype, op, algorithm, array kind,
placement, local verdict) to rank 0 with a non-blocking send; rank 0 receives them, knows
exactly who arrived, and broadcasts a one-word verdict. So a mismatch or a bad argument on
any rank becomes an exception on every rank, and a rank that never arrives becomes a
`StallError` on the others, naming it, after ``timeout`` seconds instead of a hang.

Cost when nothing is wrong: G-1 tiny messages into rank 0 and one small broadcast,
about the latency of one small Allgather (docs/reliability.md has the figures).
After a StallError the communicator holds unmatched messages: end the job.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from .errors import StallError

ROOT = 0
TAG_ARRIVE, TAG_STALL = 1, 2  # the algorithms use tag 0 on the same private communicator
FIELDS = ("call", "count", "dtype", "op", "algorithm", "array", "placement")


def _wait(requests: Sequence[MPI.Request], deadline: float | None, probe: Any = None) -> bool:
    """Wait for all ``requests``; False at ``deadline`` (None: forever), or when ``probe()`` is true.

    A short spin keeps the common case fast; after that the loop sleeps a little between
    tests so that oversubscribed ranks leave the CPU to the ranks they wait for.
    """
    if deadline is None and probe is None:
        MPI.Request.Waitall(list(requests))
        return True
    pause, spins = 0.0, 0
    while not MPI.Request.Testall(list(requests)):
        if (deadline is not None and time.monotonic() > deadline) or (probe is not None and probe()):
            return False
        spins += 1
        if spins > 200:
            pause = min(max(pause * 2, 1e-5), 1e-3)
            time.sleep(pause)
    return True


def agree(
    comm: MPI.Intracomm,
    row: Sequence[int],
    problem: Exception | None,
    *,
    timeout: float,
    describe: Any,
    what: str,
) -> None:
    """Raise on every rank if any rank failed, disagrees on ``row``, or does not arrive in time.

    ``row`` is (call, count, dtype, op, algorithm, array, placement) as integers;
    ``describe(field, value)`` names a value for messages; ``what`` names the operation for
    StallError.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    mine = np.array([*row, problem is not None], dtype=np.int64)
    verdict = np.zeros(1, dtype=np.int64)
    deadline = time.monotonic() + timeout if timeout > 0 else None
    if rank == ROOT:
        table = np.empty((size, mine.size), dtype=np.int64)
        table[ROOT] = mine
        others = [r for r in range(size) if r != ROOT]
        arrivals = [comm.Irecv(table[r], r, TAG_ARRIVE) for r in others]
        if not _wait(arrivals, deadline):
            arrived = [r for r, req in zip(others, arrivals, strict=True) if req.Test()]
            missing = sorted(set(others) - set(arrived))
            notice = np.zeros(size, dtype=np.int64)
            notice[missing] = 1
            for r in arrived:
                comm.Isend(notice, r, TAG_STALL)
            for req in arrivals:
                if not req.Test():
                    req.Cancel()
            raise StallError(missing, what, timeout)
        verdict[0] = int(table[:, -1].any() or (table[:, :-1] != table[ROOT, :-1]).any())
        _wait([comm.Ibcast(verdict, ROOT)], None)
    else:
        sent = comm.Isend(mine, ROOT, TAG_ARRIVE)
        late = deadline + 1.0 if deadline is not None else None  # let rank 0 name the missing first
        stalled = (lambda: comm.Iprobe(ROOT, TAG_STALL)) if deadline is not None else None
        if not _wait([comm.Ibcast(verdict, ROOT)], late, stalled):
            if comm.Iprobe(ROOT, TAG_STALL):
                notice = np.empty(size, dtype=np.int64)
                comm.Recv(notice, ROOT, TAG_STALL)
                raise StallError(np.flatnonzero(notice).tolist(), what, timeout)
            raise StallError([ROOT], what, timeout)
        sent.Wait()
        table = np.empty((size, mine.size), dtype=np.int64)
    if verdict[0]:
        comm.Bcast(table, ROOT)  # everyone knows something is off, so everyone is here
        _raise_for(comm, table, problem, describe)


def _raise_for(comm: MPI.Intracomm, table: np.ndarray, problem: Exception | None, describe: Any) -> None:
    """The same exception on every rank, from the table of every rank's row."""
    failed = np.flatnonzero(table[:, -1])
    if failed.size:
        reports = comm.allgather(None if problem is None else (type(problem), str(problem)))
        if problem is not None:
            raise problem
        kind, message = reports[failed[0]]
        raise kind(f"rank {failed[0]} rejected its input: {message}")
    for column, field in enumerate(FIELDS):
        values = table[:, column]
        if (values != values[0]).any():
            groups: dict[int, list[int]] = {}
            for r, value in enumerate(values.tolist()):
                groups.setdefault(value, []).append(r)
            detail = "; ".join(
                f"{describe(field, value)} on rank{'s' if len(ranks) > 1 else ''} "
                f"{', '.join(map(str, ranks))}"
                for value, ranks in groups.items()
            )
            hint = " (a rank skipped or repeated a call on this communicator)" if field == "call" else ""
            raise ValueError(f"hpcring.allreduce: ranks disagree on {field}: {detail}{hint}")
