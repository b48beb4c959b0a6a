"""The test scripts (tests/launcher.sh) and the Python tests (helpers.launch) start ranks with the
same launch line for this MPI: Open MPI's mpiexec with --oversubscribe, MPICH's Hydra without."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import launch, launcher_env, mpiexec, open_mpi

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_shell_and_python_launch_alike() -> None:
    env = launcher_env()
    env["PATH"] = os.pathsep.join((str(Path(mpiexec()).parent), env["PATH"]))  # this MPI's mpiexec
    done = subprocess.run(
        ["bash", "-c", 'source tests/launcher.sh && echo "$MPI_FLAVOUR ${MPIEXEC[*]} -n 3"'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    flavour, *line = done.stdout.split()
    assert flavour == ("openmpi" if open_mpi() else "mpich")
    assert line == ["mpiexec", *launch(3)[1:]]
