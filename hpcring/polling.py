"""Waiting on MPI requests without holding a core that another rank needs.

Ranks often outnumber cores (a laptop, an oversubscribed CI node), and a rank that spins
in MPI's wait takes the core from the rank it waits for.
"""

from __future__ import annotations

import time
from typing import Any


def idle_barrier(comm: Any) -> None:
    """A barrier that sleeps between polls: ranks waiting here leave the cores to those at work."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.0005)
