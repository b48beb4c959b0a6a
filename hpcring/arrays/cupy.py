"""CuPy arrays on the current device: synchronize, then MPI directly or through pinned host memory.

Importing this module registers the adapter; it raises ImportError where CuPy is missing or
fails to import, and the registry then knows CuPy arrays cannot occur here.

`Staging`, the streamed host-staging pipeline of the staged ring, lives here too: it is made
of CuPy streams, events and pinned buffers, and the algorithms reach it only through the
adapter (`CupyAdapter.staging`), so it goes wherever the CuPy compute side goes. A
``torch.Tensor`` adapter for CUDA tensors hands the algorithms CuPy views and inherits this
compute side, staging included; a module of its own would only add an import.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from operator import methodcaller
from typing import Any

import numpy as np

from ..gpu import cuda_aware, cupy, cupy_problem
from ..tracing import clock, staging
from . import register
from .base import Flags, ready_from_questions
from .numpy import NumpyAdapter

if cupy is None:
    raise ImportError(cupy_problem())


class CupyAdapter(NumpyAdapter):
    """CuPy arrays on the current device: synchronize, then MPI directly or through pinned host memory."""

    kind = name = "cupy"
    type_name = "cupy.ndarray"
    types = (cupy.ndarray,)
    contiguous_fix = "cupy.ascontiguousarray(x)"  # what the API's message for a non-contiguous x suggests
    xp = cupy
    device = True

    def __init__(self) -> None:
        # Pinned slots per thread: an iallreduce's worker stages while the caller may run a
        # blocking allreduce (on another communicator), and the two must not share buffers.
        self._local = threading.local()

    # Whether MPI takes device memory is decided on first use, not at registration: it asks
    # the MPI library (and with HPCRING_CUDA_AWARE=1 runs a probe), which merely finding
    # CuPy importable must not do. A cached property is a plain attribute once read.
    @functools.cached_property
    def direct(self) -> bool:  # type: ignore[override]
        return cuda_aware()[0]

    @functools.cached_property
    def reason(self) -> str:
        return cuda_aware()[1]

    def problem(self) -> str:
        return cupy_problem()

    # -- the user's array ----------------------------------------------------------------

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, cupy.ndarray)

    def flags(self, array: Any) -> Flags:  # type: ignore[override]
        """CuPy's flags say nothing of writeability: a CuPy array is always writeable."""
        return Flags(array.flags.c_contiguous, True)

    flat = methodcaller("reshape", -1)  # C-contiguous (validated): a view, never a copy

    def ready(self, x: Any, out: Any) -> bool:
        return ready_from_questions(self, x, out)

    def check_device(self, array: Any, name: str) -> None:
        """The array must be on the current device: the one this rank's streams, staging and
        kernels use (`select_device` makes it the node-local rank's GPU). How MPI takes device
        memory is settled here too, on the first array: a bad HPCRING_CUDA_AWARE is then this
        call's verdict, which the agreement makes every rank's, as any refusal of x is."""
        _ = self.direct  # a cached property: the first read decides, later ones are plain reads
        current = cupy.cuda.Device().id
        if array.device.id != current:
            raise ValueError(
                f"{name} is on GPU {array.device.id} but this rank's current device "
                f"is GPU {current}; call hpcring.select_device() once at start-up and allocate after it, "
                "or enter `with cupy.cuda.Device(i):` around the call"
            )

    def shares_memory(self, a: Any, b: Any) -> bool:
        """Whether the byte ranges meet: exact where both arrays are C-contiguous (x always is
        here, and an out that is not is refused for its strides either way).
        cupy.shares_memory would list and sort every element's address on the GPU, each call."""
        return bool(cupy.may_share_memory(a, b))

    # -- the compute side ----------------------------------------------------------------

    def data_pointer(self, array: Any) -> int:
        return int(array.data.ptr)

    def current_device(self) -> int | None:
        return int(cupy.cuda.Device().id)

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


register("cupy", CupyAdapter())
