"""PyTorch tensors: a CPU tensor is reduced through a NumPy view of its memory, a CUDA tensor
through a CuPy view (DLPack), both in place, as NumPy and CuPy arrays are.

Two adapters, because the two need different compute sides (`base`): ``torch`` (CPU tensors,
NumPy's compute side, inherited) and ``torch_cuda`` (CUDA tensors, CuPy's, inherited; where
CuPy is missing it still registers, so a CUDA tensor gets a clear refusal, not a TypeError).
Both decline the by-type lookup (``types = ()``): a tensor's type does not say its device. A warm
call still finds the CPU one by type (``warm_types``): its `ready` says no to any tensor that is
not a CPU tensor it would accept, and such a call takes the full path.
The CUDA one is registered first and owns every tensor that is not on the CPU; the CPU one
owns any tensor, so an ``out`` on another device than a CPU ``x`` reaches `check_device`
and is refused there in words.

What a tensor must be, checked by `check_device` on the rank that has it, so that (as any
refusal of ``x``) the agreement makes it every rank's error: no ``requires_grad`` (a leaf
parameter; reduce ``p.grad`` or ``p.detach()``, which share its memory), dense (strided),
no lazy conjugate or negative bit (the memory does not hold the values), and on the CPU or
on this rank's current GPU.

A CUDA tensor's pending work is ordered by events on the tensor's own current stream, not by
synchronizing the device: CuPy's current stream waits for the tensor's stream before the
algorithms read it (`flat`), and the tensor's stream waits for CuPy's after the reduction
(`result`; ``immutable`` is set for that hand-back only, the tensor is written in place).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np
import torch

from ..ops import NAMES as DTYPE_NAMES
from ..ops import bfloat16
from . import register
from .base import Flags
from .numpy import NumpyAdapter

try:  # CUDA tensors compute as CuPy arrays; without CuPy they are refused, in words
    from .cupy import CupyAdapter as _CudaSide

    _CUPY_PROBLEM = ""
except ImportError as error:
    _CudaSide = NumpyAdapter  # type: ignore[assignment,misc]
    _CUPY_PROBLEM = str(error) or "needs CuPy: pip install -e '.[gpu]' in hpcring's clone"

# torch dtype -> NumPy dtype. Those hpcring cannot reduce (int8, bool, ...) map too, so the API's
# own message names them; a dtype with no NumPy twin is refused by `TorchAdapter.dtype`.
TO_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
    torch.int8: np.dtype(np.int8),
    torch.uint8: np.dtype(np.uint8),
    torch.int16: np.dtype(np.int16),
    torch.bool: np.dtype(np.bool_),
}


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The byte range [start, end) that a strided tensor's elements lie in."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return start, start + (last + 1) * t.element_size()


def _plain_cpu(t: torch.Tensor) -> bool:
    """A tensor the CPU adapter takes as it is: dense, contiguous, on the CPU, outside autograd,
    no lazy conjugate or negative bit (the layout first: is_contiguous() raises on others)."""
    return (
        t.layout is torch.strided
        and t.is_cpu
        and not t.requires_grad
        and t.is_contiguous()
        and not t.is_conj()
        and not t.is_neg()
    )


class TorchAdapter(NumpyAdapter):
    """CPU tensors: NumPy views of their memory, reduced in place."""

    kind = "torch"
    name = "numpy"  # the compute side: CPU tensors share NumPy's channel (scratch, plans)
    type_name = "torch.Tensor (CPU)"
    fixed_memory = False  # set_() and resize_() move a tensor's storage: a plan checks each start
    types: tuple[type, ...] = ()
    warm_types: tuple[type, ...] = (torch.Tensor,)
    contiguous_fix = "x.contiguous()"  # what the API's message for a non-contiguous x suggests
    by_type = False
    # a tensor `ready` took, as a NumPy array over its memory: its warm calls run in C on that;
    # and an output made there as a tensor
    host_view: Any = staticmethod(torch.Tensor.numpy)
    from_host: Any = staticmethod(torch.from_numpy)

    def problem(self) -> str:
        return ""

    # -- the user's tensor ---------------------------------------------------------------

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor)

    def dtype(self, array: Any) -> np.dtype:
        dtype = TO_NUMPY.get(array.dtype)
        if dtype is None:
            if array.dtype is torch.bfloat16:  # ml_dtypes' twin, imported the first time
                return bfloat16()
            names = ", ".join(DTYPE_NAMES)
            raise TypeError(
                f"dtype {str(array.dtype).removeprefix('torch.')} is not supported; use one of {names}"
            )
        return dtype

    def flags(self, array: Any) -> Flags:  # type: ignore[override]
        """Contiguous as torch says; writeable always (what cannot be written is refused by name)."""
        if array.layout is not torch.strided:  # is_contiguous() would raise a RuntimeError
            raise ValueError(
                f"a {str(array.layout).removeprefix('torch.')} tensor cannot be "
                "reduced; pass a dense one (.to_dense())"
            )
        return Flags(array.is_contiguous(), True)

    def shape(self, array: Any) -> tuple[int, ...]:
        return tuple(array.shape)

    def size(self, array: Any) -> int:
        return array.numel()

    def nbytes(self, array: Any) -> int:
        return array.numel() * array.element_size()

    def _refuse(self, array: Any, name: str) -> None:
        """The refusals common to every tensor: autograd and lazy bits (a layout: `flags`)."""
        if array.requires_grad:
            raise ValueError(
                f"{name} requires grad; reduce a tensor outside autograd, such as "
                f"p.grad or {name}.detach() (which shares its memory)"
            )
        if array.is_conj() or array.is_neg():
            bit, fix = ("conjugate", "resolve_conj") if array.is_conj() else ("negative", "resolve_neg")
            raise ValueError(
                f"{name} is a lazy {bit} view, whose memory does not hold its values, "
                f"so hpcring cannot write through it; pass {name}.{fix}()"
            )

    def check_device(self, array: Any, name: str) -> None:
        """A CPU tensor outside autograd; an ``out`` elsewhere is refused (x is on the CPU here)."""
        if not array.is_cpu:  # is_cpu: a fifth of the time of device.type
            raise ValueError(f"{name} is on {array.device} but x is on the CPU; pass x and out on one device")
        self._refuse(array, name)

    def ready(self, x: Any, out: Any) -> bool:
        """A warm call's one question: a dense, contiguous CPU tensor outside autograd with no
        lazy bits (and ``out`` one too, like ``x``, not meeting it); anything else, a CUDA tensor
        included, takes the full path."""
        if not _plain_cpu(x):
            return False
        if out is None:
            return True
        if not (type(out) is type(x) and _plain_cpu(out) and out.shape == x.shape and out.dtype is x.dtype):
            return False
        # Both contiguous on the CPU, of one size: the byte ranges [p, p + n) meet or they do not.
        a, b, n = x.data_ptr(), out.data_ptr(), x.numel() * x.element_size()
        return not (a < b + n and b < a + n)

    def shares_memory(self, a: Any, b: Any) -> bool:
        if a.device != b.device:
            return False
        (a0, a1), (b0, b1) = _extent(a), _extent(b)
        return a0 < b1 and b0 < a1

    def same_memory(self, a: Any, b: Any) -> bool:
        return bool(
            a.device == b.device and self.nbytes(a) == self.nbytes(b) > 0 and a.data_ptr() == b.data_ptr()
        )

    def allocate(self, x: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
        """A new tensor of ``x``'s dtype and device, of ``shape``, and its flat native view."""
        made = torch.empty(shape, dtype=x.dtype, device=x.device)
        return made, self.flat(made)

    def flat(self, array: Any) -> np.ndarray:
        """A 1-D NumPy view of the tensor's memory (bfloat16: through int16, NumPy has no torch twin)."""
        if array.dtype is torch.bfloat16:
            return array.view(torch.int16).numpy().ravel().view(bfloat16())
        return array.numpy().ravel()  # contiguous (validated): a view; ravel is 0.2 us under reshape


