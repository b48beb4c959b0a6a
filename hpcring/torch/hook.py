"""`allreduce_hook`: a DDP communication hook that all-reduces DDP's buckets with hpcring, for a DDP
on another backend (gloo). On the ``"hpcring"`` backend DDP needs no hook: its own all-reduce is
hpcring's already."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from mpi4py import MPI

from ..nonblocking import iallreduce
from .work import Completer, Work


@dataclass
class HookState:
    """What `allreduce_hook` reduces with: the algorithm and the communicator (COMM_WORLD).

    The communicator must hold the same processes as DDP's group, in the same order (a DDP
    built on `init_process_group`'s default group over COMM_WORLD does).
    """

    algorithm: str = "ring"
    comm: MPI.Intracomm | None = None
    check: bool = True  # the ranks agree on each bucket before its data moves (see allreduce)
    completer: Completer | None = field(default=None, repr=False, compare=False)  # made on first use


def allreduce_hook(state: HookState | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: the bucket's mean over the ranks, reduced by hpcring.

    Named after PyTorch's ``default_hooks.allreduce_hook``, and used the same way:
    ``model.register_comm_hook(HookState(), allreduce_hook)`` (``None`` as the state takes the
    defaults). Asynchronous: the all-reduce runs on hpcring's progress thread (`iallreduce`)
    while backward goes on, and the future completes, in place, when it is done; an error
    (raised by hpcring on every rank) fails the future, and DDP raises it from backward.
    """
    state = state if state is not None else HookState()
    if state.completer is None:
        state.completer = Completer("hpcring-ddp-hook")
    tensor = bucket.buffer()
    request = iallreduce(tensor, op="mean", algorithm=state.algorithm, comm=state.comm, check=state.check)
    work = state.completer.add(Work([tensor], "allreduce_hook", value=tensor), [request])
    return work.get_future()


# DDP checks the hook's annotations against its own types, which postponed (string) annotations
# are not: the real ones, as PyTorch's default hooks carry.
allreduce_hook.__annotations__.update(
    state=HookState | None, bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]}
)

__all__ = ["HookState", "allreduce_hook"]
