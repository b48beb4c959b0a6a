"""A short soak in CI: mixed sizes, dtypes and algorithms, no wrong element, no memory growth."""

from __future__ import annotations

import pytest
from helpers import everywhere
from mpi4py import MPI

from hpcring import soak


@pytest.mark.mpi
def test_short_soak() -> None:
    assert everywhere(MPI.COMM_WORLD, soak.main(["--calls", "600", "--warmup", "200"]) == 0)
