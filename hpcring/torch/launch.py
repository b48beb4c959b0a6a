"""`init_process_group`: torch.distributed brought up over MPI's ranks, no launcher variables needed."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from mpi4py import MPI

from ..comm import intracomm
from .backend import NAME, Options


def rank0_address(comm: MPI.Intracomm) -> str:
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


def free_port() -> int:
    """A TCP port free on this host now (the kernel picks it; the store binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def init_process_group(
    backend: str = NAME,
    *,
    comm: MPI.Intracomm | None = None,
    timeout: float = 300.0,
    algorithm: str | dict[str, str] | None = None,
    check: bool = True,
    **kwargs: Any,
) -> None:
    """Bring up ``torch.distributed``'s default group over the ranks of ``comm`` (COMM_WORLD).

    Collective. ``backend`` is ``"hpcring"`` (every collective hpcring's: DDP and FSDP2 need
    no hook) or any of torch's (``"gloo"``). Rank and world size are MPI's; rank 0 chooses the
    address (MASTER_ADDR where set, loopback on one node, else its host's) and a free port
    (MASTER_PORT where set) and broadcasts them, so no launcher variables are needed under
    ``mpiexec`` or ``srun``. Does nothing where the group is up already. ``algorithm`` and
    ``check`` are the hpcring backend's (`Options`); ``timeout`` bounds every collective (a
    rank missing that long is a `hpcring.StallError`). ``kwargs`` go to
    `torch.distributed.init_process_group`.
    """
    comm = intracomm(comm, "hpcring.torch.init_process_group")
    if dist.is_initialized():
        return
    if backend == NAME:
        if "pg_options" in kwargs:
            raise TypeError("hpcring.torch.init_process_group: pass algorithm= and check=, not pg_options=")
        kwargs["pg_options"] = Options(algorithm=algorithm, comm=comm, check=check)
    elif algorithm is not None:
        raise ValueError(
            f"hpcring.torch.init_process_group: algorithm= applies to the hpcring backend, not {backend!r}"
        )
    address = os.environ.get("MASTER_ADDR") or rank0_address(comm)
    port = int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else 0
    if comm.rank == 0 and port == 0:
        port = free_port()
    port = comm.bcast(port, root=0)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}:{port}",
        rank=comm.rank,
        world_size=comm.size,
        timeout=timedelta(seconds=timeout),
        **kwargs,
    )


def destroy_process_group(pause: float = 0.5) -> None:
    """`torch.distributed.destroy_process_group`, then ``pause`` seconds with the GIL free.

    A gloo worker thread drops its last reference to a collective launched inside ``backward``
    a moment after the collective completes, and that needs the GIL: where the interpreter has
    begun to exit by then, the process aborts ("terminate called without an active exception",
    pytorch/pytorch#190489). Destroying the group does not join those threads, so the pause
    lets them finish first. Call it last, as a script leaves; does nothing where no group is up.
    """
    if not dist.is_initialized():
        return
    dist.destroy_process_group()
    time.sleep(pause)


__all__ = ["destroy_process_group", "free_port", "init_process_group", "rank0_address"]
