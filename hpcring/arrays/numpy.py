"""NumPy arrays on the host: MPI reads and writes them directly."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from operator import attrgetter
from typing import Any

import numpy as np


class NumpyAdapter:
    """NumPy arrays on the host: MPI reads and writes them directly.

    The questions a warm call asks about a user's array are bound once as C callables
    (``attrgetter``, NumPy's own ``ravel``), not methods: a Python frame each would cost
    more than the reads they make.
    """

    kind = name = "numpy"
    type_name = "numpy.ndarray"
    types: tuple[type, ...] = (np.ndarray,)
    by_type = True
    contiguous_fix = "np.ascontiguousarray(x)"  # what the API's message for a non-contiguous x suggests
    index = -1  # set by `register`
    immutable = False
    fixed_memory = True  # an ndarray's data pointer is its own for life (resize refuses: a plan holds it)
    xp: Any = np
    device = False
    direct = True  # MPI reads and writes these arrays in place: no staging copy
    _meminfo: tuple[float, int | None] = (-math.inf, None)  # (when read, MemAvailable)

    def problem(self) -> str:
        return ""

    # -- the user's array ----------------------------------------------------------------

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, np.ndarray)

    dtype = attrgetter("dtype")
    shape = attrgetter("shape")
    flags = attrgetter("flags")  # NumPy's own: c_contiguous and writeable, read in one question
    size = attrgetter("size")
    nbytes = attrgetter("nbytes")
    # C-contiguous (validated): a 1-D view, never a copy, as reshape(-1) is, in half the time.
    flat = staticmethod(np.ndarray.ravel)

    def ready(self, x: Any, out: Any) -> bool:
        """`Adapter.ready`, in attribute reads and one bounds test (a warm call's whole check)."""
        flags = x.flags
        if out is None:
            return flags.c_contiguous and flags.writeable
        out_flags = out.flags
        return (
            flags.c_contiguous
            and out_flags.c_contiguous
            and out_flags.writeable
            and type(out) is type(x)
            and out.shape == x.shape
            and out.dtype == x.dtype
            and not np.may_share_memory(x, out)
        )

    def check_device(self, array: Any, name: str) -> None:
        """ValueError if ``array`` lives somewhere this rank's MPI calls cannot use; host memory is fine."""

    def shares_memory(self, a: Any, b: Any) -> bool:
        return bool(np.may_share_memory(a, b) and np.shares_memory(a, b))  # bounds first: cheap

    def same_memory(self, a: Any, b: Any) -> bool:
        """Whether ``a`` and ``b`` are the same non-empty bytes (another view of them: in place)."""
        return bool(a.nbytes == b.nbytes > 0 and self.data_pointer(a) == self.data_pointer(b))

    def result(self, dst: Any, x: Any, shape: tuple[int, ...] | None = None) -> Any:
        raise AssertionError("NumPy arrays are written in place: a collective returns x or out")

    def allocate(self, x: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
        """A new array of ``x``'s kind, dtype and device, of ``shape``, and its flat native view:
        the output a collective makes where no ``out`` was given."""
        made = self.xp.empty(shape, dtype=x.dtype)
        return made, made.reshape(-1)

    # -- the compute side ----------------------------------------------------------------

    def data_pointer(self, array: Any) -> int:
        return int(array.__array_interface__["data"][0])  # `ctypes.data` builds an object: slower

    def current_device(self) -> int | None:
        """The device new work goes to (plans holding streams are per device); None on the host."""
        return None

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

    def staging(self, slot_bytes: int, marks: int) -> Any:
        raise TypeError("host arrays need no staging: MPI reads and writes them in place")

    def handoff(self, array: Any) -> Callable[[], AbstractContextManager[None]]:
        """Called by the thread that wrote ``array``; the returned context, entered by another
        thread, makes that thread see those writes. Host memory needs nothing."""
        return nullcontext
