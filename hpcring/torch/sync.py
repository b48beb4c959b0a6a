"""`ModuleGradientSync`: hpcring's bucketed, overlapped gradient all-reduce over a module's ``p.grad``,
for training without DDP (`hpcring.GradientSync` underneath)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from .. import training
from ..arrays import adapter_for

MiB = 1 << 20


def torch_view(native: Any) -> torch.Tensor:
    """A tensor over a native bucket view's memory (NumPy: from_numpy, bfloat16 via int16; CuPy: DLPack)."""
    if isinstance(native, np.ndarray):
        if native.dtype.name == "bfloat16":
            return torch.from_numpy(native.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(native)
    return torch.from_dlpack(native)


class ModuleGradientSync:
    """`hpcring.GradientSync` over the ``p.grad`` of a module's parameters (collective construction).

    Until 0.1 this was ``hpcring.torch.GradientSync``, a name that still works (with a
    FutureWarning): it takes a module, where `hpcring.GradientSync` takes a list of arrays.

    Wraps `hpcring.training.GradientSync` rather than extending it: that one buckets native
    arrays (NumPy, CuPy) and knows nothing of autograd, and what PyTorch adds is all about
    ``p.grad``: each ``p.grad`` becomes a tensor view into a bucket, so backward accumulates
    straight into what is sent, and with ``overlap`` a post-accumulate-grad hook on each
    parameter marks it ready as backward produces it, so the last layers' buckets are
    reduced while the first layers' gradients are computed. A step:

        loss.backward()        # with overlap, buckets launch during backward
        sync.wait()            # every bucket reduced: p.grad holds the mean over the ranks
        optimizer.step()
        optimizer.zero_grad()  # set_to_none is fine: the next backward's grads are copied in

    Every rank must pass the same parameters (shapes, dtypes) in the same order.
    """

    def __init__(
        self,
        params: torch.nn.Module | Iterable[torch.nn.Parameter],
        *,
        comm: MPI.Intracomm | None = None,
        bucket_bytes: int = 25 * MiB,
        first_bucket_bytes: int = 1 * MiB,
        algorithm: str = "auto",
        op: str | MPI.Op = "mean",
        overlap: bool = True,
        check: bool = True,
        reproducible: bool = False,
        wire: str | None = None,
        error_feedback: bool = False,
    ) -> None:
        """``reproducible``, ``wire`` and ``error_feedback`` are `hpcring.GradientSync`'s: the same
        bits at any rank count, the buckets sent narrowed (bfloat16, float16), and each rank's
        rounding residual carried into its next step (docs/training.md, docs/compression.md)."""
        if isinstance(params, torch.nn.Module):
            params = params.parameters()
        self.params = [p for p in params if p.requires_grad]
        natives = []
        for p in self.params:
            template = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
            natives.append(adapter_for(template).flat(template).reshape(tuple(p.shape)))
        self.sync = training.GradientSync(
            natives,
            comm=comm,
            bucket_bytes=bucket_bytes,
            first_bucket_bytes=first_bucket_bytes,
            algorithm=algorithm,
            op=op,
            check=check,
            reproducible=reproducible,
            wire=wire,
            error_feedback=error_feedback,
        )
        self.grads = [torch_view(g) for g in self.sync.grads]  # p.grad of each parameter, in a bucket
        self._marked = [False] * len(self.params)
        for p, grad in zip(self.params, self.grads, strict=True):
            p.grad = grad
        self._hooks = (
            [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(self.params)]
            if overlap
            else []
        )

    def _hook(self, index: int) -> Any:
        def ready(p: torch.Tensor) -> None:
            self.ready(index)

        return ready

    def ready(self, index: int) -> None:
        """Parameter ``index``'s gradient is complete: bring it into its bucket, maybe launch the bucket."""
        p, view = self.params[index], self.grads[index]
        if p.grad is None:  # not used in this step's graph: it contributes zeros
            view.zero_()
        elif p.grad is not view:  # zero_grad(set_to_none=True) made backward allocate a new one
            view.copy_(p.grad)
        p.grad = view
        self._marked[index] = True
        self.sync.ready(index)

    def wait(self) -> None:
        """Every bucket reduced (marking first whatever backward did not reach): ``p.grad`` holds
        the result. The first error of a bucket's all-reduce, raised on every rank, comes out here."""
        for index, marked in enumerate(self._marked):
            if not marked:
                self.ready(index)
        try:
            self.sync.wait()
        finally:
            self._marked = [False] * len(self.params)
        for p, view in zip(self.params, self.grads, strict=True):
            p.grad = view

    def zero(self) -> None:
        """Every gradient zero (one fill per bucket), for loops that accumulate into ``p.grad``."""
        self.sync.zero()

    def remove(self) -> None:
        """Take the hooks off the parameters (``p.grad`` keeps its last values)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    @property
    def stats(self) -> training.StepStats:
        """Where the last step's communication time went."""
        return self.sync.stats


class GradientSync(ModuleGradientSync):
    """The old name of `ModuleGradientSync` (same arguments); warns once per construction."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        warnings.warn(
            "hpcring.torch.GradientSync is now hpcring.torch.ModuleGradientSync (it takes a module; "
            "hpcring.GradientSync takes a list of arrays); the old name will go in a later release",
            FutureWarning,
            stacklevel=2,
        )
        super().__init__(*args, **kwargs)


__all__ = ["GradientSync", "ModuleGradientSync", "torch_view"]
