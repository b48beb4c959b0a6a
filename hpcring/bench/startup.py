"""What the first call costs an embedding code: measured before the bench imports hpcring's engine.

`python -m hpcring.bench` starts here (``__main__``), with only the ``hpcring`` package itself and
NumPy and mpi4py imported: the ranks meet at a barrier, time a bare ``MPI_Allreduce`` (their first
on the world communicator), meet again, then time the import of hpcring's engine and its first
``hpcring.allreduce`` (``algorithm="auto"``, checked, a (12, 2) float64 array in place: a solver's
residuals). Each figure is the slowest rank's. The header prints them, ``--startup`` alone, and
docs/embedding.md explains them.
"""

from __future__ import annotations

import importlib
import time
from typing import Any

import numpy as np
from mpi4py import MPI


def first_call(comm: Any = None) -> dict[str, float]:
    """Seconds, max over ranks: the bare first MPI_Allreduce, hpcring's import and first
    all-reduce together, and the second of each (collective on ``comm``, COMM_WORLD by default)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    x = np.arange(24, dtype=np.float64).reshape(12, 2)
    y = x.copy()
    comm.Barrier()
    start = time.perf_counter()
    comm.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM)
    bare = time.perf_counter() - start
    start = time.perf_counter()
    comm.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM)
    bare_second = time.perf_counter() - start
    comm.Barrier()
    start = time.perf_counter()
    allreduce = importlib.import_module("hpcring").allreduce  # what it loads, as a user's first use
    imported = time.perf_counter() - start
    allreduce(x, algorithm="auto")
    first = time.perf_counter() - start
    start = time.perf_counter()
    allreduce(x, algorithm="auto")
    second = time.perf_counter() - start
    worst = np.array([bare, bare_second, imported, first, second])
    comm.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)
    names = ("bare_first", "bare_second", "import", "first", "second")
    return dict(zip(names, worst.tolist(), strict=True))


def describe(facts: dict[str, float]) -> str:
    """The header's line."""
    return (
        f"# first call: hpcring's import and first auto all-reduce (12x2 float64, in place) "
        f"{1e3 * facts['first']:.1f} ms (import {1e3 * facts['import']:.1f} ms), "
        f"the bare first MPI_Allreduce {1e3 * facts['bare_first']:.3f} ms: "
        f"{1e3 * (facts['first'] - facts['bare_first']):.1f} ms more; "
        f"second calls {1e6 * facts['second']:.1f} us and {1e6 * facts['bare_second']:.1f} us"
    )
