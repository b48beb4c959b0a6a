"""Overlapping send and receive buffers through hpcring.Intracomm do what they do through mpi4py,
on each MPI as it really behaves: Open MPI reduces them, MPICH aborts the job. A serial test: an
abort ends the whole job, so each call runs in a 2-rank job of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import launch, launcher_env, mpiexec, open_mpi

# Rank r sends x[1:] and receives into x[:8]: one element apart, the same count.
JOB = """
import sys
import numpy as np
from mpi4py import MPI
import hpcring

x = np.arange(9, dtype=np.float64) * (MPI.COMM_WORLD.rank + 1)
comm = hpcring.Intracomm(MPI.COMM_WORLD, algorithm="mpi") if sys.argv[1] == "hpcring" else MPI.COMM_WORLD
comm.Allreduce(x[1:], x[:8], op=MPI.SUM)
print("RESULT", MPI.COMM_WORLD.rank, x.tolist(), flush=True)
"""

# MPICH's datatype engine (yaksa) checks its memcpy arguments and fails an assertion, which aborts.
MPICH_ABORT = "memcpy argument memory ranges overlap"


def job(caller: str) -> tuple[int, str]:
    """(exit status, output) of the 2-rank job that makes the overlapping call through ``caller``."""
    done = subprocess.run(
        [*launch(2), sys.executable, "-c", JOB, caller],
        capture_output=True,
        text=True,
        timeout=120,
        env=launcher_env(),
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_overlapping_buffers_do_what_mpi_does_per_library() -> None:
    (plain_status, plain), (ours_status, ours) = job("mpi4py"), job("hpcring")
    if open_mpi():  # reduced as if the send buffer had been read first: 3 * x[1:], x[8] untouched
        total = [3.0 * i for i in range(1, 9)]
        want = [f"RESULT 0 {[*total, 8.0]}", f"RESULT 1 {[*total, 16.0]}"]
        for status, output in ((plain_status, plain), (ours_status, ours)):
            assert status == 0, output
            assert sorted(line for line in output.splitlines() if line.startswith("RESULT ")) == want, output
    else:
        for status, output in ((plain_status, plain), (ours_status, ours)):
            assert status != 0 and MPICH_ABORT in output, output
            assert "RESULT" not in output, output
