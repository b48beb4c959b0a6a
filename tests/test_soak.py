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
def test_fault_soak() -> None:
    """Mixed calls with a fault every 10th: a mismatch (count, dtype or op) on one rank raises
    ValueError on every rank and leaves the communicator usable; a skip raises StallError on the
    others and work goes on on a fresh duplicate. No wrong element anywhere."""
    import time

    import numpy as np

    import hpcring

    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("needs a rank to differ")
    comm, odd, ok, faults = world.Dup(), world.size - 1, True, ["count", "dtype", "op", "skip"]
    rng = np.random.default_rng(7)  # the same sequence on every rank
    for call in range(1, 41):
        algorithm = ["ring", "rabenseifner", "naive", "ps", "mpi"][int(rng.integers(5))]
        n = int(rng.integers(1, 3000))
        fault = faults[(call // 10) - 1] if call % 10 == 0 else None
        x = np.full(n, world.rank + 1, dtype=np.float64)
        op = "sum"
        if fault and world.rank == odd:
            if fault == "count":
                x = np.ones(n + 1)
            elif fault == "dtype":
                x = x.astype(np.float32)
            elif fault == "op":
                op = "max"
        try:
            if fault == "skip" and world.rank == odd:
                time.sleep(2.5)  # the others give up after 1 s and listen 1 s
                comm = world.Dup()
                continue
            hpcring.allreduce(x, comm=comm, op=op, algorithm=algorithm, timeout=1.0)
            ok &= fault is None and bool((x == world.size * (world.size + 1) / 2).all())
        except ValueError as error:
            ok &= fault in ("count", "dtype", "op") and "disagree" in str(error)
        except hpcring.StallError as error:
            ok &= fault == "skip" and error.missing == [odd]
            comm = world.Dup()  # a StallError ends that communicator
    assert everywhere(world, ok)
