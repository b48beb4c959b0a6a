"""The ``"hpcring"`` backend of ``torch.distributed``: a process group whose collectives are hpcring's.

`register()` (run by ``import hpcring.torch``) makes ``"hpcring"`` a backend name for the cpu
and cuda devices, so ``torch.distributed.init_process_group("hpcring")`` builds a
`ProcessGroupHpcring`, and DDP, FSDP2 (``fully_shard``) and the object collectives run on it
with no hook. Each asynchronous collective is one of hpcring's non-blocking ones
(`hpcring.nonblocking`) on the group's communicator, so it runs on hpcring's progress thread, in
the order issued, and ``async_op=True`` returns at once while the data moves; the torch Work
completes when the data is there (`hpcring.torch.work`). One torch waits for at once
(``opts.asyncOp`` False) runs in the caller as hpcring's blocking call instead (`_submit`), on
NumPy views of its CPU tensors where NumPy has their dtype (all but bfloat16), so it is
hpcring's compiled warm call; a single contiguous tensor (``dist.all_reduce``,
``dist.broadcast``, ``all_to_all_single``) goes straight there (`_run_now`).
hpcring's guarantees come along:
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
- ``barrier``: a one-element all-reduce (as NCCL's barrier is), so it is bounded and named too;
  ``monitored_barrier`` the same with its own timeout, whose StallError names every rank that
  did not arrive (call it on the group: ``dist.monitored_barrier`` itself accepts gloo only);
- ``alltoall_base`` (``all_to_all_single``), equal or uneven splits: `ialltoall` on the tensors
  themselves; the list ``alltoall`` (any sizes), ``gather`` and ``scatter``: `ialltoall` of the
  blocks packed in rank order, uneven (a gather is every rank sending its block to the root
  alone, a scatter the root sending block i to rank i), so each moves exactly its bytes and the
  receive counts are checked against the senders' on every rank before data moves;
- ``reduce``: an out-of-place `iallreduce`, copied into the root's tensor (the others' are
  left as they were);
- ``send``, ``recv``, ``recv_anysource`` (tags, non-blocking): `hpcring.torch.p2p`, on a
  communicator of the group's own for point to point.

BAND/BOR/BXOR/PREMUL_SUM raise NotImplementedError naming them, on the rank that calls: no other
backend stands in. Tensors of a dtype hpcring cannot reduce (uint8, bool: the object
collectives' bytes) move through the all-gather, the broadcast and the all-to-alls as 8-byte
words, exactly; a reduction of one raises hpcring's TypeError on every rank. CPU tensors are
tested; CUDA tensors go through hpcring's CuPy path (point to point: through host memory) and
are untested (no GPU where this was written).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from .. import algorithms, collectives, config, nonblocking
from ..comm import intracomm
from .p2p import P2P, Transfer
from .work import Completer, Finished, Work, done

NAME = "hpcring"
DEFAULT_ALGORITHM = "ring"
# Where the default is another (the all-to-all has no ring): hpcring.alltoall's own default
DEFAULTS = {algorithms.ALLTOALL: "auto"}
# torch's reductions -> hpcring's ops; the others are refused by name.
OPS: dict[Any, str] = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "mean",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.PRODUCT: "prod",
}
_RED_OP_TYPE = type(dist.ReduceOp.SUM)
_OP_VALUES = {kind.value: name for kind, name in OPS.items()}  # by value: torch's enums hash slowly
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

    ``algorithm``: one name for every collective that has an algorithm of that name (the
    others keep their default), or a dict ``{collective: name}`` with keys among allreduce,
    reduce_scatter, allgather, broadcast, alltoall; None: HPCRING_ALGO, else ``ring`` (the
    all-to-all: ``auto``). ``comm``: the MPI communicator whose ranks are the
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
        every = given.get("*", DEFAULT_ALGORITHM)
        chosen = {
            c: every if every in algorithms.table(c) else DEFAULTS.get(c, DEFAULT_ALGORITHM)
            for c in algorithms.COLLECTIVES
        }
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


class _Mode(threading.local):
    inline = False  # this thread's submission runs in the caller (`ProcessGroupHpcring._submit`)


_MODE = _Mode()


def _started(nonblocking_call: Callable[..., Any], blocking_call: Callable[..., Any]) -> Callable[..., Any]:
    """hpcring's non-blocking call, or, where the submission runs in the caller, its blocking one
    (on NumPy views of CPU tensors, `_inline`)."""

    def start(x: Any, **kwargs: Any) -> Any:
        if _MODE.inline:
            return Finished(_inline, blocking_call, x, kwargs)
        return nonblocking_call(x, **kwargs)

    return start


# CPU tensors of these dtypes have a NumPy view (NumPy has no bfloat16)
VIEWABLE = MOVABLE - {torch.bfloat16}


def _host_view(t: Any) -> Any:
    """``t`` as a NumPy array over its own memory where NumPy has its dtype (a CPU tensor), else
    None. Whether a tensor takes part in autograd does not matter (c10d's collectives write
    tensors in place outside autograd), so ranks choose alike by dtype and device, which the call
    agrees on: a view on some ranks and a tensor on others would be a mismatch of array kinds."""
    if type(t) is torch.Tensor and t.is_cpu and t.dtype in VIEWABLE:
        try:  # detach only where autograd would refuse the view (a copy of the tensor's header)
            return (t.detach() if t.requires_grad else t).numpy()
        except (RuntimeError, TypeError):  # a conjugate or negative view: torch's own path
            return None
    return None


def _inline(call: Callable[..., Any], x: Any, kwargs: dict[str, Any]) -> Any:
    """hpcring's blocking ``call`` on ``x`` (and ``out=``) as NumPy views of the tensors' memory
    where both have one, so the call is hpcring's compiled warm one (the NumPy calls run in C:
    a small all-reduce costs a quarter of the same call on the tensor); the result as tensors.
    Every rank views the same way: the tensors of one call have the same dtype on every rank."""
    view = _host_view(x)
    out = kwargs.get("out")
    if view is None or (out is not None and (out_view := _host_view(out)) is None):
        return call(x, **kwargs)
    if out is not None:
        kwargs["out"] = out_view
    result = call(view, **kwargs)
    if result is view:
        return x
    if out is not None and result is out_view:
        return out
    return torch.from_numpy(result) if isinstance(result, np.ndarray) else result


iallreduce = _started(nonblocking.iallreduce, collectives.allreduce)
ibroadcast = _started(nonblocking.ibroadcast, collectives.broadcast)
iallgather = _started(nonblocking.iallgather, collectives.allgather)
ireduce_scatter = _started(nonblocking.ireduce_scatter, collectives.reduce_scatter)
ialltoall = _started(nonblocking.ialltoall, collectives.alltoall)


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
        self._p2p = P2P(comm, timeout)  # collective: torch builds a group on every one of its ranks

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
        self._p2p.close()
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
        opts: Any = None,
    ) -> Work:
        """Start hpcring's requests (``start()``) and hand them to the completer, as one Work.

        Where torch says the caller waits at once (``opts.asyncOp`` False: ``dist.all_reduce``
        without ``async_op=True``), the collectives run here, in the caller's thread, as
        hpcring's blocking calls (on the communicator's first duplicate: the progress thread's
        calls, on the second, never meet them), and the Work comes back done: no thread switch
        on the way there and back."""
        with self._lock:
            _MODE.inline = opts is not None and getattr(opts, "asyncOp", True) is False
            try:
                return self._completer.add(Work(result, name), start(), then)
            finally:
                _MODE.inline = False

    def _common(self) -> dict[str, Any]:
        return {"comm": self.comm, "check": self.options.check, "timeout": self.timeout}

    def _now(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        """The NumPy view of a single tensor that a collective torch waits for at once can run on,
        in place, as it is (contiguous: no staging, nothing to copy back), else None: the short
        way of `_submit` for the calls a training loop makes most (`_run_now`)."""
        if len(tensors) != 1 or opts is None or getattr(opts, "asyncOp", True) is not False:
            return None
        t = tensors[0]
        if not t.is_contiguous():
            return None
        return _host_view(t)

    def _run_now(
        self, name: str, tensors: list[torch.Tensor], call: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Work:
        """hpcring's blocking ``call`` here, in the caller's thread (as `_submit` runs it for a
        collective torch waits for at once), and its Work done: its error, if any, raised by
        ``wait()`` on every rank alike, as the Work of `_submit` raises it."""
        error: BaseException | None = None
        with self._lock:
            try:
                call(*args, comm=self.comm, check=self.options.check, timeout=self.timeout, **kwargs)
            except BaseException as failed:
                error = failed
        return done(tensors, name, error)

    # -- all-reduce -------------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        op = _op(opts, "allreduce")
        view = self._now(tensors, opts)
        if view is not None:
            algorithm = self.algorithm[algorithms.ALLREDUCE]
            return self._run_now(
                "allreduce", tensors, collectives.allreduce, view, op=op, algorithm=algorithm
            )
        staged = [_Staged(t, "allreduce") for t in tensors]
        algorithm = self.algorithm[algorithms.ALLREDUCE]
        return self._submit(
            "allreduce",
            tensors,
            lambda: [iallreduce(s.x, op=op, algorithm=algorithm, **self._common()) for s in staged],
            _copy_back(staged),
            opts,
        )

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return self.allreduce(tensors, opts)

    # -- broadcast -------------------------------------------------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        root = int(getattr(opts, "rootRank", 0))
        view = self._now(tensors, opts)
        if view is not None:
            algorithm = self.algorithm[algorithms.BROADCAST]
            return self._run_now(
                "broadcast", tensors, collectives.broadcast, view, root=root, algorithm=algorithm
            )
        staged = [_Staged(t, "broadcast", words=True) for t in tensors]
        algorithm = self.algorithm[algorithms.BROADCAST]
        return self._submit(
            "broadcast",
            tensors,
            lambda: [ibroadcast(s.x, root=root, algorithm=algorithm, **self._common()) for s in staged],
            _copy_back(staged),
            opts,
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

        return self._submit(
            "allgather", [t for outputs in output_tensors for t in outputs], start, then, opts
        )

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
            rows, input = output.detach().view(g, *input.shape), input.detach()
            return self._submit(
                "all_gather_single",
                [output],
                lambda: [iallgather(input, out=rows, algorithm=algorithm, **self._common())],
                opts=opts,
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
            opts,
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
            opts=opts,
        )

    # -- point to point: hpcring.torch.p2p --------------------------------------------------------

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> Transfer:
        """Start sending the tensor to group rank ``dstRank``; returns at once."""
        return self._p2p.send(_one(tensors, "send"), dstRank, tag)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> Transfer:
        """Start receiving into the tensor from group rank ``srcRank``; returns at once."""
        return self._p2p.recv(_one(tensors, "recv"), srcRank, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Transfer:
        """Start receiving from whichever rank sends with ``tag`` first (``_source_rank()`` says which)."""
        return self._p2p.recv(_one(tensors, "recv_anysource"), None, tag)

    # -- rooted collectives ------------------------------------------------------------------------

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        """The reduction into the root's tensor: an out-of-place all-reduce on every rank (the
        ranks agree on its placement), copied into the root's tensor."""
        root = int(getattr(opts, "rootRank", 0))
        op = _op(opts, "reduce")
        staged = [_Staged(t, "reduce") for t in tensors]
        outs = [torch.empty_like(s.x) for s in staged]
        algorithm = self.algorithm[algorithms.ALLREDUCE]

        def then() -> None:
            if self.rank() == root:
                for s, out in zip(staged, outs, strict=True):
                    _copy_into(s.t, s.unwords(out))

        return self._submit(
            "reduce",
            tensors,
            lambda: [
                iallreduce(s.x, out=out, op=op, algorithm=algorithm, **self._common())
                for s, out in zip(staged, outs, strict=True)
            ],
            then,
            opts,
        )

    def gather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Work:
        """Every rank's tensor into the root's list: each rank sends its block to the root alone."""
        root, g = int(getattr(opts, "rootRank", 0)), self.size()
        source = _one(input_tensors, "gather")
        outputs = output_tensors[0] if output_tensors else []
        sends: list[torch.Tensor | None] = [source if i == root else None for i in range(g)]
        recvs: list[torch.Tensor | None] = [None] * g
        if self.rank() == root:
            _count(outputs, g, "gather", "output")
            recvs = list(outputs)
        return self._blocks("gather", sends, recvs, [*outputs], opts=opts)

    def scatter(
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None
    ) -> Work:
        """The root's list, one tensor to each rank: the root sends block i to rank i alone."""
        root, g = int(getattr(opts, "rootRank", 0)), self.size()
        target = _one(output_tensors, "scatter")
        inputs = input_tensors[0] if input_tensors else []
        sends: list[torch.Tensor | None] = [None] * g
        if self.rank() == root:
            _count(inputs, g, "scatter", "input")
            sends = list(inputs)
        recvs: list[torch.Tensor | None] = [target if i == root else None for i in range(g)]
        return self._blocks("scatter", sends, recvs, [target], opts=opts)

    # -- all-to-all ----------------------------------------------------------------------------------

    def alltoall(
        self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Work:
        """Input i to rank i, rank i's into output i: any sizes (uneven blocks, packed)."""
        g = self.size()
        _count(input_tensors, g, "alltoall", "input")
        _count(output_tensors, g, "alltoall", "output")
        outputs = list(output_tensors)
        return self._blocks("alltoall", list(input_tensors), outputs, outputs, opts=opts)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Work:
        """``all_to_all_single``: rows of the input to each rank, equal or by the splits (dim 0),
        straight between the tensors where they are contiguous and of a dtype hpcring moves."""
        if output.dtype != input.dtype:
            raise ValueError(
                f"hpcring backend: all_to_all_single needs the output of the input's dtype {input.dtype}, "
                f"got {output.dtype}"
            )
        sends = list(input_split_sizes) or None
        recvs = list(output_split_sizes) or None
        direct = (
            input.dtype in MOVABLE
            and input.is_contiguous()
            and output.is_contiguous()
            and input.device == output.device
            and input.dim() > 0
            and output.dim() > 0
            and (input.dim() == 1 == output.dim() or input.shape[1:] == output.shape[1:])
            and not _overlap(input, output)
        )
        if not direct:
            g = self.size()
            if input.dim() == 0 or output.dim() == 0:
                raise ValueError("hpcring backend: all_to_all_single needs tensors with a first dimension")
            ins = _rows(input, sends or [input.shape[0] // g] * g)
            outs = _rows(output, recvs or [output.shape[0] // g] * g)
            equal = sends is None and recvs is None
            return self._blocks("all_to_all_single", ins, outs, [output], equal=equal, opts=opts)
        algorithm = self.algorithm[algorithms.ALLTOALL]
        if getattr(opts, "asyncOp", True) is False:
            views = _host_view(input), _host_view(output)
            if views[0] is not None and views[1] is not None:
                return self._run_now(
                    "all_to_all_single",
                    [output],
                    collectives.alltoall,
                    views[0],
                    out=views[1],
                    send_splits=sends,
                    recv_splits=recvs,
                    algorithm=algorithm,
                )
        return self._submit(
            "all_to_all_single",
            [output],
            lambda: [
                ialltoall(
                    input.detach(),  # the same memory, outside autograd (nn.functional's inputs)
                    send_splits=sends,
                    recv_splits=recvs,
                    out=output.detach(),
                    algorithm=algorithm,
                    **self._common(),
                )
            ],
            opts=opts,
        )

    alltoall_base = all_to_all_single

    def _blocks(
        self,
        name: str,
        sends: list[torch.Tensor | None],
        recvs: list[torch.Tensor | None],
        result: list[torch.Tensor],
        equal: bool = False,
        opts: Any = None,
    ) -> Work:
        """One uneven all-to-all of these blocks (None: nothing to or from that rank), packed in rank
        order into one buffer each way and unpacked into ``recvs`` when the data is there. A dtype
        hpcring does not move travels as 8-byte words, each block padded to whole words."""
        dtypes = {t.dtype for t in (*sends, *recvs) if t is not None}
        if len(dtypes) > 1:
            raise ValueError(
                f"hpcring backend: {name} needs tensors of one dtype, got {sorted(map(str, dtypes))}"
            )
        dtype = dtypes.pop() if dtypes else torch.float32
        words = dtype not in MOVABLE
        device = next((t.device for t in (*sends, *recvs) if t is not None), torch.device("cpu"))

        def size(t: torch.Tensor | None) -> int:
            if t is None:
                return 0
            return -(-t.numel() * t.element_size() // 8) if words else t.numel()

        kind = WORD if words else dtype
        send_counts = [size(t) for t in sends]
        recv_counts = [size(t) for t in recvs]
        packed = torch.zeros(sum(send_counts), dtype=kind, device=device)
        at = 0
        for t, n in zip(sends, send_counts, strict=True):
            if t is not None and n:
                piece = packed[at : at + n]
                if words:
                    piece.view(torch.uint8)[: t.numel() * t.element_size()].copy_(
                        t.detach().contiguous().reshape(-1).view(torch.uint8)
                    )
                else:
                    piece.copy_(t.detach().reshape(-1))
            at += n
        unpacked = torch.empty(sum(recv_counts), dtype=kind, device=device)
        algorithm = self.algorithm[algorithms.ALLTOALL]
        splits: dict[str, Any] = {} if equal else {"send_splits": send_counts, "recv_splits": recv_counts}

        def then() -> None:
            at = 0
            for t, n in zip(recvs, recv_counts, strict=True):
                if t is not None and n:
                    piece = unpacked[at : at + n]
                    if words:
                        value = piece.view(torch.uint8)[: t.numel() * t.element_size()].view(t.dtype)
                    else:
                        value = piece
                    _copy_into(t, value.reshape(t.shape))
                at += n

        return self._submit(
            name,
            result,
            lambda: [ialltoall(packed, out=unpacked, algorithm=algorithm, **splits, **self._common())],
            then,
            opts,
        )

    # -- barriers ------------------------------------------------------------------------------------

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """A barrier bounded by ``timeout`` (default the group's): blocking, and a rank that does not
        arrive is a StallError naming every such rank (``wait_all_ranks`` is what it always does)."""
        seconds = _seconds(timeout) if timeout is not None else self.timeout
        one = torch.ones(1, dtype=torch.int32)
        common = {**self._common(), "timeout": seconds}
        iallreduce(one, op="sum", algorithm=self.algorithm[algorithms.ALLREDUCE], **common).wait()

    # -- helpers ---------------------------------------------------------------------------------------

    def _after(self, works: Sequence[Work], result: list[torch.Tensor], name: str) -> Work:
        """One Work done when every one of ``works`` is."""
        if not works:
            return done(result, name)
        return self._submit(name, result, lambda: list(works))


SUPPORTED = "allreduce and reduce with sum, avg, max, min, product"


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"hpcring backend: {what} is not supported; it runs {SUPPORTED}")


def _one(tensors: list[torch.Tensor], what: str) -> torch.Tensor:
    """The one tensor of a list torch passes (a backend takes one per call)."""
    if len(tensors) != 1:
        raise ValueError(f"hpcring backend: {what} takes one tensor, got {len(tensors)}")
    return tensors[0]


def _count(tensors: Sequence[torch.Tensor], g: int, what: str, side: str) -> None:
    if len(tensors) != g:
        raise ValueError(
            f"hpcring backend: {what} needs {g} {side} tensors, one per rank, got {len(tensors)}"
        )


def _rows(t: torch.Tensor, counts: list[int]) -> list[torch.Tensor | None]:
    """``t`` cut along its first dimension into blocks of ``counts`` rows."""
    if sum(counts) != t.shape[0]:
        raise ValueError(
            f"hpcring backend: all_to_all_single splits {counts} sum to {sum(counts)}, "
            f"but the tensor has {t.shape[0]} rows"
        )
    return list(torch.split(t, counts, dim=0))


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors on one device share bytes."""
    x, y = a.data_ptr(), b.data_ptr()
    return x < y + b.numel() * b.element_size() and y < x + a.numel() * a.element_size()


def _op(opts: Any, collective: str) -> str:
    """hpcring's op for torch's ``opts.reduceOp``; NotImplementedError naming any other."""
    reduce_op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    kind = getattr(reduce_op, "op", reduce_op)
    name = _OP_VALUES.get(kind.value) if type(kind) is _RED_OP_TYPE else None
    if name is not None:
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
        self.copied = True  # x is not t's own memory: copied back once the data is there
        if self.words:
            padded = torch.zeros(-(-self.nbytes // 8), dtype=WORD, device=t.device)
            if not fresh:
                padded.view(torch.uint8)[: self.nbytes].copy_(t.contiguous().reshape(-1).view(torch.uint8))
            self.x = padded
        elif t.is_contiguous():
            self.x = t.detach()  # the same memory, outside autograd (an autograd Function's inputs)
            self.copied = False
        else:
            self.x = torch.empty_like(t, memory_format=torch.contiguous_format)
            if not fresh:
                self.x.copy_(t)

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
