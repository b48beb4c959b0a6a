"""The ``"hpcring"`` backend of ``torch.distributed``: a process group whose collectives are hpcring's.

`register()` (run by ``import hpcring.torch``) makes ``"hpcring"`` a backend name for the cpu
and cuda devices, so ``torch.distributed.init_process_group("hpcring")`` builds a
`ProcessGroupHpcring`, and DDP, FSDP2 (``fully_shard``) and the object collectives run on it
with no hook. Each collective is one of hpcring's non-blocking ones (`hpcring.nonblocking`) on
the group's communicator, so every one of them runs on hpcring's progress thread, in the
order issued, and ``async_op=True`` returns at once while the data moves; the group's
`Completer` completes the torch Work when the data is there. hpcring's guarantees come along:
the ranks agree on each call before data moves (a mismatch raises on every rank), and a rank
that does not arrive within the group's timeout is a `hpcring.StallError` naming it.

What torch calls, and what runs:

- ``allreduce`` (SUM, AVG, MAX, MIN, PRODUCT) and ``allreduce_coalesced``: `iallreduce`
  (AVG is hpcring's ``mean``);
- ``broadcast``: `ibroadcast`;
- ``allgather`` (a list of outputs), ``all_gather_single`` (``all_gather_into_tensor``,
  ``_allgather_base``) and their coalesced forms: `iallgather`;
- ``reduce_scatter`` (a list of inputs), ``reduce_scatter_single``
  (``reduce_scatter_tensor``, ``_reduce_scatter_base``) and their coalesced forms:
  `ireduce_scatter`, whose parts are torch's (equal, in rank order);
- ``barrier``: a one-element all-reduce (as NCCL's barrier is), so it is bounded and named too.

Anything else (send, recv, gather, scatter, reduce, all-to-all, BAND/BOR/BXOR/PREMUL_SUM)
raises NotImplementedError naming it, on the rank that calls it: no other backend stands in.
Tensors of a dtype hpcring cannot reduce (uint8, bool: the object collectives' bytes) move
through the all-gather and the broadcast as 8-byte words, exactly; a reduction of one raises
hpcring's TypeError on every rank. CPU tensors are tested; CUDA tensors go through hpcring's
CuPy path and are untested (no GPU where this was written).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from mpi4py import MPI

from .. import algorithms, config
from ..comm import intracomm
from ..nonblocking import iallgather, iallreduce, ibroadcast, ireduce_scatter
from .work import Completer, Work, done

NAME = "hpcring"
DEFAULT_ALGORITHM = "ring"
# torch's reductions -> hpcring's ops; the others are refused by name.
OPS: dict[Any, str] = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "mean",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.PRODUCT: "prod",
}
# dtypes that move as themselves; any other moves as bytes (in 8-byte words), or is refused by a reduction
MOVABLE = {
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.complex64,
    torch.complex128,
}
WORD = torch.int64


@dataclass
class Options:
    """How a `ProcessGroupHpcring` runs: pass as ``pg_options=`` to
    ``torch.distributed.init_process_group("hpcring", ...)`` (or ``new_group``), or as the
    arguments of `hpcring.torch.init_process_group`.

    ``algorithm``: one name for every collective, or a dict ``{collective: name}`` with keys
    among allreduce, reduce_scatter, allgather, broadcast (the others keep the default);
    None: HPCRING_ALGO, else ``ring``. ``comm``: the MPI communicator whose ranks are the
    group's (default COMM_WORLD, in torch's rank order); a subgroup takes its ranks from it.
    ``check``: the agreement before each call (see `hpcring.allreduce`).
    """

    algorithm: str | dict[str, str] | None = None
    comm: MPI.Intracomm | None = None
    check: bool = True
    _timeout: timedelta | None = field(default=None, repr=False)  # torch reads pg_options._timeout

    def algorithms(self) -> dict[str, str]:
        """The algorithm of each collective: the argument, else HPCRING_ALGO, else ``ring``.
        A key that is no collective raises ValueError (a name hpcring lacks is refused by the call)."""
        given = self.algorithm if self.algorithm is not None else config.current().algo
        if isinstance(given, str):
            given = {"*": given}
        chosen = dict.fromkeys(algorithms.COLLECTIVES, given.get("*", DEFAULT_ALGORITHM))
        for key, name in given.items():
            if key != "*" and key not in chosen:
                raise ValueError(
                    f"hpcring backend: no collective {key!r} to choose an algorithm for; "
                    f"choose among {', '.join(algorithms.COLLECTIVES)}"
                )
            if key != "*":
                chosen[key] = name
        return chosen


_default: list[Any] = []  # the default group's Options and communicator, for its subgroups


class ProcessGroupHpcring(dist.ProcessGroup):
    """A torch process group over an MPI communicator; every collective is hpcring's (see the module).

    Built by torch (``init_process_group("hpcring")``, ``new_group``), not by hand.
    """

    def __init__(
        self, store: dist.Store, rank: int, size: int, comm: MPI.Intracomm, options: Options, timeout: float
    ) -> None:
        super().__init__(rank, size)  # (store, rank, size) is not a Python subclass's in torch 2.13
        if comm.Get_rank() != rank or comm.Get_size() != size:
            raise RuntimeError(
                f"hpcring backend: torch says rank {rank} of {size}, MPI rank {comm.Get_rank()} of "
                f"{comm.Get_size()}; start the processes with mpiexec or srun"
            )
        self.comm = comm
        self.options = options
        self.algorithm = options.algorithms()
        self.timeout = timeout
        self._group_name = ""
        self._group_desc = ""
        self._completer = Completer(f"hpcring-torch-{id(self):x}")
        self._lock = threading.Lock()  # torch may issue from several threads: one submission at a time

    # -- what torch asks of any process group ------------------------------------------------

    def getBackendName(self) -> str:
        return NAME

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def abort(self) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Complete what is in flight, stop the completer, free the communicator (and hpcring's
        state on it): `destroy_process_group` calls it on every rank."""
        self._completer.stop()
        if not MPI.Is_finalized() and self.comm != MPI.COMM_NULL:
            if _default and _default[1] is self.comm:
                _default.clear()
            self.comm.Free()

    # -- submitting ------------------------------------------------------------------------------

    def _submit(
        self,
        name: str,
        result: list[torch.Tensor],
        start: Callable[[], list[Any]],
        then: Callable[[], None] | None = None,
    ) -> Work:
        """Start hpcring's requests (``start()``) and hand them to the completer, as one Work."""
        with self._lock:
            return self._completer.add(Work(result, name), start(), then)

    def _common(self) -> dict[str, Any]:
        return {"comm": self.comm, "check": self.options.check, "timeout": self.timeout}

    # -- all-reduce -------------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        op = _op(opts, "allreduce")
        staged = [_Staged(t, "allreduce") for t in tensors]
        algorithm = self.algorithm[algorithms.ALLREDUCE]
        return self._submit(
            "allreduce",
            tensors,
            lambda: [iallreduce(s.x, op=op, algorithm=algorithm, **self._common()) for s in staged],
            _copy_back(staged),
        )

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return self.allreduce(tensors, opts)

    # -- broadcast -------------------------------------------------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        root = int(getattr(opts, "rootRank", 0))
        staged = [_Staged(t, "broadcast", words=True) for t in tensors]
        algorithm = self.algorithm[algorithms.BROADCAST]
        return self._submit(
            "broadcast",
            tensors,
            lambda: [ibroadcast(s.x, root=root, algorithm=algorithm, **self._common()) for s in staged],
            _copy_back(staged),
        )

    # -- all-gather ------------------------------------------------------------------------------

    def allgather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Work:
        """Each input to a list of G outputs (DDP's shape check, the object collectives)."""
        for outputs in output_tensors:
            if len(outputs) != self.size():
                raise ValueError(
                    f"hpcring backend: allgather needs {self.size()} output tensors, got {len(outputs)}"
                )
        staged = [_Staged(t, "allgather", words=True) for t in input_tensors]
        algorithm = self.algorithm[algorithms.ALLGATHER]
        requests: list[Any] = []

        def start() -> list[Any]:
            requests[:] = [iallgather(s.x, algorithm=algorithm, **self._common()) for s in staged]
            return requests

        def then() -> None:
            for s, outputs, request in zip(staged, output_tensors, requests, strict=True):
                for out, row in zip(outputs, request.wait(), strict=True):
                    _copy_into(out, s.unwords(row))

        return self._submit("allgather", [t for outputs in output_tensors for t in outputs], start, then)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        """``all_gather_into_tensor``: every rank's input, in rank order, into one output (FSDP2's
        parameters; FSDP2 passes the input as this rank's part of the output: in place)."""
        g = self.size()
        if output.numel() != g * input.numel() or output.dtype != input.dtype:
            raise ValueError(
                f"hpcring backend: all_gather_single needs an output of {g} x {input.numel()} "
                f"{input.dtype} elements, got {output.numel()} {output.dtype}"
            )
        algorithm = self.algorithm[algorithms.ALLGATHER]
        if output.is_contiguous() and input.is_contiguous() and input.dtype in MOVABLE:
            rows = output.view(g, *input.shape)
            return self._submit(
                "all_gather_single",
                [output],
                lambda: [iallgather(input, out=rows, algorithm=algorithm, **self._common())],
            )
        return self.allgather([list(output.reshape(g, -1).unbind(0))], [input.reshape(-1)], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return self._after(works, outputs, "all_gather_single_coalesced")

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        return self.allgather(output_lists, inputs, opts)

    # -- reduce-scatter --------------------------------------------------------------------------

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        """``reduce_scatter_tensor``: part r of the input, reduced over the ranks, into rank r's
        output (FSDP2's gradients). The parts are equal: torch's and hpcring's cuts agree."""
        g = self.size()
        if input.numel() != g * output.numel() or output.dtype != input.dtype:
            raise ValueError(
                f"hpcring backend: reduce_scatter_single needs an input of {g} x {output.numel()} "
                f"{output.dtype} elements, got {input.numel()} {input.dtype}"
            )
        op = _op(opts, "reduce_scatter")
        source = _Staged(input, "reduce_scatter")
        target = _Staged(output, "reduce_scatter", fresh=True)
        algorithm = self.algorithm[algorithms.REDUCE_SCATTER]
        return self._submit(
            "reduce_scatter_single",
            [output],
            lambda: [
                ireduce_scatter(
                    source.x, out=target.x.reshape(-1), op=op, algorithm=algorithm, **self._common()
                )
            ],
            _copy_back([target]),
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> Work:
        """Each list of G inputs, concatenated, reduce-scattered into its output."""
        works = []
        for output, inputs in zip(outputs, input_lists, strict=True):
            if len(inputs) != self.size():
                raise ValueError(
                    f"hpcring backend: reduce_scatter needs {self.size()} input tensors, got {len(inputs)}"
                )
            joined = torch.cat([t.reshape(-1) for t in inputs])
            works.append(self.reduce_scatter_single(output, joined, opts))
        return self._after(works, outputs, "reduce_scatter")

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return self._after(works, outputs, "reduce_scatter_single_coalesced")

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- barrier ---------------------------------------------------------------------------------

    def barrier(self, opts: Any = None) -> Work:
        """A one-element all-reduce: every rank has arrived once it completes (bounded, named)."""
        one = torch.ones(1, dtype=torch.int32)
        return self._submit(
            "barrier",
            [one],
            lambda: [
                iallreduce(one, op="sum", algorithm=self.algorithm[algorithms.ALLREDUCE], **self._common())
            ],
        )

    # -- not supported: said, never hung, never another backend ------------------------------------

    def _after(self, works: Sequence[Work], result: list[torch.Tensor], name: str) -> Work:
        """One Work done when every one of ``works`` is."""
        if not works:
            return done(result, name)
        return self._submit(name, result, lambda: list(works))

    def send(self, tensors: Any, dst: int, tag: int = 0) -> Work:
        raise _unsupported("send")

    def recv(self, tensors: Any, src: int, tag: int = 0) -> Work:
        raise _unsupported("recv")

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Work:
        raise _unsupported("recv_anysource")

    def gather(self, *args: Any, **kwargs: Any) -> Work:
        raise _unsupported("gather")

    def scatter(self, *args: Any, **kwargs: Any) -> Work:
        raise _unsupported("scatter")

    def reduce(self, *args: Any, **kwargs: Any) -> Work:
        raise _unsupported("reduce")

    def alltoall(self, *args: Any, **kwargs: Any) -> Work:
        raise _unsupported("alltoall")

    def all_to_all_single(self, *args: Any, **kwargs: Any) -> Work:
        raise _unsupported("all_to_all_single")

    alltoall_base = all_to_all_single

    def monitored_barrier(self, *args: Any, **kwargs: Any) -> Work:
        raise _unsupported("monitored_barrier")


SUPPORTED = (
    "allreduce (sum, avg, max, min, product), broadcast, allgather, all_gather_into_tensor, "
    "reduce_scatter, reduce_scatter_tensor, barrier and the object collectives"
)


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"hpcring backend: {what} is not supported; it runs {SUPPORTED}")


def _op(opts: Any, collective: str) -> str:
    """hpcring's op for torch's ``opts.reduceOp``; NotImplementedError naming any other."""
    reduce_op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    kind = getattr(reduce_op, "op", reduce_op)
    for torch_op, name in OPS.items():
        if kind == torch_op:
            return name
    raise _unsupported(f"{collective} with op {str(kind).rpartition('.')[2]}")


class _Staged:
    """A tensor as hpcring takes it: itself where it can (contiguous, a dtype hpcring moves), else
    a contiguous copy (``words``: as 8-byte words, for the collectives that only move bytes),
    copied back by `copy_back` once the data is there."""

    def __init__(self, t: torch.Tensor, collective: str, words: bool = False, fresh: bool = False) -> None:
        self.t = t
        self.nbytes = t.numel() * t.element_size()
        self.words = words and t.dtype not in MOVABLE
        if self.words:
            padded = torch.zeros(-(-self.nbytes // 8), dtype=WORD, device=t.device)
            if not fresh:
                padded.view(torch.uint8)[: self.nbytes].copy_(t.contiguous().reshape(-1).view(torch.uint8))
            self.x = padded
        elif t.is_contiguous():
            self.x = t
        else:
            self.x = torch.empty_like(t, memory_format=torch.contiguous_format)
            if not fresh:
                self.x.copy_(t)

    @property
    def copied(self) -> bool:
        return self.x is not self.t

    def unwords(self, row: torch.Tensor) -> torch.Tensor:
        """A result row (of ``x``'s kind) as a tensor of ``t``'s dtype and shape."""
        if not self.words:
            return row.reshape(self.t.shape)
        raw = row.reshape(-1).view(torch.uint8)[: self.nbytes]
        return raw.view(self.t.dtype).reshape(self.t.shape)

    def back(self) -> None:
        if self.copied:
            _copy_into(self.t, self.unwords(self.x))


def _copy_back(staged: Sequence[_Staged]) -> Callable[[], None] | None:
    copied = [s for s in staged if s.copied]
    if not copied:
        return None

    def then() -> None:
        for s in copied:
            s.back()

    return then


def _copy_into(out: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        out.copy_(value)


# -- the creator torch calls -----------------------------------------------------------------------


def _seconds(timeout: Any) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 0)


def create(backend_options: Any, pg_options: Any) -> ProcessGroupHpcring:
    """torch's creator (``extended_api``): the default group over the options' communicator
    (COMM_WORLD) in torch's rank order, or a subgroup of the default group's ranks (collective
    over that subgroup's processes only, as torch calls it: MPI_Comm_create_group)."""
    options = pg_options if isinstance(pg_options, Options) else None
    if pg_options is not None and options is None:
        raise TypeError(
            f"hpcring backend: pg_options must be hpcring.torch.Options, got {type(pg_options).__name__}"
        )
    ranks = list(backend_options.global_ranks_in_group)
    rank, size = int(backend_options.group_rank), int(backend_options.group_size)
    timeout = _seconds(backend_options.timeout)
    store = backend_options.store
    if not ranks:  # the default group: every process of the options' communicator
        options = options or Options()
        base = intracomm(options.comm, "hpcring backend")
        if base.Get_size() != size:
            raise RuntimeError(
                f"hpcring backend: torch's world has {size} processes, the MPI communicator "
                f"{base.Get_size()}; start every process with one mpiexec or srun"
            )
        comm = base.Split(0, rank)  # torch's rank order, a communicator of the group's own
        _default[:] = [options, comm]
    else:  # a subgroup: those ranks of the default group's communicator
        if not _default:
            raise RuntimeError("hpcring backend: a subgroup needs the default group to be hpcring's")
        parent, world = _default
        options = options or parent
        comm = world.Create_group(world.Get_group().Incl(ranks))
    return ProcessGroupHpcring(store, rank, size, comm, options, timeout)


def register() -> None:
    """Make ``"hpcring"`` a torch.distributed backend for cpu and cuda (idempotent)."""
    if NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu", "cuda"])


__all__ = ["NAME", "OPS", "Options", "ProcessGroupHpcring", "create", "register"]
