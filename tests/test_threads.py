"""Threads: one communicator per thread works (NumPy and CuPy); two threads on one communicator
get an error."""

from __future__ import annotations

import importlib
import threading
import time
from contextlib import nullcontext

import numpy as np
import pytest
from helpers import BACKENDS, everywhere
from mpi4py import MPI

import hpcring
from hpcring.comm import state_of

# What a thread may do does not change with the number of ranks: one count (tests/conftest.py).
pytestmark = [pytest.mark.mpi, pytest.mark.one_count]
WORLD = MPI.COMM_WORLD


@pytest.mark.skipif(MPI.Query_thread() < MPI.THREAD_MULTIPLE, reason="needs MPI_THREAD_MULTIPLE")
@pytest.mark.parametrize("array", BACKENDS)
def test_two_threads_two_communicators(array: str) -> None:
    """Each thread its own communicator, at once; on CuPy with host staging, each thread its
    own pinned buffers too (shared ones mixed the two threads' data)."""
    xp = np if array == "numpy" else importlib.import_module("cupy")
    device = hpcring.select_device() if array == "cupy" else None
    comms = [WORLD.Dup(), WORLD.Dup()]
    results: dict[int, bool] = {}

    def work(index: int) -> None:
        ok = True
        with nullcontext() if device is None else xp.cuda.Device(device):  # the device is per thread
            for call in range(40):
                x = xp.full(1000 + index, WORLD.rank + call, dtype=np.float64)
                algorithm = hpcring.ALGORITHMS[call % len(hpcring.ALGORITHMS)]
                hpcring.allreduce(x, comm=comms[index], algorithm=algorithm)
                ok &= bool((x == WORLD.size * (WORLD.size - 1) / 2 + WORLD.size * call).all())
        results[index] = ok

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert everywhere(WORLD, results == {0: True, 1: True})
    for comm in comms:
        comm.Free()


@pytest.mark.skipif(MPI.Query_thread() < MPI.THREAD_MULTIPLE, reason="needs MPI_THREAD_MULTIPLE")
def test_second_thread_on_busy_communicator_is_refused() -> None:
    """Rank 0 joins late, so every other rank's first call is still waiting when a second thread tries."""
    if WORLD.size == 1:
        pytest.skip("a single rank never waits")
    comm = WORLD.Dup()
    hpcring.allreduce(np.ones(1), comm=comm)  # the private duplicate exists: no Dup in the way
    busy = state_of(comm).busy
    x = np.full(100, float(WORLD.rank))
    refused: list[str] = []

    def intruder() -> None:
        deadline = time.monotonic() + 10
        while not busy.locked() and time.monotonic() < deadline:
            time.sleep(0.001)  # until the main thread's call is under way
        try:
            hpcring.allreduce(np.ones(100), comm=comm, timeout=5)
        except (RuntimeError, hpcring.StallError) as error:
            refused.append(str(error))

    if WORLD.rank == 0:
        time.sleep(2.0)
        hpcring.allreduce(x, comm=comm)
    else:
        second = threading.Thread(target=intruder)
        second.start()
        hpcring.allreduce(x, comm=comm)
        second.join()
    ok = (x == WORLD.size * (WORLD.size - 1) / 2).all()
    ok &= WORLD.rank == 0 or (len(refused) == 1 and "another thread" in refused[0])
    assert everywhere(WORLD, ok)
    comm.Free()
