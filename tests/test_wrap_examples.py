"""The cg and nbody examples at 2 ranks, with and without ``--hpcring``: the same result line, bit
for bit (algorithm mpi underneath), and a time line each. A serial test: it launches the jobs
itself (as the bench's command-line tests do)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import launcher_env, mpiexec

EXAMPLES = {
    "cg": ["--rows", "50", "--repeat", "1"],
    "nbody": ["--steps", "200"],
}


def run(example: str, *flags: str) -> list[str]:
    command = [mpiexec() or "mpiexec", "--oversubscribe", "-n", "2", sys.executable, "-m"]
    done = subprocess.run(
        [*command, f"hpcring.examples.{example}", *EXAMPLES[example], *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=launcher_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_prints_the_same_result_with_and_without_hpcring(example: str) -> None:
    plain, wrapped = run(example), run(example, "--hpcring")
    assert len(plain) == len(wrapped) == 2, (plain, wrapped)
    assert plain[0].startswith(f"{example}: ") and " on 2 ranks" in plain[0]
    assert plain[0] == wrapped[0]
    assert plain[1].startswith("time: ") and plain[1].endswith("via MPI")
    assert wrapped[1].startswith("time: ") and wrapped[1].endswith("via hpcring.Intracomm (algorithm mpi)")
