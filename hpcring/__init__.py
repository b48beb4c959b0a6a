"""hpcring: gradient all-reduce over MPI, the textbook algorithms side by side with the library's own.

This module is the public face only (`allreduce`, `iallreduce`, `GradientSync`, `Intracomm`, `trace`,
`info`...); the work is in the submodules, and the names that need MPI load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from .errors import StallError, abort_on_error, aborting  # no MPI needed to import these
from .tracing import from_environment as _trace_from_environment
from .tracing import trace

if TYPE_CHECKING:
    from .api import allreduce
    from .exact import ExactSum
    from .gpu import select_device
    from .nonblocking import Request, iallreduce
    from .persistent import Plan, plan
    from .training import GradientSync
    from .wrap import Intracomm

    ALGORITHMS: tuple[str, ...]


def __getattr__(name: str) -> Any:
    """The public names that need MPI load on first use: importing mpi4py.MPI initializes MPI
    (over a second as a singleton), which ``python -m hpcring.model`` predictions must not pay."""
    if name == "allreduce":
        from .api import allreduce

        globals()["allreduce"] = allreduce  # MPI is loaded now: later calls skip this hook
        return allreduce
    if name == "select_device":  # imports CuPy where it is installed: also on first use
        from .gpu import select_device

        return select_device
    if name in ("iallreduce", "Request", "_progress_mode"):  # the training layer (MPI, threads)
        from . import nonblocking

        return nonblocking.progress_mode if name == "_progress_mode" else getattr(nonblocking, name)
    if name == "GradientSync":
        from .training import GradientSync

        return GradientSync
    if name in ("plan", "Plan"):  # persistent calls: validated and agreed once
        from . import persistent

        globals()[name] = made = getattr(persistent, name)
        return made
    if name == "ExactSum":  # reproducible sums of any number of local contributions
        from .exact import ExactSum

        return ExactSum
    if name == "Intracomm":  # the drop-in communicator for existing mpi4py codes
        from .wrap import Intracomm

        return Intracomm
    if name == "ALGORITHMS":
        from .algorithms import PORTABLE

        globals()["ALGORITHMS"] = PORTABLE
        return PORTABLE
    raise AttributeError(f"module 'hpcring' has no attribute {name!r}")


def info() -> dict[str, Any]:
    """What this process runs on: versions, MPI thread level, array backends, CUDA-aware mode, core."""
    import mpi4py
    from mpi4py import MPI

    from .arrays import available
    from .core import describe as describe_core
    from .gpu import cuda_aware

    levels = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    aware, reason = cuda_aware()
    core, core_reason = describe_core()
    return {
        "hpcring": __version__,
        "mpi4py": mpi4py.__version__,
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0].split(",")[0],
        "mpi_standard": "{}.{}".format(*MPI.Get_version()),
        "thread_level": levels.get(MPI.Query_thread(), "unknown"),
        "backends": available(),
        "cuda_aware": aware,
        "cuda_aware_reason": reason,
        "algorithms": list(__getattr__("ALGORITHMS")),
        "iallreduce_progress": __getattr__("_progress_mode")(),
        "core": core,  # "c": the compiled core; "python": the pure-Python one
        "core_reason": core_reason,
    }


__all__ = [
    "ALGORITHMS",
    "ExactSum",
    "GradientSync",
    "Intracomm",
    "Plan",
    "Request",
    "StallError",
    "__version__",
    "abort_on_error",
    "aborting",
    "allreduce",
    "iallreduce",
    "info",
    "plan",
    "select_device",
    "trace",
]

_trace_from_environment()  # HPCRING_TRACE=path: trace this process, write the file at exit
