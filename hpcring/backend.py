"""The one place that knows NumPy from CuPy.

Algorithms see a `Backend`: the array module (`xp`) for local reductions and scratch,
and `mpi_view`, which turns a contiguous array into something mpi4py can send or
receive. For NumPy that is the array itself. For CuPy it is the device array after the
current stream is synchronized (CUDA-aware MPI), or a cached pinned host buffer that is
copied to and from the device around the MPI call (host staging).
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import numpy as np

from .trace import clock, staging

try:  # CuPy is optional: without it (or without a GPU) only the NumPy backend exists.
    import cupy
except Exception:  # ImportError, or a CUDA library that fails to load
    cupy = None


def _cupy_usable() -> bool:
    if cupy is None:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def available_backends() -> list[str]:
    """Array backends usable in this process: always numpy, cupy where a GPU is visible."""
    return ["numpy", "cupy"] if _cupy_usable() else ["numpy"]


@functools.cache
def cuda_aware() -> tuple[bool, str]:
    """Whether device buffers may go straight to MPI, and why we think so.

    `HPCRING_CUDA_AWARE=1|0` wins; else ask the MPI library (Open MPI's
    `MPIX_Query_cuda_support`, MPICH's `MPIX_GPU_query_support`); else stage
    through host memory, the safe default.
    """
    env = os.environ.get("HPCRING_CUDA_AWARE", "").strip()
    if env in ("0", "1"):
        return env == "1", f"HPCRING_CUDA_AWARE={env}"
    if env:
        raise ValueError(f"HPCRING_CUDA_AWARE must be 1 or 0, got {env!r}")
    from mpi4py import MPI

    try:
        lib = ctypes.CDLL(MPI.__file__)  # dlsym searches libmpi, which it links
    except OSError:
        return False, "MPI library not inspectable: host staging"
    query = getattr(lib, "MPIX_Query_cuda_support", None)
    if query is not None:
        query.restype = ctypes.c_int
        supported = bool(query())
        return supported, f"MPIX_Query_cuda_support() = {int(supported)}"
    query = getattr(lib, "MPIX_GPU_query_support", None)
    if query is not None:
        flag = ctypes.c_int(0)
        mpix_gpu_type_cuda = 1  # MPIX_GPU_SUPPORT_CUDA in MPICH's mpi.h
        if query(ctypes.c_int(mpix_gpu_type_cuda), ctypes.byref(flag)) == 0:
            return bool(flag.value), f"MPIX_GPU_query_support(CUDA) = {flag.value}"
    return False, "MPI library does not say: host staging"


class Backend:
    """NumPy arrays on the host: MPI reads and writes them directly."""

    name = "numpy"
    xp: Any = np
    device = False
    direct = True  # MPI reads and writes these arrays in place: no staging copy

    def owns(self, array: Any) -> bool:
        return isinstance(array, np.ndarray)

    def writeable(self, array: Any) -> bool:
        return bool(array.flags.writeable)

    def data_pointer(self, array: Any) -> int:
        return int(array.ctypes.data)

    def shares_memory(self, a: Any, b: Any) -> bool:
        return bool(np.shares_memory(a, b))

    def empty(self, count: int, dtype: np.dtype) -> Any:
        return self.xp.empty(count, dtype=dtype)

    def available_bytes(self) -> int | None:
        """Memory that a new allocation may still take (Linux MemAvailable); None if unknown."""
        try:
            with open("/proc/meminfo") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    def synchronize(self) -> None:
        """Wait for the work queued on the device (timing needs it); nothing to wait for on the host."""

    @contextmanager
    def mpi_view(self, array: Any, *, copy_in: bool, copy_out: bool, slot: int = 0) -> Iterator[Any]:
        """A buffer for one MPI call on ``array``: read by MPI (copy_in), written (copy_out)."""
        yield array

    def handoff(self, array: Any) -> Callable[[], AbstractContextManager[None]]:
        """Called by the thread that wrote ``array``; the returned context, entered by another
        thread, makes that thread see those writes. Host memory needs nothing."""
        return nullcontext


class CupyBackend(Backend):
    """CuPy arrays on the current device: synchronize, then MPI directly or through pinned host memory."""

    name = "cupy"
    device = True

    def __init__(self) -> None:
        self.xp = cupy
        self.direct, self.reason = cuda_aware()
        self._pinned: dict[int, np.ndarray] = {}

    def owns(self, array: Any) -> bool:
        return isinstance(array, cupy.ndarray)

    def writeable(self, array: Any) -> bool:
        return True

    def data_pointer(self, array: Any) -> int:
        return int(array.data.ptr)

    def shares_memory(self, a: Any, b: Any) -> bool:
        return bool(cupy.shares_memory(a, b))

    def available_bytes(self) -> int | None:
        """Free device memory, counting what CuPy's pool holds but does not use."""
        free, _ = cupy.cuda.runtime.memGetInfo()
        return int(free) + int(cupy.get_default_memory_pool().free_bytes())

    def synchronize(self) -> None:
        cupy.cuda.get_current_stream().synchronize()

    def _host(self, nbytes: int, slot: int) -> np.ndarray:
        """Grow-only pinned host buffer for staging slot ``slot``."""
        buf = self._pinned.get(slot)
        if buf is None or buf.nbytes < nbytes:
            import cupyx

            buf = cupyx.empty_pinned(max(nbytes, 1), dtype=np.uint8)
            self._pinned[slot] = buf
        return buf[:nbytes]

    @contextmanager
    def mpi_view(self, array: Any, *, copy_in: bool, copy_out: bool, slot: int = 0) -> Iterator[Any]:
        stream = cupy.cuda.get_current_stream()
        stream.synchronize()  # MPI must see the device writes of earlier kernels
        if self.direct:
            yield array
            return
        host = self._host(array.nbytes, slot).view(array.dtype).reshape(array.shape)
        if copy_in:
            start = clock()
            array.get(out=host, stream=stream)
            stream.synchronize()
            staging("d2h", start, array, host)
        yield host
        if copy_out:
            start = clock()
            array.set(host, stream=stream)
            stream.synchronize()  # the pinned buffer is reused by the next call
            staging("h2d", start, array, host)

    def handoff(self, array: Any) -> Callable[[], AbstractContextManager[None]]:
        """Record the writer's stream now; the worker thread enters the array's device and waits
        for that event, so kernels queued later by the writer are not waited for."""
        device = array.device
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(cupy.cuda.get_current_stream())

        @contextmanager
        def entered() -> Iterator[None]:
            with device:
                event.synchronize()
                yield

        return entered


_NUMPY = Backend()


@functools.cache
def _cupy_backend() -> CupyBackend:
    return CupyBackend()


def local_device(local_rank: int, device_count: int) -> int | None:
    """The GPU a rank with node-local rank ``local_rank`` should use, None without GPUs.

    Modulo, so it also holds when the scheduler already narrowed each rank to one GPU
    (``--gpus-per-task=1`` sets CUDA_VISIBLE_DEVICES per task: every rank sees device 0)
    or when a node runs more ranks than it has GPUs.
    """
    if local_rank < 0:
        raise ValueError(f"local_rank must be >= 0, got {local_rank}")
    return local_rank % device_count if device_count > 0 else None


def node_local_rank(comm: Any = None) -> int:
    """This rank's index among the ranks of ``comm`` (default COMM_WORLD) on the same node.

    Collective over ``comm``. A shared-memory split asks the MPI library itself, so it
    is right under srun, mpirun or any launcher, unlike SLURM_LOCALID (srun only).
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return local.Get_rank()
    finally:
        local.Free()


def select_device(comm: Any = None) -> int | None:
    """Make this rank's GPU the current CuPy device: node-local rank modulo GPUs per node.

    Collective over ``comm`` (default COMM_WORLD): call it on every rank at start-up,
    before allocating device arrays. Returns the device id, or None (and changes
    nothing) with ``HPCRING_DEVICE=cpu``, without CuPy, or without a visible GPU.
    """
    # The split runs on every rank whatever it decides next, so ranks that see
    # different environments (a node without a GPU) still call the same collectives.
    local_rank = node_local_rank(comm)
    if os.environ.get("HPCRING_DEVICE", "").strip().lower() == "cpu" or not _cupy_usable():
        return None
    device = local_device(local_rank, cupy.cuda.runtime.getDeviceCount())
    if device is not None:
        cupy.cuda.Device(device).use()
    return device


def backend_for(array: Any) -> Backend:
    """The backend that owns ``array``; TypeError for anything that is not a NumPy or CuPy array."""
    if isinstance(array, np.ndarray):
        return _NUMPY
    if cupy is not None and isinstance(array, cupy.ndarray):
        return _cupy_backend()
    kinds = "numpy.ndarray or cupy.ndarray" if cupy is not None else "numpy.ndarray"
    raise TypeError(f"hpcring.allreduce: x must be a {kinds}, got {type(array).__name__}")


def backend_named(name: str) -> Backend:
    """The backend called ``name`` (one of `available_backends`), for code that has no array yet."""
    if name not in available_backends():
        raise ValueError(
            f"array backend {name!r} is not available here; choose one of {available_backends()}"
        )
    return _cupy_backend() if name == "cupy" else _NUMPY
