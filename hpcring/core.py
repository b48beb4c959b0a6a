"""The compiled core: which core runs and why (``hpcring.info()["core"]``), and its MPI-linked part.

hpcring's compiled core is two C extensions, both optional (setup.py builds them at install):

- ``hpcring._kernels``, the element kernels (reductions, wire conversions, the reproducible sum's
  conversions). No MPI in it, hence no MPI ABI to match; `hpcring.kernels` selects it.
- ``hpcring._core_openmpi`` or ``hpcring._core_mpich`` (``_core`` below), built against one
  MPI's ``mpi.h`` and mpi4py's C API, and named after that MPI's family, so builds for both live
  side by side (two virtual environments on one source tree). It runs the step tables that
  `hpcring.program` records from the algorithms (`program`) and the warm call of a NumPy
  all-reduce, broadcast, reduce-scatter or all-gather (`caller`, `Table`, `warm`), returning to
  Python only on slow paths. An extension built against Open MPI's header must not run against
  MPICH (handles are pointers in one and integers in the other), so it is used only where its view
  of ``MPI_COMM_WORLD``, the size of a handle and the library's version string are mpi4py's, as
  mpi4jax checks at import.

``HPCRING_CORE=python`` turns both off; ``HPCRING_CORE=c`` makes a missing ``_kernels`` an
ImportError. The pure-Python core is the reference: both give the same bits.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from . import flight, kernels, tracing
from .stamp import stale

_MPI_CORE: list[Any] = []  # [module or None, why], made on first use


def mpi_core() -> tuple[Any, str]:
    """The MPI-linked extension where it loaded and matches mpi4py's MPI, else None; and why."""
    if not _MPI_CORE:
        _MPI_CORE[:] = _load_mpi_core()
    return _MPI_CORE[0], _MPI_CORE[1]


def _load_mpi_core() -> tuple[Any, str]:
    # mpi4py.MPI first: it loads libmpi, which the extension then finds already loaded (the run
    # path a build inside pip's temporary environment wrote would lead nowhere).
    from mpi4py import MPI

    runtime = MPI.Get_library_version().strip()
    name = f"hpcring._core_{'openmpi' if runtime.startswith('Open MPI') else 'mpich'}"
    try:
        _core = importlib.import_module(name)
    except Exception as error:  # ImportError, or mpi4py's ValueError on a C API built for another ABI
        return None, f"{name} did not load ({type(error).__name__}: {error})"
    why = stale(_core, "core.c")
    if why:
        return None, f"{name} not used: {why}"
    why = abi_mismatch(
        _core.MPI_VENDOR,
        _core.COMM_SIZEOF,
        _core.comm_world(),
        _core.library_version(),
        runtime,
        MPI._sizeof(MPI.Comm),
        MPI.COMM_WORLD.handle,
    )
    if why:
        return None, f"{name} not used: {why}"
    try:
        _setup(_core, MPI)
    except Exception as error:  # a module of another build than this file expects: Python's path
        return None, f"{name} failed its setup ({type(error).__name__}: {error})"
    return _core, f"{name} built against {_core.MPI_VENDOR}'s mpi.h, the MPI mpi4py runs"


