"""hpcring: gradient all-reduce over MPI, with naive, parameter-server and ring algorithms."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from .algorithms import REGISTRY as _REGISTRY
from .api import allreduce
from .errors import StallError, abort_on_error, aborting

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
        "iallreduce_progress": _progress_mode(),
    }


__all__ = ["ALGORITHMS", "StallError", "__version__", "abort_on_error", "aborting", "allreduce", "info"]

# --- training layer (issue 8): non-blocking all-reduce and bucketed gradient sync ---
from .nonblocking import Request, iallreduce  # noqa: E402
from .nonblocking import progress_mode as _progress_mode  # noqa: E402
from .training import GradientSync  # noqa: E402

__all__ += ["GradientSync", "Request", "iallreduce"]
