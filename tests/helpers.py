"""Small helpers shared by the MPI tests: agreement on verdicts, result hashes."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from mpi4py import MPI


def everywhere(comm: MPI.Intracomm, ok: bool) -> bool:
    """True when ``ok`` holds on every rank, so all ranks assert the same thing and none hangs."""
    return bool(comm.allreduce(bool(ok), op=MPI.LAND))


def digest(array: Any) -> str:
    """A hash of the result's bytes, for bitwise comparison across ranks."""
    host = array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else array
    return hashlib.sha256(np.ascontiguousarray(host).tobytes()).hexdigest()


def identical_everywhere(comm: MPI.Intracomm, array: Any) -> bool:
    """True when ``array`` has the same bytes on every rank of ``comm``."""
    hashes = comm.allgather(digest(array))
    return len(set(hashes)) == 1
