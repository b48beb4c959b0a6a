"""All-reduce algorithms, one module each, registered here by name.

Each module exposes ``allreduce(ch, src, dst, op)``: ``ch`` is a `hpcring.channel.Channel`,
``src`` and ``dst`` are flat arrays of equal length (``dst`` may be ``src``: in place),
``op`` a `hpcring.ops.Op` other than mean. On return ``dst`` holds the reduction of
every rank's ``src``, bitwise identical on all ranks.
"""

from __future__ import annotations

from collections.abc import Callable

from . import mpi, naive, ps, rabenseifner, ring

Algorithm = Callable[..., None]

REGISTRY: dict[str, Algorithm] = {
    "naive": naive.allreduce,
    "ps": ps.allreduce,
    "ring": ring.allreduce,
    "rabenseifner": rabenseifner.allreduce,
    "mpi": mpi.allreduce,
}


def get(name: str) -> Algorithm:
    """The algorithm called ``name``; ValueError listing the valid names otherwise."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"hpcring.allreduce: unknown algorithm {name!r}; choose one of {', '.join(REGISTRY)}"
        ) from None


__all__ = ["REGISTRY", "Algorithm", "get"]
