"""Device selection: the pure modulo rule, the node-local rank, and select_device without a GPU;
`--device gpu` where there is none.

Also the guard for launchers that start singletons (srun --mpi=pmi2 exits 0 with N
worlds of size 1): with HPCRING_EXPECT_RANKS set, as jobs/test.slurm does, the world
must have exactly that many ranks.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import everywhere, launcher_env, mpiexec, needs_gpu
from mpi4py import MPI

import hpcring
from hpcring import config
from hpcring.arrays import available
from hpcring.gpu import gpu_problem, local_device, node_local_rank


@pytest.mark.parametrize(
    ("local_rank", "count", "expected"),
    [(0, 8, 0), (7, 8, 7), (8, 8, 0), (13, 8, 5), (3, 1, 0), (0, 0, None), (5, 0, None)],
)
def test_local_device(local_rank: int, count: int, expected: int | None) -> None:
    assert local_device(local_rank, count) == expected


def test_local_device_rejects_negative_rank() -> None:
    with pytest.raises(ValueError, match="local_rank"):
        local_device(-1, 8)


def test_select_device_is_exported() -> None:
    assert hpcring.select_device is not None
    assert "select_device" in hpcring.__all__


@pytest.mark.mpi
def test_node_local_rank_matches_host_names() -> None:
    comm = MPI.COMM_WORLD
    hosts = comm.allgather(MPI.Get_processor_name())
    # Expected: position among the ranks that report the same host, in world-rank order.
    expected = hosts[: comm.rank].count(hosts[comm.rank])
    assert everywhere(comm, node_local_rank(comm) == expected)


@pytest.mark.mpi
def test_node_local_rank_of_a_split_communicator() -> None:
    world = MPI.COMM_WORLD
    sub = world.Split(world.rank % 2, world.rank)
    try:
        hosts = sub.allgather(MPI.Get_processor_name())
        expected = hosts[: sub.rank].count(hosts[sub.rank])
        assert everywhere(world, node_local_rank(sub) == expected)
    finally:
        sub.Free()


@pytest.mark.mpi
def test_select_device_without_gpu_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = MPI.COMM_WORLD
    if "cupy" in available():
        monkeypatch.setenv("HPCRING_DEVICE", "cpu")  # on a GPU machine, the CPU switch must win
        config.reload()
    assert everywhere(comm, hpcring.select_device(comm) is None)


@pytest.mark.mpi
@pytest.mark.gpu
@needs_gpu
def test_select_device_with_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy

    monkeypatch.delenv("HPCRING_DEVICE", raising=False)
    config.reload()
    comm = MPI.COMM_WORLD
    device = hpcring.select_device(comm)
    expected = node_local_rank(comm) % cupy.cuda.runtime.getDeviceCount()
    assert everywhere(comm, device == expected and cupy.cuda.Device().id == expected)


@pytest.mark.mpi
@pytest.mark.skipif("HPCRING_EXPECT_RANKS" not in os.environ, reason="set by jobs/test.slurm")
def test_world_has_the_expected_ranks() -> None:
    expected = int(os.environ["HPCRING_EXPECT_RANKS"])
    assert MPI.COMM_WORLD.Get_size() == expected, (
        f"the launcher started a world of {MPI.COMM_WORLD.Get_size()} ranks, expected {expected}: "
        "(1 means singletons: use srun --mpi=pmix or mpirun)"
    )


@pytest.mark.gpu  # runs everywhere; marked so that tests/gpu/check.sh runs it where it matters
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
@pytest.mark.parametrize(("example", "short"), [("train", "--max-steps"), ("overlap", "--steps")])
def test_examples_on_gpu_where_a_rank_has_none_say_why(example: str, short: str) -> None:
    """`--device gpu` with rank 1 told HPCRING_DEVICE=cpu (on a machine without CuPy or a GPU,
    both ranks lack one): every rank exits with the reason, not a CUDA traceback or a hang
    (on a GPU machine, rank 0 went on into the training alone)."""
    program = [sys.executable, "-m", f"hpcring.examples.{example}", "--device", "gpu", short, "1"]
    launcher = [mpiexec() or "mpiexec", "-n", "1", *program, ":", "-n", "1", "env", "HPCRING_DEVICE=cpu"]
    done = subprocess.run(
        [*launcher, *program], capture_output=True, text=True, timeout=120, env=launcher_env()
    )
    here = gpu_problem()
    said = f"{here} (rank 0; 2 of 2 ranks)" if here else "HPCRING_DEVICE=cpu is set (rank 1; 1 of 2 ranks)"
    assert done.returncode != 0
    assert done.stderr.count(f"--device gpu: {said}") == 2, done.stderr
    assert "Traceback" not in done.stderr
