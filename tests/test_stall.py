"""A rank that never arrives becomes a StallError on the others, naming it, instead of a hang."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import everywhere
from mpi4py import MPI

import hpcring
from hpcring import config

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
TIMEOUT = 2.0


@pytest.mark.parametrize("skipper", ["last", "first"])
@pytest.mark.parametrize("algorithm", ["ring", "ps"])
def test_rank_skips_the_call(skipper: str, algorithm: str) -> None:
    if WORLD.size == 1:
        pytest.skip("needs a rank to miss")
    missing = WORLD.size - 1 if skipper == "last" else 0
    comm = WORLD.Dup()
    hpcring.allreduce(np.ones(4), comm=comm)  # warm: the duplicate exists on every rank
    ok = True
    if WORLD.rank != missing:
        start = time.monotonic()
        try:
            hpcring.allreduce(np.ones(1000), comm=comm, algorithm=algorithm, timeout=TIMEOUT)
            ok = False
        except hpcring.StallError as error:
            elapsed = time.monotonic() - start
            ok = error.missing == [missing] and f"rank {missing} did not arrive" in str(error)
            ok &= TIMEOUT - 0.1 <= elapsed <= TIMEOUT + 2.0
            ok &= isinstance(error, TimeoutError)
    assert everywhere(WORLD, ok)
    comm.Free()


def test_timeout_from_environment(monkeypatch) -> None:
    from hpcring.api import default_timeout

    monkeypatch.setenv("HPCRING_TIMEOUT", "7.5")
    config.reload()
    assert default_timeout() == 7.5
    monkeypatch.setenv("HPCRING_TIMEOUT", "soon")
    config.reload()
    with pytest.raises(ValueError, match="HPCRING_TIMEOUT"):
        default_timeout()
