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
import math
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import numpy as np

from .trace import clock, staging

_CUPY_IMPORT_ERROR = ""  # why `import cupy` failed, where it is installed but broken
try:  # CuPy is optional: without it (or without a GPU) only the NumPy backend exists.
    import cupy
except Exception as error:  # ImportError, or a CUDA library that fails to load
    cupy = None
    if not (isinstance(error, ModuleNotFoundError) and error.name == "cupy"):
        _CUPY_IMPORT_ERROR = f"{type(error).__name__}: {error}"


def _cupy_problem() -> str:
    """Why CuPy can't compute here ('' when it can), in words fit for a one-line error."""
    if cupy is None:
        if _CUPY_IMPORT_ERROR:
            return f"CuPy fails to import ({_CUPY_IMPORT_ERROR})"
        return "needs CuPy: pip install 'hpcring[gpu]'"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # no driver, or one too old for CuPy's CUDA runtime
        return f"CuPy sees no GPU ({error})"
    return "" if count > 0 else "CuPy sees no GPU"


def _cupy_usable() -> bool:
    return not _cupy_problem()


def gpu_problem() -> str:
    """Why this rank won't compute on a GPU, or '' if it will: what `--device gpu` reports."""
    if os.environ.get("HPCRING_DEVICE", "").strip().lower() == "cpu":
        return "HPCRING_DEVICE=cpu is set"
    return _cupy_problem()