def _unset(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("hpcring.core: the engine has not given its Python call yet")


def _setup(module: Any, MPI: Any) -> None:
    """Hand the extension what it compares with and calls: the kernels' measurements, the array
    and communicator types, the flight record's slots, the tracer, the engine's Python call."""
    samples = []
    for array in _samples():
        data = array.__array_interface__["data"][0]
        samples.append((array, data, array.shape, array.flags.c_contiguous, array.flags.writeable))
    caller, arrays_ok = module.setup(
        *kernels.QUIRKS,
        kernels.refused(),
        np.ndarray,
        samples,
        MPI.Intracomm,
        MPI.Exception,
        tracing,
        tracing.NullTracer,
        flight.Slot,
        flight.Recorder,
        _unset,
        threading.main_thread().ident,
    )
    _CALLER[:] = [caller, arrays_ok]
    module.enable(kernels.ACTIVE == "c")
    kernels.LISTENERS.append(lambda active: module.enable(active == "c"))
    kernels.QUIRK_LISTENERS.append(lambda: module.quirks(*kernels.QUIRKS, kernels.refused()))
    from . import polling  # waits share their core where ranks outnumber cores

    module.waiting(polling.shared())
    polling.SHARING_LISTENERS.append(module.waiting)


def _samples() -> list[np.ndarray]:
    """Arrays whose fields the extension must read as NumPy describes them (else its warm calls
    stay off): contiguous, strided, read-only, empty, 0-d."""
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    frozen = np.zeros(5)
    frozen.flags.writeable = False
    return [base, base[:, ::2], frozen, np.zeros(0, np.int64), np.zeros((), np.int32)]


_CALLER: list[Any] = []  # [the compiled engine.call, whether ndarray fields read right]


def caller(fallback: Callable[..., Any]) -> Callable[..., Any]:
    """``fallback`` (the engine's Python `call`) with its warm NumPy calls run in C in front of it,
    where the MPI-linked core runs here; else ``fallback`` itself."""
    module, _ = mpi_core()
    if module is None or not _CALLER or not _CALLER[1]:
        return fallback
    module.set_fallback(fallback)
    return _CALLER[0]


def front(
    function: Callable[..., Any], arguments: tuple[Any, ...], keywords: tuple[tuple[str, int], ...]
) -> Any:
    """``function`` behind the compiled core's front door (its ``Front``: `hpcring.engine.front`
    says what ``arguments`` and ``keywords`` are), with the function's name, docstring and
    signature (``__wrapped__``), where the MPI-linked core runs here; else ``function`` itself."""
    module, _ = mpi_core()
    if module is None or not _CALLER or not _CALLER[1]:
        return function
    made = module.Front(function, arguments, keywords)
    for name in ("__name__", "__qualname__", "__doc__", "__annotations__"):
        setattr(made, name, getattr(function, name))
    made.__module__ = "hpcring"  # where it is found by name: `hpcring.allreduce` (pickle's question)
    made.__wrapped__ = function
    return made


def exchange_caller(run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` (hpcring.exchange's Python run) with its warm NumPy all-to-alls of equal blocks run
    in C in front of it, where the MPI-linked core runs here; else ``run`` itself."""
    module, _ = mpi_core()
    if module is None or not _CALLER or not _CALLER[1]:
        return run
    return module.exchange_caller(run)


def active() -> bool:
    """Whether the compiled core runs step loops and warm calls now (HPCRING_CORE, the kernels'
    selection, and the MPI-linked part loaded)."""
    return kernels.ACTIVE == "c" and mpi_core()[0] is not None


def program(recording: Any, src: Any, dst: Any) -> tuple[Any, str]:
    """The compiled `Program` for a `hpcring.program.Program` recorded on ``src`` and ``dst``, or
    None; and why not."""
    module, why = mpi_core()
    if module is None:
        return None, why
    kinds = {"src": 0, "dst": 1, "scratch": 2}
    buffers = [(kinds[b.kind], b.comm, b.name, b.nbytes) for b in recording.buffers]
    align = min(8, max(src.dtype.itemsize, dst.dtype.itemsize))
    try:
        made = module.Program(
            recording.rows,
            buffers,
            tuple(recording.channels),
            recording.counts,
            recording.sent,
            recording.unknown,
            src.nbytes,
            dst.nbytes,
            align,
        )
    except (ValueError, TypeError) as error:
        return None, str(error)
    return made, ""


def table(comm: Any) -> Any:
    """The compiled core's table of warm calls for the user's ``comm`` (found by its handle)."""
    return mpi_core()[0].Table(comm)


def warm(*args: Any) -> Any:
    """One warm call run in C (`Warm`'s arguments: hpcring.engine.Call.compiled_warm)."""
    return mpi_core()[0].Warm(*args)


def abi_mismatch(
    vendor: str,
    handle_size: int,
    comm_world: int,
    library: str | None,
    runtime: str,
    runtime_handle_size: int,
    runtime_comm_world: int,
) -> str | None:
    """Why an extension built against ``vendor``'s mpi.h must not run with mpi4py's MPI, or None.

    The build's and mpi4py's handles for MPI_COMM_WORLD must be equal (an address in Open MPI, a
    constant in the MPICH family: equal only where both use one library with one ABI), so must
    the size of a handle, and the version strings the two get from the library they call."""
    name = runtime.splitlines()[0] if runtime else "?"
    if handle_size != runtime_handle_size:
        return (
            f"built against {vendor} (handles of {handle_size} bytes), mpi4py runs {name} "
            f"(handles of {runtime_handle_size} bytes)"
        )
    if comm_world != runtime_comm_world:
        return f"built against {vendor}, mpi4py runs {name}: MPI_COMM_WORLD differs between them"
    if library is not None and library.strip() != runtime:
        return (
            f"built against {vendor}, its library says {library.strip().splitlines()[0]!r}, mpi4py's {name!r}"
        )
    return None


def describe() -> tuple[str, str]:
    """("c" or "python", why): the kernels' choice, and what the MPI-linked part does here."""
    active, reason = kernels.ACTIVE, kernels.REASON
    if active == "python":
        return active, reason
    return active, f"{reason}; {mpi_core()[1]}"
