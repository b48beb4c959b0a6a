"""A rank that raises ends the whole job quickly, with a non-zero status and one traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from helpers import launch, launcher_env

SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from mpi4py import MPI
    import hpcring

    @hpcring.aborting
    def main():
        comm = MPI.COMM_WORLD
        if comm.rank == comm.size - 1:
            raise RuntimeError("boom on the last rank")
        x = np.ones(4)
        hpcring.allreduce(x)  # the others wait here for the rank that died
        print("unreachable", flush=True)

    main()
    """
)


@pytest.mark.parametrize("ranks", [2, 3])
def test_one_rank_raises_job_ends(tmp_path, ranks: int) -> None:
    script = tmp_path / "crash.py"
    script.write_text(SCRIPT)
    start = time.monotonic()
    done = subprocess.run(
        [*launch(ranks), sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env=launcher_env(),
    )
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert elapsed < 20, f"job took {elapsed:.1f}s to end"
    output = done.stdout + done.stderr
    assert output.count("boom on the last rank") >= 1
    assert output.count(f"rank {ranks - 1} failed, aborting") == 1
    assert "unreachable" not in output
