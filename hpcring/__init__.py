"""hpcring: gradient all-reduce and the collectives around it over MPI, the textbook algorithms
side by side with the library's own.

This module is the public face only (`allreduce`, `reduce_scatter`, `allgather`, `broadcast`,
`alltoall`, their
non-blocking forms, `plan`, `ExactSum`, `GradientSync`, `Intracomm`, `trace`, `info`...); the work
is in the submodules, and the names that need MPI load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from .errors import RankFailedError, StallError, abort_on_error, aborting  # no MPI needed to import these
from .tracing import from_environment as _trace_from_environment
from .tracing import trace

if TYPE_CHECKING:
    from . import elastic
    from .accumulator import ExactSum
    from .collectives import allgather, allreduce, alltoall, alltoall_splits, broadcast, reduce_scatter
    from .elastic import shrink
    from .gpu import select_device
    from .nonblocking import Request, iallgather, iallreduce, ialltoall, ibroadcast, ireduce_scatter
    from .persistent import Plan, plan
    from .training import GradientSync
    from .wrap import Intracomm

    ALGORITHMS: tuple[str, ...]

# Public name -> the module that defines it. Importing any of them imports mpi4py.MPI, which
# initializes MPI (over a second as a singleton): ``python -m hpcring.model`` must not pay that.
_LAZY = {
    "allreduce": "collectives",
    "reduce_scatter": "collectives",
    "allgather": "collectives",
    "broadcast": "collectives",
    "alltoall": "collectives",
    "alltoall_splits": "collectives",
    "iallreduce": "nonblocking",
    "ireduce_scatter": "nonblocking",
    "iallgather": "nonblocking",
    "ibroadcast": "nonblocking",
    "ialltoall": "nonblocking",
    "Request": "nonblocking",
    "plan": "persistent",
    "Plan": "persistent",
    "ExactSum": "accumulator",
    "GradientSync": "training",
    "Intracomm": "wrap",
    "shrink": "elastic",
    "select_device": "gpu",  # imports CuPy where it is installed: also on first use
}


def __getattr__(name: str) -> Any:
    """The public names that need MPI load on first use, and stay loaded."""
    import importlib

    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        made = module.public(name) if module.__name__ == f"{__name__}.collectives" else getattr(module, name)
    elif name == "elastic":  # the module: hpcring.elastic.Elastic, its loop (docs/elastic.md)
        made = importlib.import_module(".elastic", __name__)
    elif name == "_progress_mode":
        from .nonblocking import progress_mode as made
    elif name == "ALGORITHMS":
        from .algorithms import PORTABLE as made
    else:
        raise AttributeError(f"module 'hpcring' has no attribute {name!r}")
    globals()[name] = made  # later lookups skip this hook
    return made


def info() -> dict[str, Any]:
    """What this process runs on: versions, MPI thread level, array backends, CUDA-aware mode, core,
    and what `hpcring.jax` runs inside ``jit`` (the FFI target or io_callbacks)."""
    import mpi4py
    from mpi4py import MPI

    from .arrays import available
    from .core import describe as describe_core
    from .gpu import cuda_aware
    from .jax_ffi import describe as describe_jax
    from .library import mpi_library

    levels = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    aware, reason = cuda_aware()
    core, core_reason = describe_core()
    jax_path, jax_reason = describe_jax()
    return {
        "hpcring": __version__,
        "mpi4py": mpi4py.__version__,
        "mpi_library": mpi_library(),
        "mpi_standard": "{}.{}".format(*MPI.Get_version()),
        "thread_level": levels.get(MPI.Query_thread(), "unknown"),
        "backends": available(),
        "cuda_aware": aware,
        "cuda_aware_reason": reason,
        "algorithms": list(__getattr__("ALGORITHMS")),
        "iallreduce_progress": __getattr__("_progress_mode")(),
        "core": core,  # "c": the compiled core; "python": the pure-Python one
        "core_reason": core_reason,
        "jax": jax_path,  # hpcring.jax inside jit: "ffi", the XLA FFI target; "callback", io_callbacks
        "jax_reason": jax_reason,
    }


__all__ = [
    "ALGORITHMS",
    "ExactSum",
    "GradientSync",
    "Intracomm",
    "Plan",
    "RankFailedError",
    "Request",
    "StallError",
    "__version__",
    "abort_on_error",
    "aborting",
    "allgather",
    "allreduce",
    "alltoall",
    "alltoall_splits",
    "broadcast",
    "elastic",
    "iallgather",
    "iallreduce",
    "ialltoall",
    "ibroadcast",
    "info",
    "ireduce_scatter",
    "plan",
    "reduce_scatter",
    "select_device",
    "shrink",
    "trace",
]

_trace_from_environment()  # HPCRING_TRACE=path: trace this process, write the file at exit
