"""The job pre-flight: a record of where every rank runs, and the world-size check."""

from __future__ import annotations

import pytest
from helpers import everywhere
from mpi4py import MPI

from hpcring import jobenv

pytestmark = pytest.mark.mpi


def test_record_of_a_right_sized_world() -> None:
    comm = MPI.COMM_WORLD
    facts, problem = jobenv.record(comm, comm.Get_size())
    assert everywhere(comm, problem is None)
    if comm.Get_rank() == 0:
        assert facts is not None
        assert facts["world_size"] == comm.Get_size()
        assert [r["rank"] for r in facts["ranks"]] == list(range(comm.Get_size()))
        assert {r["device"] for r in facts["ranks"]} <= {"cpu"} | {f"gpu {i}" for i in range(64)}
        name, version = facts["info"]["mpi_library"].rsplit(" ", 1)  # "Open MPI v5.0.11", "MPICH 5.0.2"
        assert facts["mpi_library_version"].startswith(name) and version in facts["mpi_library_version"]
        assert "  " not in name and "Version" not in name
        assert "\x00" not in facts["mpi_library_version"]
    else:
        assert facts is None


def test_wrong_world_size_fails_on_every_rank() -> None:
    comm = MPI.COMM_WORLD
    _, problem = jobenv.record(comm, comm.Get_size() + 1)
    assert everywhere(comm, problem is not None and "expected" in problem)
