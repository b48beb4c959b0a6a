"""A short soak in CI: mixed sizes, dtypes and algorithms, no wrong element, no memory growth."""

from __future__ import annotations

import pytest
from helpers import everywhere
from mpi4py import MPI

from hpcring import soak


@pytest.mark.mpi
def test_short_soak() -> None:
    assert everywhere(MPI.COMM_WORLD, soak.main(["--calls", "600", "--warmup", "200"]) == 0)


@pytest.mark.mpi
@pytest.mark.waits_out
def test_fault_soak() -> None:
    """`python -m hpcring.soak --faults`, small: every 25th call one rank (in turn) passes another
    count, dtype or op (a ValueError on every rank, the communicator usable after it) or skips
    the call (a StallError naming it on the others, then a fresh duplicate); no wrong element,
    no memory growth. One rank has no other to disagree with: the soak runs plain there."""
    args = ["--faults", "--calls", "200", "--fault-every", "25", "--warmup", "50", "--timeout", "1"]
    assert everywhere(MPI.COMM_WORLD, soak.main(args) == 0)


@pytest.mark.mpi
def test_fault_soak_fails_where_a_fault_does_not_raise(monkeypatch, capsys) -> None:
    """The soak's check can fail: 'mismatches' that are none (the odd rank's arguments left as
    they were) complete, and the soak says so and exits 1 on every rank."""
    if MPI.COMM_WORLD.size == 1:
        pytest.skip("needs a rank to differ")
    monkeypatch.setattr(soak, "faulty", lambda x, op, fault: (x, op))
    code = soak.main(["--faults", "--calls", "20", "--fault-every", "10", "--warmup", "5"])  # count, dtype
    assert everywhere(MPI.COMM_WORLD, code == 1)
    if MPI.COMM_WORLD.rank == 0:
        assert "2 faults, 2 not raised as they should" in capsys.readouterr().out
