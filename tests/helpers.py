"""Small helpers shared by the MPI tests: agreement on verdicts, result hashes."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
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


def raises_everywhere(kind: type[Exception], match: str, call: Callable[[], object]) -> None:
    """``call()`` raises ``kind`` with ``match`` in its message on every rank of COMM_WORLD, quickly."""
    world = MPI.COMM_WORLD
    start = time.monotonic()
    try:
        call()
    except kind as error:
        ok = match in str(error)
    else:
        ok = False
    assert everywhere(world, ok), f"expected {kind.__name__} matching {match!r} on every rank"
    assert everywhere(world, time.monotonic() - start < 10)
