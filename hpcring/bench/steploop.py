"""A simulation's step loop, the way embedding codes call hpcring: small all-reduces, uneven work.

Each step every rank computes for ``--work-us`` and one rank, in turn, for ``--late-us`` more
(load imbalance: the others wait for it), then all-reduces 24 float64 in place (192 bytes: an
N-body code's forces) and gathers one float64 per rank with MPI's own ``Allgather``, as such a
code also does. The all-reduce is, row by row: the bare ``comm.Allreduce``; ``hpcring.allreduce``
(``auto``, checked: the default); the same with ``check=False``; and a `hpcring.plan`. The rows
take turns pass by pass, so machine noise hits them alike, and each reports its median time per
step over the passes, and the ratio to the bare row's. The loop runs on a quiet node, then beside
``--busy`` processes that spin on this host (``python -c "while True: pass"``, started by rank 0),
where every collective costs a scheduling round: more ranks than cores, or a shared node.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import hpcring

from .. import persistent

COUNT = 24  # float64: 192 bytes


def _spin(seconds: float) -> None:
    """Work that holds the core (the simulation's own arithmetic), not a sleep."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _rows(comm: MPI.Intracomm, force: np.ndarray) -> dict[str, Callable[[], Any]]:
    plan = persistent.plan(force, algorithm="auto", comm=comm)
    return {
        "MPI_Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, force, op=MPI.SUM),
        "hpcring": lambda: hpcring.allreduce(force, algorithm="auto", comm=comm),
        "check=False": lambda: hpcring.allreduce(force, algorithm="auto", comm=comm, check=False),
        "plan": plan,
    }


def _loop(comm: MPI.Intracomm, call: Callable[[], Any], force: np.ndarray, steps: int, args: Any) -> float:
    """Seconds per step of ``steps`` steps, the slowest rank's."""
    rank, size = comm.Get_rank(), comm.Get_size()
    gathered = np.empty(size)
    mine = np.empty(1)
    comm.Barrier()
    start = time.perf_counter()
    for step in range(steps):
        _spin(1e-6 * (args.work_us + (args.late_us if step % size == rank else 0.0)))
        force.fill(1.0)
        call()
        mine[0] = force[0]
        comm.Allgather(mine, gathered)
    elapsed = time.perf_counter() - start
    return comm.allreduce(elapsed, op=MPI.MAX) / steps


def _busy(count: int, comm: MPI.Intracomm) -> list[subprocess.Popen[bytes]]:
    """``count`` spinning processes on rank 0's host."""
    made = []
    if comm.Get_rank() == 0:
        for _ in range(count):
            made.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
    comm.Barrier()
    time.sleep(0.2)  # let the scheduler see them
    return made


def run(args: Any, comm: MPI.Intracomm | None = None) -> dict[str, dict[str, float]]:
    """The table, quiet then busy: {setting: {row: median seconds per step}} (rank 0 prints it)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    force = np.ones(COUNT)
    rows = _rows(comm, force)
    for call in rows.values():  # first calls and auto's choice, outside the timing
        for _ in range(3):
            force.fill(1.0)
            call()
    settings = [("quiet", 0)] + ([(f"beside {args.busy} busy", args.busy)] if args.busy else [])
    results: dict[str, dict[str, float]] = {}
    for name, busy in settings:
        spinners = _busy(busy, comm)
        try:
            times: dict[str, list[float]] = {row: [] for row in rows}
            for _ in range(args.passes):
                for row, call in rows.items():
                    times[row].append(_loop(comm, call, force, args.steps, args))
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
        results[name] = {row: statistics.median(values) for row, values in times.items()}
    if comm.Get_rank() == 0:
        print(describe(results, comm.Get_size(), args), flush=True)
    return results


def describe(results: dict[str, dict[str, float]], size: int, args: Any) -> str:
    """The table: us per step per row and setting, and each row's ratio to the bare one."""
    lines = [
        f"# step loop: {size} ranks, {args.steps} steps of {args.work_us:g} us of work (one rank "
        f"{args.late_us:g} us more, in turn), an in-place all-reduce of {COUNT} float64 "
        f"({8 * COUNT} B) and an MPI_Allgather; median of {args.passes} passes, rows in turns",
        f"# {'setting':<18} " + " ".join(f"{row:>22}" for row in next(iter(results.values()))),
    ]
    for name, row in results.items():
        bare = row["MPI_Allreduce"]
        cells = [f"{1e6 * t:.1f} us ({t / bare:.2f}x)" for t in row.values()]
        lines.append(f"  {name:<18} " + " ".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)
