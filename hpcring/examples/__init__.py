"""Runnable examples: `mpiexec -n 4 python -m hpcring.examples.train`."""

from __future__ import annotations

import time
from typing import Any


def first_call(make: Any, hpcring: bool, algorithm: str, check: bool) -> tuple[Any, str]:
    """The communicator an mpi4py example runs on (``make(comm)`` where ``hpcring``: the one-line
    change) and, in words, what its first all-reduce cost, the communicator's making (hpcring's
    import with it) included: the cost an embedding code pays once, beside MPI's own."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    comm.Barrier()
    start = time.perf_counter()
    if hpcring:
        comm = make(comm, algorithm=algorithm, check=check)
    comm.Allreduce(MPI.IN_PLACE, np.zeros(1), op=MPI.SUM)
    took = MPI.COMM_WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX)
    via = "hpcring's import, hpcring.Intracomm and its" if hpcring else "MPI's"
    return comm, f"first call: {1e3 * took:.2f} ms ({via} first Allreduce)"
