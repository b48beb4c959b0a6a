"""Calibration and validation under mpiexec, at any rank count: the file they write is valid.

One rank cannot ping-pong: there the calibration must fail clearly (exit status 2, no
file), on every rank alike. Every verdict is agreed across ranks so no rank hangs.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from helpers import everywhere
from mpi4py import MPI

import hpcring
from hpcring.model.cli import main
from hpcring.model.costs import ModelError, Params
from hpcring.model.params import load_params, save_params

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD


@pytest.fixture
def shared_dir():
    """A temporary directory, the same path on every rank (they share one file system here)."""
    path = WORLD.bcast(tempfile.mkdtemp(prefix="hpcring-model-") if WORLD.rank == 0 else None)
    yield Path(path)
    WORLD.Barrier()
    if WORLD.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def test_calibration_writes_a_valid_file(shared_dir: Path) -> None:
    output = shared_dir / "model.json"
    start = time.monotonic()
    code = main(["--calibrate", "--quick", "--output", str(output)])
    assert everywhere(WORLD, time.monotonic() - start < 10), "quick calibration took over 10 s"
    if WORLD.size == 1:
        assert everywhere(WORLD, code == 2 and not output.exists()), "1 rank: expected exit 2 and no file"
        return
    assert everywhere(WORLD, code == 0), "calibration failed"
    try:
        params = load_params(output)
        ok = all(0 < v < 1 for v in (params.alpha, params.beta, params.gamma)) and params.cores >= 1
        ok = ok and params.meta.get("core") == hpcring.info()["core"]  # whose step cost busy.alpha is
        busy = params.busy.get(WORLD.size)  # all ranks exchanging and adding at once
        ok = ok and busy is not None and all(0 < v < 1 for v in (busy.alpha, busy.beta, busy.gamma))
        ok = ok and busy is not None and 0 <= busy.call < 1 and 0 <= busy.cold < 1
        # hpcring's software apart, for the rank counts and machines the busy figures do not cover
        ok = ok and busy is not None and busy.step is not None and busy.overhead is not None
        ok = ok and busy is not None and 0 <= busy.step < busy.alpha + 1e-9 and 0 <= busy.overhead < 1
        ok = ok and params.software is not None and params.software[0] == WORLD.size
        partial = params.partial.get(WORLD.size)  # 2 (of 3 or 4) at work while the others wait
        ok = ok and (partial is not None) == (WORLD.size >= 3)
        ok = ok and (partial is None or all(0 < v < 1 for v in (partial.alpha, partial.beta, partial.gamma)))
    except ModelError:
        ok = False
    assert everywhere(WORLD, ok), "the calibration file does not load as valid parameters"


def test_validate_runs_and_agrees_on_errors(shared_dir: Path) -> None:
    params = shared_dir / "given.json"
    if WORLD.rank == 0:
        save_params(Params(1e-6, 1e-10, 1e-10, cores=2), params)
    WORLD.Barrier()
    code = main(["--validate", "--params", str(params), "--sizes", "64K", "--iterations", "1"])
    assert everywhere(WORLD, code == 0)
    code = main(["--validate", "--params", str(shared_dir / "absent.json")])
    assert everywhere(WORLD, code == 2)


def test_a_problem_on_one_rank_stops_every_rank_before_measuring(shared_dir: Path) -> None:
    """Checked and agreed before any collective: an array module this machine lacks (it hung:
    rank 0 failed in its gamma while the others waited in the broadcast after it), and a
    parameter file that only one rank fails to read (it hung in validate's barrier)."""
    from hpcring.arrays import available

    missing = next((a for a in ("cupy", "numpy") if a not in available()), None)
    if missing is not None and WORLD.size > 1:
        output = shared_dir / "m.json"
        code = main(["--calibrate", "--quick", "--array", missing, "--output", str(output)])
        assert everywhere(WORLD, code == 2 and not output.exists())
    params = shared_dir / "given.json"
    if WORLD.rank == 0:
        save_params(Params(1e-6, 1e-10, 1e-10, cores=2), params)
    WORLD.Barrier()
    mine = params if WORLD.rank < WORLD.size - 1 or WORLD.size == 1 else shared_dir / "absent.json"
    code = main(["--validate", "--params", str(mine), "--sizes", "4K", "--iterations", "1"])
    assert everywhere(WORLD, code == (0 if WORLD.size == 1 else 2))
