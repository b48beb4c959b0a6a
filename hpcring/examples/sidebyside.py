"""What the parallelism examples share: each trains one model on hpcring's group and on a gloo group
over the same ranks, times the steps the same way, and prints the same lines and table.

The digest line ("<example>: <run> on <backend>: weights <16 hex digits> ...") is printed by every
rank and is the same on every rank; the table (rank 0) gives the median step time of each backend
(the slowest rank's each step) and the largest difference between the weights the first and the
last backend's runs end with: what the tests compare (tests/test_strategy_examples.py).
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def need_torch(example: str) -> Any:
    """``torch``, or SystemExit saying how to install it."""
    try:
        import torch
    except ImportError as error:
        raise SystemExit(
            f"hpcring.examples.{example} needs PyTorch ({error}): "
            "pip install -e '.[torch]' in hpcring's clone"
        ) from None
    return torch


def timed_step(comm: Any, step: Callable[[], None]) -> float:
    """Seconds of one step on the slowest rank (the ranks start it together)."""
    from mpi4py import MPI

    comm.Barrier()
    began = time.perf_counter()
    step()
    return float(comm.allreduce(time.perf_counter() - began, op=MPI.MAX))


def digest(weights: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(weights).tobytes()).hexdigest()[:16]


def table(
    comm: Any,
    heading: str,
    backends: Sequence[str],
    rows: dict[str, dict[str, tuple[np.ndarray, list[float]]]],
) -> None:
    """Rank 0 prints ``heading`` and one row per run: the median step time on each backend and
    the largest difference between the first and the last backend's final weights."""
    if comm.rank != 0:
        return
    print(heading)
    print(
        "| run | "
        + " | ".join(f"{b} (ms per step)" for b in backends)
        + " | max abs difference of the weights |"
    )
    print("| --- | " + " | ".join("---" for _ in backends) + " | --- |")
    for name, runs in rows.items():
        ms = [f"{1e3 * statistics.median(runs[b][1]):.2f}" for b in backends]
        difference = float(np.max(np.abs(runs[backends[0]][0] - runs[backends[-1]][0])))
        print(f"| {name} | " + " | ".join(ms) + f" | {difference:.3g} |")


__all__ = ["digest", "need_torch", "table", "timed_step"]
