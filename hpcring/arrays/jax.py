"""JAX arrays, outside ``jit``: immutable, so the algorithms reduce a NumPy copy and `allreduce`
returns a new ``jax.Array`` on the input's device.

``out=`` is refused: nothing can be written into a JAX array. A tracer (a call inside
``jax.jit``, ``grad`` or ``vmap``) is refused in words: hpcring's algorithms are Python and
MPI calls that run now, on values, and a traced function has none; `hpcring.jax`'s collectives
are the ones that run inside ``jit`` (ordered host callbacks). Single-device CPU arrays only: a
sharded array, or one on a GPU, is refused (the CPU copy a GPU array would need is the user's to choose).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from . import register
from .base import Flags
from .numpy import NumpyAdapter

_WRITABLE = Flags(True, True)  # a JAX array is one dense row-major buffer; the algorithms get a copy


class JaxAdapter(NumpyAdapter):
    """Single-device CPU ``jax.Array``: a NumPy copy reduced, a new array returned."""

    kind = "jax"
    name = "numpy"  # the compute side: NumPy's channel (scratch, plans) serves JAX's copies too
    type_name = "jax.Array"
    types: tuple[type, ...] = ()  # jax.Array is abstract: its concrete types are cached on first sight
    by_type = True
    immutable = True

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, jax.Array)

    def dtype(self, array: Any) -> np.dtype:
        return np.dtype(array.dtype)  # JAX's dtypes are NumPy's (bfloat16: ml_dtypes', as hpcring's)

    def flags(self, array: Any) -> Flags:  # type: ignore[override]
        return _WRITABLE

    def shape(self, array: Any) -> tuple[int, ...]:
        return tuple(array.shape)

    def size(self, array: Any) -> int:
        return int(array.size)

    def nbytes(self, array: Any) -> int:
        return int(array.size) * np.dtype(array.dtype).itemsize

    def check_device(self, array: Any, name: str) -> None:
        """A concrete array on one CPU device; ``out`` never (JAX arrays are immutable)."""
        if isinstance(array, jax.core.Tracer):
            raise ValueError(
                f"{name} is a JAX tracer: hpcring runs outside jax.jit (and grad, "
                "vmap), on concrete arrays; call it between jitted steps, or use hpcring.jax.allreduce "
                "inside jit"
            )
        if name == "out":
            raise ValueError(
                "out= cannot be a jax.Array: JAX arrays are immutable; use the array the collective returns"
            )
        if array.is_deleted():
            raise ValueError(f"{name} was deleted (donated to a jitted call)")
        devices = array.devices()
        if len(devices) != 1:
            raise ValueError(
                f"{name} is sharded over {len(devices)} devices; hpcring takes an "
                "array on one device (each MPI rank holds its own)"
            )
        (device,) = devices
        if device.platform != "cpu":
            raise ValueError(
                f"{name} is on {device}; hpcring takes JAX arrays on the CPU "
                f"(jax.device_put({name}, jax.devices('cpu')[0]))"
            )

    def ready(self, x: Any, out: Any) -> bool:
        """A warm call's one question (main's fast path asks it of by-type kinds): in place only,
        and what `check_device` asks, every call (a later array may be a tracer, or deleted)."""
        if out is not None:
            return False
        try:
            self.check_device(x, "x")
        except ValueError:
            return False
        return True

    def shares_memory(self, a: Any, b: Any) -> bool:
        return False  # nothing is written into a JAX array: no overlap can matter

    def same_memory(self, a: Any, b: Any) -> bool:
        return False

    def flat(self, array: Any) -> np.ndarray:
        """A writable 1-D NumPy copy: the algorithms reduce it (JAX's own buffer is read-only)."""
        return np.array(array, copy=True).reshape(-1)

    def result(self, dst: Any, x: Any, shape: tuple[int, ...] | None = None) -> Any:
        """A new ``jax.Array`` of ``shape`` (default ``x``'s) on ``x``'s device, from the result."""
        (device,) = x.devices()
        return jax.device_put(dst.reshape(x.shape if shape is None else shape), device)

    def allocate(self, x: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
        """No JAX array can be written: the output is a NumPy buffer, wrapped by `result`."""
        return None, np.empty(int(np.prod(shape, dtype=np.int64)), dtype=self.dtype(x))


register("jax", JaxAdapter())
