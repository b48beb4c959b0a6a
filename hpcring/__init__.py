"""hpcring: gradient all-reduce over MPI, with naive, parameter-server and ring algorithms."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from .algorithms import REGISTRY as _REGISTRY
from .api import allreduce
from .errors import StallError, abort_on_error, aborting
from .trace import from_environment as _trace_from_environment
from .trace import trace

ALGORITHMS: tuple[str, ...] = tuple(_REGISTRY)


def info() -> dict[str, Any]:
    """What this process runs on: versions, MPI thread level, array backends, CUDA-aware mode."""
    import mpi4py
    from mpi4py import MPI

    from .backend import available_backends, cuda_aware

    levels = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    aware, reason = cuda_aware()
    return {
        "hpcring": __version__,
        "mpi4py": mpi4py.__version__,
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0].split(",")[0],
        "mpi_standard": "{}.{}".format(*MPI.Get_version()),
        "thread_level": levels.get(MPI.Query_thread(), "unknown"),
        "backends": available_backends(),
        "cuda_aware": aware,
        "cuda_aware_reason": reason,
        "algorithms": list(ALGORITHMS),
    }


__all__ = [
    "ALGORITHMS",
    "StallError",
    "__version__",
    "abort_on_error",
    "aborting",
    "allreduce",
    "info",
    "trace",
]

_trace_from_environment()  # HPCRING_TRACE=path: trace this process, write the file at exit