def _stream_of(array: Any) -> Any:
    """The tensor's current stream, as CuPy sees it."""
    import cupy

    return cupy.cuda.ExternalStream(torch.cuda.current_stream(array.device).cuda_stream, array.device.index)


def _order(after: Any, before: Any) -> None:
    """Make stream ``after`` wait (on the GPU, the host goes on) for the work queued on ``before``."""
    if after.ptr == before.ptr:
        return  # one stream: its work is in order already (torch's and CuPy's defaults both are 0)
    import cupy

    event = cupy.cuda.Event(block=False, disable_timing=True)
    event.record(before)
    after.wait_event(event)


class TorchCudaAdapter(TorchAdapter, _CudaSide):  # type: ignore[misc,valid-type]
    """CUDA tensors: CuPy views over DLPack on this rank's current GPU, reduced in place."""

    kind = "torch_cuda"
    name = "cupy"  # the compute side: CUDA tensors share CuPy's channel (scratch, plans, NCCL)
    type_name = "torch.Tensor (CUDA)"
    types = ()
    by_type = False
    immutable = True  # not so: `allreduce` hands back through `result`, which orders the streams
    host_view = from_host = None  # device memory: no NumPy view

    def __init__(self) -> None:
        if _CudaSide is not NumpyAdapter:
            _CudaSide.__init__(self)

    _problem: str | None = None

    def problem(self) -> str:
        """Why CUDA tensors can't compute here: no CuPy, or CuPy sees no GPU (asked once)."""
        if self._problem is None:
            self._problem = _CUPY_PROBLEM or _CudaSide.problem(self)
        return self._problem

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor) and not obj.is_cpu

    def check_device(self, array: Any, name: str) -> None:
        """A tensor on this rank's current GPU (CuPy's), outside autograd, in a dtype CuPy has."""
        if array.device.type != "cuda":
            raise ValueError(f"{name} is on {array.device}; hpcring takes CPU and CUDA tensors")
        problem = self.problem()
        if problem:
            raise ValueError(f"{name} is a CUDA tensor, but this process {problem}")
        self._refuse(array, name)
        if array.dtype is torch.bfloat16:
            raise ValueError(
                f"{name} is a bfloat16 CUDA tensor, and CuPy has no bfloat16; "
                f"reduce {name}.float() (or a bfloat16 tensor on the CPU)"
            )
        import cupy

        _ = self.direct  # how MPI takes device memory is settled on the first array, as for CuPy's
        current = cupy.cuda.Device().id
        if array.device.index != current:
            raise ValueError(
                f"{name} is on {array.device} but this rank's current device is GPU "
                f"{current}; call hpcring.select_device() once at start-up and allocate after it "
                "(torch.cuda.set_device(hpcring.select_device()))"
            )

    def flat(self, array: Any) -> Any:
        """A 1-D CuPy view of the tensor; CuPy's current stream first waits for the tensor's."""
        import cupy

        _order(cupy.cuda.get_current_stream(), _stream_of(array))
        return cupy.from_dlpack(array.detach().reshape(-1))

    def result(self, dst: Any, x: Any, shape: tuple[int, ...] | None = None) -> Any:
        """The result's tensor (``x``, or ``out``), once its stream waits for the collective."""
        import cupy

        _order(_stream_of(x), cupy.cuda.get_current_stream())
        return x

    def handoff(self, array: Any) -> Callable[[], AbstractContextManager[None]]:
        """An event on the tensor's stream now; the worker thread waits for it on the tensor's GPU."""
        import cupy

        device = array.device.index
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(_stream_of(array))

        @contextmanager
        def entered() -> Iterator[None]:
            with cupy.cuda.Device(device):
                event.synchronize()
                yield
                cupy.cuda.get_current_stream().synchronize()

        return entered


# The CUDA adapter first: it owns what is not on the CPU, the CPU one then owns the rest.
register("torch_cuda", TorchCudaAdapter())
register("torch", TorchAdapter())
