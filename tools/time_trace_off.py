"""Time per call of a tiny ring all-reduce, to show that tracing costs nothing when off.

Run it on the code before and after a change (PYTHONPATH picks the copy) and compare:
    mpiexec -n 2 python tools/time_trace_off.py
Prints, on rank 0, the median over repeats of the mean time per call, with check on and off.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import hpcring


def per_call(x: np.ndarray, out: np.ndarray, check: bool, calls: int) -> float:
    comm = MPI.COMM_WORLD
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        hpcring.allreduce(x, algorithm="ring", check=check, out=out)  # out of place: no overflow
    comm.Barrier()
    return (time.perf_counter() - start) / calls


def traced_cost(x: np.ndarray, out: np.ndarray, calls: int) -> None:
    """For comparison: the same call with tracing on (events dropped after each run)."""
    trace = sys.modules.get("hpcring.tracing") or sys.modules.get("hpcring.trace")  # before the rename too
    if trace is None or not hasattr(trace, "hooked"):
        return  # the code before tracing
    assert not trace.hooked(), "tracing is off, yet a traced method is installed"
    tracer = trace.start()
    times = []
    for _ in range(7):
        times.append(per_call(x, out, False, calls))
        tracer.events.clear()
    trace._install(False)
    trace.TRACER = trace.NullTracer()
    if MPI.COMM_WORLD.rank == 0:
        print(f"tracing on: check=False: median {statistics.median(times) * 1e6:.2f} us/call")
        print("tracing off: Channel/Op methods are the plain functions:", not trace.hooked())


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    x, out = np.ones(16, dtype=np.float32), np.empty(16, dtype=np.float32)
    for check in (False, True):
        per_call(x, out, check, 200)  # warm-up: plans, scratch, duplicated communicator
        times = [per_call(x, out, check, calls) for _ in range(7)]
        if MPI.COMM_WORLD.rank == 0:
            print(
                f"{hpcring.__file__}: check={check}: median {statistics.median(times) * 1e6:.2f} us/call, "
                f"min {min(times) * 1e6:.2f} us/call ({calls} calls x 7, {MPI.COMM_WORLD.size} ranks)"
            )
    traced_cost(x, out, max(1, calls // 10))


if __name__ == "__main__":
    main()
