"""hierarchical at 6 ranks, beyond the 1-4 of the MPI test runs: nodes of 3 ranks (L > 2: the
reduce-scatter ring in the node takes two steps and each shard goes to two other ranks)
and 3 nodes, each job launched here with mpiexec, nodes forced by HPCRING_RANKS_PER_NODE."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import launch, launcher_env, mpiexec

SIX_RANKS = """
import os
import numpy as np
from mpi4py import MPI
import hpcring
from hpcring.algorithms import bytes_sent
from hpcring.comm import channel_for
from hpcring.arrays import adapter_for

world = MPI.COMM_WORLD
comm = world.Dup()
per_node = int(os.environ["HPCRING_RANKS_PER_NODE"])
bad = []
for n in (1, 5, 7, 1001, 300_007):
    for dtype in (np.float32, np.float64, np.int64):
        x = (np.random.default_rng(world.rank * 7 + n).standard_normal(n) * 100).astype(dtype)
        keep = x.copy()
        want = np.empty_like(x)
        world.Allreduce(x, want)
        ch = channel_for(comm, adapter_for(x))
        before = ch.bytes_sent
        out = np.empty_like(x)
        hpcring.allreduce(x, out=out, algorithm="hierarchical", comm=comm)
        sent = ch.bytes_sent - before
        expect = bytes_sent("hierarchical", n, x.itemsize, world.size, world.rank, per_node=per_node)
        exact = dtype is np.int64
        close = np.array_equal(out, want) if exact else np.allclose(out, want, rtol=1e-5, atol=1e-3)
        same = world.allgather(out.tobytes())
        if not (close and all(b == same[0] for b in same) and sent == expect and np.array_equal(x, keep)):
            bad.append((n, np.dtype(dtype).name, close, sent, expect))
bad = world.allgather(bad)
if world.rank == 0:
    print("BAD", bad if any(bad) else "none")
"""


@pytest.mark.parametrize(
    "per_node,inter",
    [("3", "ring"), ("2", "ring"), ("3", "rabenseifner")],
    ids=["2 nodes x 3", "3 nodes x 2", "2 nodes x 3, rabenseifner across"],
)
def test_six_ranks_more_than_two_per_node(per_node: str, inter: str) -> None:
    """6 ranks (beyond CI's 1-4): nodes of 3, and 3 nodes, with the ring across (in-node
    all-gather overlapped with it) or Rabenseifner across (all-gather after it); against
    MPI_Allreduce, bitwise identical everywhere, bytes = formula, input untouched."""
    if mpiexec() is None:
        pytest.skip("no mpiexec")
    env = {**launcher_env(), "HPCRING_RANKS_PER_NODE": per_node, "HPCRING_HIERARCHICAL_INTER": inter}
    run = subprocess.run(
        [*launch(6), sys.executable, "-c", SIX_RANKS],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "BAD none" in run.stdout, run.stdout[-3000:]
