"""GPU facts: whether CuPy computes here, whether MPI takes device memory, which GPU is whose.

Nothing here moves an all-reduce's data (that is the CuPy adapter, `hpcring.arrays.cupy`):
this module answers the questions asked once, at start-up or by the bench. Whether MPI is
CUDA-aware (`cuda_aware`, with the child-process probe `verify_cuda_aware`), why a rank won't
compute on a GPU (`gpu_problem`, and `gpu_problem_anywhere` across ranks), which GPU a rank
takes (`local_device`, `node_local_rank`, `select_device`), a GPU's identity across processes
(`gpu_identity`), and the two copy bandwidths the bench prints (`copyto_bandwidth`,
`pinned_d2h_bandwidth`).

CuPy is optional: ``cupy`` is the module, or None where it is missing or fails to import; it is
imported when first needed, not with this module.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import time
import warnings
from typing import Any

import numpy as np

from . import config

_CUPY: list[Any] = []  # [the module, or None], once asked for (`_cupy`)
_CUPY_IMPORT_ERROR = ""  # why `import cupy` failed, where it is installed but broken


def _cupy() -> Any:
    """CuPy, or None where it is missing or fails to import; imported when first asked for, not
    with this module: the bench and the examples ask for a GPU only with ``--device gpu``, and
    importing CuPy costs about half a second a process."""
    global _CUPY_IMPORT_ERROR
    if not _CUPY:
        try:
            import cupy
        except Exception as error:  # ImportError, or a CUDA library that fails to load
            cupy = None
            if not (isinstance(error, ModuleNotFoundError) and error.name == "cupy"):
                _CUPY_IMPORT_ERROR = f"{type(error).__name__}: {error}"
        _CUPY.append(cupy)
    return _CUPY[0]


def __getattr__(name: str) -> Any:
    """``cupy``: the module or None (`_cupy`), imported on first use."""
    if name == "cupy":
        return _cupy()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cupy_problem() -> str:
    """Why CuPy can't compute here ('' when it can), in words fit for a one-line error."""
    cupy = _cupy()
    if cupy is None:
        if _CUPY_IMPORT_ERROR:
            return f"CuPy fails to import ({_CUPY_IMPORT_ERROR})"
        return "needs CuPy: pip install -e '.[gpu]' in hpcring's clone"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # no driver, or one too old for CuPy's CUDA runtime
        return f"CuPy sees no GPU ({error})"
    return "" if count > 0 else "CuPy sees no GPU"


def gpu_problem() -> str:
    """Why this rank won't compute on a GPU, or '' if it will: what `--device gpu` reports."""
    if config.current().device == "cpu":
        return "HPCRING_DEVICE=cpu is set"
    return cupy_problem()


def gpu_problem_anywhere(comm: Any) -> str:
    """Collective over ``comm``: why some rank won't compute on a GPU ('' if every rank will),
    naming the first such rank, so that all ranks take the same road."""
    problems = comm.allgather(gpu_problem())
    missing = [(rank, problem) for rank, problem in enumerate(problems) if problem]
    if not missing:
        return ""
    rank, problem = missing[0]
    return f"{problem} (rank {rank}; {len(missing)} of {len(problems)} ranks)"


@functools.cache
def cuda_aware() -> tuple[bool, str]:
    """Whether device buffers may go straight to MPI, and why we think so.

    `HPCRING_CUDA_AWARE=1|0` wins; else ask the MPI library (Open MPI's
    `MPIX_Query_cuda_support`, MPICH's `MPIX_GPU_query_support`); else stage
    through host memory, the safe default.
    """
    given = config.current().cuda_aware  # True, False, or None where unset (a bad value raises)
    if given is False:
        return False, "HPCRING_CUDA_AWARE=0"
    if given:
        if cupy_problem():
            return True, "HPCRING_CUDA_AWARE=1 (not verified: no GPU here)"
        device = _cupy().cuda.Device().id
        failure = verify_cuda_aware([sys.executable, "-m", "hpcring.cudaprobe", str(device)])
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


def gpu_identity() -> str:
    """The current GPU as a name that differs between GPUs of one host: its PCI bus id.

    Two ranks that see the same id share a GPU, whatever CUDA_VISIBLE_DEVICES each has.
    """
    cupy = _cupy()
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

    cupy = _cupy()
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
    cupy = _cupy()
    device = local_device(local_rank, cupy.cuda.runtime.getDeviceCount())
    if device is not None:
        cupy.cuda.Device(device).use()
    return device
