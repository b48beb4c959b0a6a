"""The issue's program 1 through hpcring.Intracomm finishes, with MPI's answer and the user's own
message, at every thread level mpi4py can ask MPI for: funneled, serialized and multiple (below
MPI_THREAD_MULTIPLE every Iallreduce through the wrapper blocked, and the program ended in a
StallError on every rank). Each level is a job of its own (tests/dropin_job.py), at 2 and 3 ranks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import launch, launcher_env

JOB = str(Path(__file__).with_name("dropin_job.py"))


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("level", ["funneled", "serialized", "multiple"])
def test_program_1_finishes_at_every_thread_level(level: str, ranks: int) -> None:
    env = launcher_env()
    env["MPI4PY_RC_THREAD_LEVEL"] = level
    done = subprocess.run(
        [*launch(ranks), sys.executable, JOB], capture_output=True, text=True, timeout=120, env=env
    )
    output = done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and len(rows) == ranks, output
    assert all(f"level={level} ok=1" in row for row in rows), output
