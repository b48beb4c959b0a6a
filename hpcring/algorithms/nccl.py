"""NCCL's all-reduce through CuPy: the baseline GPU users compare against, not one of ours.

The NCCL communicator is bootstrapped over MPI (rank 0's unique id, broadcast) once per
communicator. NCCL needs one GPU per rank: where ranks share a GPU (one GPU, several
ranks) it refuses, and so does this module, on every rank, with the reason. It is not in
`hpcring.ALGORITHMS` (it cannot run on the CPU); the bench adds it on GPUs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Spec, no_scratch

if TYPE_CHECKING:
    from ..channel import Channel
    from ..ops import Op


def refuses(adapter: Any) -> str | None:
    """Why this rank's arrays cannot go to NCCL (a local check, before the ranks agree)."""
    return None if adapter.device else "algorithm 'nccl' needs CuPy arrays on a GPU"


def unavailable(comm: Any) -> str | None:
    """Why NCCL cannot run on ``comm`` (collective), or None when it can.

    Every rank gets the same answer: the GPU identities are gathered, so a shared GPU
    anywhere is seen everywhere.
    """
    mine: tuple[str, str] | None = None
    problem = ""
    try:
        from cupy.cuda import nccl

        from ..gpu import gpu_identity

        if not nccl.available:
            problem = "CuPy was built without NCCL"
        else:
            from mpi4py import MPI

            mine = (MPI.Get_processor_name(), gpu_identity())
    except Exception as error:  # no CuPy, no GPU, no NCCL library
        problem = f"CuPy's NCCL is not usable here ({type(error).__name__}: {error})"
    everyone = comm.allgather((mine, problem))
    problems = [p for _, p in everyone if p]
    if problems:
        return problems[0]
    owners: dict[tuple[str, str], list[int]] = {}
    for rank, (gpu, _) in enumerate(everyone):
        owners.setdefault(gpu, []).append(rank)
    for (host, bus), ranks in owners.items():
        if len(ranks) > 1:
            return (
                f"ranks {', '.join(map(str, ranks))} share GPU {bus} on {host}: NCCL needs one GPU per rank "
                f"({len(owners)} GPU{'s' if len(owners) > 1 else ''} for {len(everyone)} ranks)"
            )
    return None


def _communicator(ch: Channel) -> Any:
    """The NCCL communicator of ``ch``, made once (collective: every rank of ``ch``)."""

    def build() -> Any:
        from cupy.cuda import nccl

        ch.arrive("the NCCL communicator's setup")  # the allgather and bcast below
        reason = unavailable(ch.comm)
        if reason:
            raise RuntimeError(f"algorithm 'nccl' is unavailable: {reason}")
        uid = ch.comm.bcast(nccl.get_unique_id() if ch.rank == 0 else None, root=0)
        return nccl.NcclCommunicator(ch.size, uid, ch.rank)

    return ch.resource("nccl", build)


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src), by ncclAllReduce on the current stream."""
    import cupy
    from cupy.cuda import nccl

    comm = _communicator(ch)
    count, dtype = src.size, src.dtype
    if dtype.kind == "c":  # a complex sum is the sum of its real and imaginary parts
        if op.ufunc != "add":
            raise TypeError(f"nccl cannot apply op={op.name!r} to {dtype.name}")
        count, dtype = 2 * count, src.real.dtype
    types = {
        "float16": nccl.NCCL_FLOAT16,
        "float32": nccl.NCCL_FLOAT32,
        "float64": nccl.NCCL_FLOAT64,
        "int32": nccl.NCCL_INT32,
        "int64": nccl.NCCL_INT64,
    }
    # By element-wise function, so mean (a sum, divided by the caller) is a sum here too.
    ops = {
        "add": nccl.NCCL_SUM,
        "multiply": nccl.NCCL_PROD,
        "maximum": nccl.NCCL_MAX,
        "minimum": nccl.NCCL_MIN,
    }
    ch.traffic.unknown = True
    stream = cupy.cuda.get_current_stream()
    comm.allReduce(src.data.ptr, dst.data.ptr, count, types[dtype.name], ops[op.ufunc], stream.ptr)
    stream.synchronize()  # like every algorithm: the result is complete on return


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> None:
    """Unknown: NCCL's traffic (rings, trees, NVLink) is its own business."""
    return None


ALLREDUCE = Spec(
    run=allreduce, bytes_sent=bytes_sent, scratch_bytes=no_scratch, blocking=True, refuses=refuses
)
