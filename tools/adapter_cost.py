"""What an array kind adds to a call: `hpcring.allreduce` on COMM_SELF (no data moves), per kind.

    python tools/adapter_cost.py            # 1024 float32: NumPy, torch CPU, JAX (where installed)

Best of 5 runs of N calls each, in microseconds per call; in place and with ``out=``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import hpcring


def per_call(x: Any, calls: int, out: Any = None) -> float:
    """Microseconds per call, the best of 5 runs (after 50 calls that make it warm)."""
    for _ in range(50):
        hpcring.allreduce(x, comm=MPI.COMM_SELF, out=out)
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            hpcring.allreduce(x, comm=MPI.COMM_SELF, out=out)
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return min(runs)


def kinds(n: int) -> dict[str, tuple[Any, Callable[[], Any] | None]]:
    """Each installed kind's array of n float32, and how to make an out= for it (None: refused)."""
    made: dict[str, tuple[Any, Callable[[], Any] | None]] = {
        "NumPy array": (np.ones(n, np.float32), lambda: np.empty(n, np.float32))
    }
    try:
        import torch

        made["torch CPU tensor"] = (torch.ones(n), lambda: torch.empty(n))
    except ImportError:
        pass
    try:
        import jax.numpy as jnp

        made["jax.Array"] = (jnp.ones(n, jnp.float32), None)  # immutable: out= is refused
    except ImportError:
        pass
    return made


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--elements", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    print(f"| array ({args.elements} float32) | in place | out= |\n| --- | --- | --- |")
    for name, (x, make_out) in kinds(args.elements).items():
        calls = args.calls if make_out is not None else max(args.calls // 4, 1)
        inplace = per_call(x, calls)
        out = f"{per_call(x, calls, make_out()):.1f} us" if make_out is not None else "refused"
        print(f"| {name} | {inplace:.1f} us | {out} |")


if __name__ == "__main__":
    main()
