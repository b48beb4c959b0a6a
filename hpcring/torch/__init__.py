"""PyTorch on MPI ranks: the ``"hpcring"`` backend of torch.distributed (DDP and FSDP2 with every
collective hpcring's), the launcher-free `init_process_group`, a DDP communication hook for a DDP
on gloo, and `ModuleGradientSync` over a module's ``p.grad`` for training without DDP.

    import hpcring.torch                                  # registers the "hpcring" backend
    hpcring.torch.init_process_group()                    # under mpiexec: rank and size from MPI
    model = torch.nn.parallel.DistributedDataParallel(net)   # or fully_shard(net): no hook

Importing this package imports torch; ``import hpcring`` never does.
"""

from __future__ import annotations

from .backend import Options, ProcessGroupHpcring, register
from .hook import HookState, allreduce_hook
from .launch import destroy_process_group, init_process_group
from .sync import GradientSync, ModuleGradientSync
from .work import Work

register()

__all__ = [
    "GradientSync",
    "HookState",
    "ModuleGradientSync",
    "Options",
    "ProcessGroupHpcring",
    "Work",
    "allreduce_hook",
    "destroy_process_group",
    "init_process_group",
]