def gpu_problem_anywhere(comm: Any) -> str:
    """Collective over ``comm``: why some rank won't compute on a GPU ('' if every rank will),
    naming the first such rank, so that all ranks take the same road."""
    problems = comm.allgather(gpu_problem())
    missing = [(rank, problem) for rank, problem in enumerate(problems) if problem]
    if not missing:
        return ""
    rank, problem = missing[0]
    return f"{problem} (rank {rank}; {len(missing)} of {len(problems)} ranks)"


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
    if env == "0":
        return False, "HPCRING_CUDA_AWARE=0"
    if env == "1":
        if not _cupy_usable():
            return True, "HPCRING_CUDA_AWARE=1 (not verified: no GPU here)"
        failure = verify_cuda_aware([sys.executable, "-m", "hpcring.cudaprobe", str(cupy.cuda.Device().id)])
        if failure is None:
            return True, "HPCRING_CUDA_AWARE=1, verified by a device-buffer exchange"
        warnings.warn(
            f"HPCRING_CUDA_AWARE=1, but a device-buffer exchange through this MPI library {failure}: "
            "it is not CUDA-aware; hpcring stages through host memory instead (unset the variable "
            "or set it to 0 to silence this)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False, f"HPCRING_CUDA_AWARE=1 but the device-buffer check {failure}: host staging"
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
        mpix_gpu_type_cuda = 0  # MPIX_GPU_SUPPORT_CUDA in MPICH's mpix.h (1 is Level Zero, 2 HIP)
        if query(ctypes.c_int(mpix_gpu_type_cuda), ctypes.byref(flag)) == 0:
            return bool(flag.value), f"MPIX_GPU_query_support(CUDA) = {flag.value}"
    return False, "MPI library does not say: host staging"


# What a launcher puts in a rank's environment: without it a child process is an MPI singleton.
_LAUNCHER_VARIABLES = ("OMPI_", "PMIX_", "PRTE_", "PMI_", "MPI_LOCAL", "HYDRA_", "SLURM_", "I_MPI_")


def verify_cuda_aware(command: list[str], timeout: float = 120.0) -> str | None:
    """Run the device-buffer probe ``command`` as a singleton child; None if it passed, else what failed.

    A crash (a non-CUDA-aware library reading a device pointer as host memory) only ends
    the child. The launcher's variables are removed so the child does not join the job.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARIABLES)}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"did not finish in {timeout:g} s"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = str(-done.returncode)
        return f"crashed (signal {name})"
    last = (done.stderr.strip().splitlines() or ["no message"])[-1]
    return f"failed (exit {done.returncode}: {last})"


class Backend:
    """NumPy arrays on the host: MPI reads and writes them directly."""

    name = "numpy"
    xp: Any = np
    device = False
    direct = True  # MPI reads and writes these arrays in place: no staging copy
    _meminfo: tuple[float, int | None] = (-math.inf, None)  # (when read, MemAvailable)

    def owns(self, array: Any) -> bool:
        return isinstance(array, np.ndarray)

    def writeable(self, array: Any) -> bool:
        return bool(array.flags.writeable)

    def data_pointer(self, array: Any) -> int:
        return int(array.__array_interface__["data"][0])  # `ctypes.data` builds an object: slower

    def same_memory(self, a: Any, b: Any) -> bool:
        """Whether ``a`` and ``b`` are the same non-empty bytes (another view of them: in place)."""
        return bool(a.nbytes == b.nbytes > 0 and self.data_pointer(a) == self.data_pointer(b))

    def check_device(self, array: Any, name: str) -> None:
        """ValueError if ``array`` lives somewhere this rank's MPI calls cannot use; host memory is fine."""

    def current_device(self) -> int | None:
        """The device new work goes to (plans holding streams are per device); None on the host."""
        return None

    def shares_memory(self, a: Any, b: Any) -> bool:
        return bool(np.may_share_memory(a, b) and np.shares_memory(a, b))  # bounds first: cheap

    def empty(self, count: int, dtype: np.dtype) -> Any:
        return self.xp.empty(count, dtype=dtype)

    MEMINFO_SECONDS = 1.0  # a reading this fresh is reused: /proc/meminfo costs ~10 us, a call ~30 us

    def available_bytes(self) -> int | None:
        """Memory that a new allocation may still take (Linux MemAvailable); None if unknown."""
        now = time.monotonic()
        if now - self._meminfo[0] < self.MEMINFO_SECONDS:
            return self._meminfo[1]
        available = None
        try:
            with open("/proc/meminfo") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        available = int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
        self._meminfo = (now, available)
        return available

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
        # Pinned slots per thread: an iallreduce's worker stages while the caller may run a
        # blocking allreduce (on another communicator), and the two must not share buffers.
        self._local = threading.local()

    def owns(self, array: Any) -> bool:
        return isinstance(array, cupy.ndarray)

    def writeable(self, array: Any) -> bool:
        return True

    def data_pointer(self, array: Any) -> int:
        return int(array.data.ptr)

    def current_device(self) -> int | None:
        return int(cupy.cuda.Device().id)

    def check_device(self, array: Any, name: str) -> None:
        """The array must be on the current device: the one this rank's streams, staging and
        kernels use (`select_device` makes it the node-local rank's GPU)."""
        current = cupy.cuda.Device().id
        if array.device.id != current:
            raise ValueError(
                f"hpcring.allreduce: {name} is on GPU {array.device.id} but this rank's current device "
                f"is GPU {current}; call hpcring.select_device() once at start-up and allocate after it, "
                "or enter `with cupy.cuda.Device(i):` around the call"
            )

    def shares_memory(self, a: Any, b: Any) -> bool:
        """Whether the byte ranges meet: exact where both arrays are C-contiguous (x always is
        here, and an out that is not is refused for its strides either way).
        cupy.shares_memory would list and sort every element's address on the GPU, each call."""
        return bool(cupy.may_share_memory(a, b))

    def available_bytes(self) -> int | None:
        """Free device memory, counting what CuPy's pool holds but does not use."""
        free, _ = cupy.cuda.runtime.memGetInfo()
        return int(free) + int(cupy.get_default_memory_pool().free_bytes())

    def synchronize(self) -> None:
        cupy.cuda.get_current_stream().synchronize()

    def _host(self, nbytes: int, slot: int) -> np.ndarray:
        """Grow-only pinned host buffer for this thread's staging slot ``slot``."""
        pinned = self._local.__dict__.setdefault("pinned", {})
        buf = pinned.get(slot)
        if buf is None or buf.nbytes < nbytes:
            import cupyx

            buf = pinned[slot] = cupyx.empty_pinned(max(nbytes, 1), dtype=np.uint8)
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

    def staging(self, slot_bytes: int, marks: int) -> Staging:
        """A `Staging` pipeline with slots of ``slot_bytes`` and ``marks`` item events in rotation."""
        return Staging(slot_bytes, marks)

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
                # The call's last kernels (mean's division, a one-rank copy) are queued on
                # this thread's stream: done before the request says so.
                cupy.cuda.get_current_stream().synchronize()

        return entered


def gpu_identity() -> str:
    """The current GPU as a name that differs between GPUs of one host: its PCI bus id.

    Two ranks that see the same id share a GPU, whatever CUDA_VISIBLE_DEVICES each has.
    """
    device = cupy.cuda.Device()
    for read in (lambda: device.pci_bus_id, lambda: cupy.cuda.runtime.deviceGetPCIBusId(device.id)):
        try:
            return str(read())
        except Exception:  # an older CuPy without one of them
            continue
    return f"device {device.id}"


def copyto_bandwidth(nbytes: int, repeats: int = 5) -> float:
    """Bytes per second of one ``np.copyto`` of ``nbytes`` between arrays already paged in
    (median of ``repeats``): what one process gets from memory, the yardstick of an
    all-reduce through one machine's shared memory (each busbw byte costs several
    bytes of memory traffic)."""
    src = np.ones(max(nbytes, 1), dtype=np.uint8)
    dst = np.zeros_like(src)
    times = []
    for _ in range(repeats + 1):  # the first copy pages dst in
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return src.nbytes / sorted(times[1:])[len(times[1:]) // 2]


def pinned_d2h_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes per second of one device-to-host copy into pinned memory (median of ``repeats``).

    The ceiling of host staging: every staged byte crosses this link at least once each way.
    """
    import cupyx

    device = cupy.zeros(nbytes, dtype=np.uint8)
    host = cupyx.empty_pinned(nbytes, dtype=np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats + 1):  # the first copy warms up
        start.record(stream)
        device.get(out=host, stream=stream, blocking=False)
        stop.record(stream)
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return nbytes / sorted(times[1:])[len(times[1:]) // 2]


class Staging:
    """Host staging that overlaps: two pinned send slots and two receive slots, a copy stream
    for device-to-host copies and a compute stream for host-to-device copies and reductions.

    A pipeline of items (one MPI message each) uses it as: `to_host` item i+1 on the copy
    stream while MPI moves item i; `sent(i)` waits only for item i's copy; `received(i)`
    hands out a receive slot once the copy that last read it has finished; `to_device` and
    the reduction of item i run on the compute stream while MPI moves item i+1. `mark(i)`
    records item i's device work, so a later copy that reads what it wrote can wait for it
    on the GPU (`to_host(..., after=)`) without stopping the host. Made once per plan (it
    holds pinned memory), so a warm call allocates nothing.
    """

    SLOTS = 2

    def __init__(self, slot_bytes: int, marks: int) -> None:
        import cupyx

        def event() -> Any:
            return cupy.cuda.Event(block=False, disable_timing=True)

        nbytes = max(slot_bytes, 1)
        self.copy = cupy.cuda.Stream(non_blocking=True)
        self.compute = cupy.cuda.Stream(non_blocking=True)
        self._send = [cupyx.empty_pinned(nbytes, dtype=np.uint8) for _ in range(self.SLOTS)]
        self._recv = [cupyx.empty_pinned(nbytes, dtype=np.uint8) for _ in range(self.SLOTS)]
        self._copied = [event() for _ in range(self.SLOTS)]  # send slot filled
        self._drained = [event() for _ in range(self.SLOTS)]  # receive slot read by the device
        self._marks = [event() for _ in range(max(marks, 1))]
        self._start = event()

    def begin(self) -> None:
        """Both streams start after the work the caller queued on its current stream (its inputs)."""
        self._start.record(cupy.cuda.get_current_stream())
        self.copy.wait_event(self._start)
        self.compute.wait_event(self._start)

    def to_host(self, item: int, piece: Any, after: int = -1) -> None:
        """Queue the copy of device ``piece`` into send slot item % 2, after the device work of
        item ``after`` (>= 0, within the last ``marks`` items marked) has run."""
        slot = item % self.SLOTS
        if after >= 0:
            self.copy.wait_event(self._marks[after % len(self._marks)])
        if piece.nbytes:
            cupy.cuda.runtime.memcpyAsync(
                self._send[slot].ctypes.data,
                piece.data.ptr,
                piece.nbytes,
                cupy.cuda.runtime.memcpyDeviceToHost,
                self.copy.ptr,
            )
        self._copied[slot].record(self.copy)

    def sent(self, item: int, nbytes: int) -> np.ndarray:
        """Send slot of ``item``, once its device-to-host copy has landed (MPI may read it now)."""
        slot = item % self.SLOTS
        self._copied[slot].synchronize()
        return self._send[slot][:nbytes]

    def received(self, item: int, nbytes: int) -> np.ndarray:
        """Receive slot for ``item``, once the device has finished reading what it held before."""
        slot = item % self.SLOTS
        self._drained[slot].synchronize()
        return self._recv[slot][:nbytes]

    def to_device(self, item: int, piece: Any) -> None:
        """Queue the copy of ``item``'s receive slot into device ``piece`` on the compute stream."""
        slot = item % self.SLOTS
        if piece.nbytes:
            cupy.cuda.runtime.memcpyAsync(
                piece.data.ptr,
                self._recv[slot].ctypes.data,
                piece.nbytes,
                cupy.cuda.runtime.memcpyHostToDevice,
                self.compute.ptr,
            )
        self._drained[slot].record(self.compute)

    def mark(self, item: int) -> None:
        """Record the device work queued so far for ``item``; a later `to_host` may wait for it."""
        self._marks[item % len(self._marks)].record(self.compute)

    def finish(self) -> None:
        """Block until every queued copy and reduction is done: the result is complete on return."""
        self.compute.synchronize()
        self.copy.synchronize()


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
    if gpu_problem():
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
