"""PyTorch on MPI ranks: the process group DDP needs, a DDP communication hook that all-reduces
with hpcring, and `GradientSync` over a module's ``p.grad`` for training without DDP.

    import hpcring.torch
    hpcring.torch.init_process_group()                 # under mpiexec: rank and size from MPI
    model = torch.nn.parallel.DistributedDataParallel(net)
    model.register_comm_hook(hpcring.torch.HookState(algorithm="ring"), hpcring.torch.allreduce_hook)

Importing this module imports torch; ``import hpcring`` never does.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from . import training
from .arrays import adapter_for
from .comm import intracomm
from .nonblocking import Request, iallreduce, progress_for

MiB = 1 << 20


# -- the process group -------------------------------------------------------------------------


def _rank0_address(comm: MPI.Intracomm) -> str:
    """An address of rank 0 that every rank can reach: loopback on one node, else rank 0's host's.

    Collective. Rank 0 resolves its host name; where that is a loopback address (Debian maps the
    host name to 127.0.1.1) it asks the kernel which of its addresses routes to another node's
    rank (a UDP socket's connect sends nothing).
    """
    hosts = comm.allgather(socket.gethostname())
    if len(set(hosts)) == 1:
        return "127.0.0.1"
    address = ""
    if comm.rank == 0:
        address = socket.gethostbyname(hosts[0])
        if address.startswith("127."):
            other = next(host for host in hosts if host != hosts[0])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((socket.gethostbyname(other), 9))
                address = probe.getsockname()[0]
    return comm.bcast(address, root=0)


def _free_port() -> int:
    """A TCP port free on this host now (the kernel picks it; the store binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def init_process_group(
    backend: str = "gloo", *, comm: MPI.Intracomm | None = None, timeout: float = 300.0, **kwargs: Any
) -> None:
    """Bring up ``torch.distributed``'s default group over the ranks of ``comm`` (COMM_WORLD).

    Collective. Rank and world size are MPI's; rank 0 chooses the address (MASTER_ADDR where
    set, loopback on one node, else its host's) and a free port (MASTER_PORT where set) and
    broadcasts them, so no launcher variables are needed under ``mpiexec`` or ``srun``. Does
    nothing where the group is up already. ``kwargs`` go to `torch.distributed.init_process_group`.
    """
    comm = intracomm(comm, "hpcring.torch.init_process_group")
    if dist.is_initialized():
        return
    address = os.environ.get("MASTER_ADDR") or _rank0_address(comm)
    port = int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else 0
    if comm.rank == 0 and port == 0:
        port = _free_port()
    port = comm.bcast(port, root=0)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}:{port}",
        rank=comm.rank,
        world_size=comm.size,
        timeout=timedelta(seconds=timeout),
        **kwargs,
    )


# -- the DDP communication hook ------------------------------------------------------------------


@dataclass
class HookState:
    """What `allreduce_hook` reduces with: the algorithm and the communicator (COMM_WORLD).

    The communicator must hold the same processes as DDP's group, in the same order (a DDP
    built on `init_process_group`'s default group over COMM_WORLD does).
    """

    algorithm: str = "ring"
    comm: MPI.Intracomm | None = None
    check: bool = True  # the ranks agree on each bucket before its data moves (see allreduce)


def allreduce_hook(state: HookState | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: the bucket's mean over the ranks, reduced by hpcring.

    Named after PyTorch's ``default_hooks.allreduce_hook``, and used the same way:
    ``model.register_comm_hook(HookState(), allreduce_hook)`` (``None`` as the state takes the
    defaults). Asynchronous: the all-reduce runs on hpcring's progress thread (`iallreduce`)
    while backward goes on, and the future completes, in place, when it is done; an error
    (raised by hpcring on every rank) fails the future, and DDP raises it from backward.
    """
    state = state if state is not None else HookState()
    tensor = bucket.buffer()
    request = iallreduce(tensor, op="mean", algorithm=state.algorithm, comm=state.comm, check=state.check)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    # The engine runs its jobs in submission order, so this one runs once the all-reduce is done.
    progress_for(state.comm).submit(lambda: _complete(future, request, tensor))
    return future


# DDP checks the hook's annotations against its own types, which postponed (string) annotations
# are not: the real ones, as PyTorch's default hooks carry.
allreduce_hook.__annotations__.update(
    state=HookState | None, bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]}
)


def _complete(future: torch.futures.Future[torch.Tensor], request: Request, tensor: torch.Tensor) -> None:
    try:
        request.wait()
    except BaseException as error:
        future.set_exception(error)
    else:
        future.set_result(tensor)


# -- GradientSync over a module's p.grad ---------------------------------------------------------


def _torch_view(native: Any) -> torch.Tensor:
    """A tensor over a native bucket view's memory (NumPy: from_numpy, bfloat16 via int16; CuPy: DLPack)."""
    if isinstance(native, np.ndarray):
        if native.dtype.name == "bfloat16":
            return torch.from_numpy(native.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(native)
    return torch.from_dlpack(native)


class GradientSync:
    """`hpcring.GradientSync` over the ``p.grad`` of a module's parameters (collective construction).

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
    ) -> None:
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
        )
        self.grads = [_torch_view(g) for g in self.sync.grads]  # p.grad of each parameter, in a bucket
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


__all__ = ["GradientSync", "HookState", "allreduce_hook", "init_process_group"]
