"""Measuring: the device, one (size, algorithm) row, the facts of the run, the yardsticks.

Time is taken per iteration on every rank; the max over ranks of each iteration is what a
synchronous training step would wait for, and a row reports the median of those maxima.
Bytes sent are *measured* by the Channel (what hpcring hands to MPI) and set beside the
textbook formula, so a disagreement is visible. This module is the one place in the bench
that picks NumPy or CuPy (`Device`), and the one that asks the cost model for its column.
What differs from one collective to another (its data, buffers, front end and bare call) is
its description in `hpcring.bench.collectives`; nothing here asks which collective it is.

Beside the algorithms, every size has a bare row: the collective's library call on the same
buffers straight through mpi4py (``comm.Allreduce`` for the all-reduce, `BARE`), as a user of
mpi4py writes it, nothing of hpcring between. It is the yardstick of the footer; hpcring's
`mpi` row is the same library call through hpcring's front end, so the two differ by what
hpcring's dispatch costs.
"""

from __future__ import annotations

import argparse
import functools
import json
import socket
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import __version__, algorithms, exact, exchange, info, topology
from ..algorithms import auto, ring_staged, tuning
from ..algorithms.mpi import user_op
from ..arrays import adapter_for
from ..comm import channel_for
from ..gpu import copyto_bandwidth, gpu_identity, gpu_problem_anywhere, pinned_d2h_bandwidth, select_device
from ..model.costs import ModelError, Params, predict
from ..model.params import default_path, load_params
from ..ops import OPS
from ..polling import idle_barrier
from ..units import busbw_factor
from ..wire import bytes_sent as wire_bytes_sent
from ..wire import wire_dtype
from .collectives import COLLECTIVES, Buffers, Collective, kind_of
from .data import expected_bytes_sent

# ---------------------------------------------------------------------------------------
# Device: the one place in the bench that picks NumPy or CuPy.


@dataclass
class Device:
    """Where the arrays live: the array module and how to wait for its queued work."""

    name: str  # cpu or gpu
    xp: Any
    cuda_aware: bool = False  # on a GPU: whether MPI takes device pointers (hpcring.info())

    def sync(self) -> None:
        """Wait for queued device work, so a timer sees the whole call."""
        if self.name == "gpu":
            self.xp.cuda.get_current_stream().synchronize()


def device_for(choice: str, comm: MPI.Intracomm) -> Device | str:
    """The device to run on, or the reason it cannot be had (decided together by all ranks)."""
    # Ranks may differ (a node without a GPU): agree, so no rank starts timing (or calls
    # select_device's collective) alone; auto runs on GPUs only where every rank has one.
    problem = "" if choice == "cpu" else gpu_problem_anywhere(comm)
    if choice == "gpu" and problem:
        return f"--device gpu: {problem}"
    if choice == "cpu" or problem:
        return Device("cpu", np)
    import cupy

    select_device(comm)  # node-local rank mod GPUs: one GPU per rank with no per-site wrapper
    return Device("gpu", cupy, cuda_aware=bool(info()["cuda_aware"]))


# ---------------------------------------------------------------------------------------
# The bare library call: what the footer compares every algorithm with.

# The bare row's name: MPI's own function name, in MPI's spelling, so that nobody reads it as
# hpcring's `mpi` (the same call through hpcring.allreduce, validation and agreement included),
# and never a name `-a` or `allreduce(algorithm=...)` accepts: it is not hpcring's to dispatch.
# The all-reduce's; each collective names its own (`Collective.bare`).
BARE = COLLECTIVES[algorithms.ALLREDUCE].bare


@functools.cache
def has_datatype(dtype: np.dtype) -> bool:
    """Whether mpi4py maps ``dtype`` to an MPI datatype of this library (bfloat16 never;
    float16 where the library has MPI_SHORT_FLOAT or the like). Local: the same everywhere
    that runs the same library."""
    from mpi4py.util import dtlib

    try:
        datatype = dtlib.from_numpy_dtype(dtype)
    except (ValueError, KeyError, TypeError):
        return False
    if datatype == MPI.DATATYPE_NULL:
        return False
    datatype.Free()  # from_numpy_dtype hands back a duplicate
    return True


def bare_description(dev: Device, dtype: np.dtype) -> str:
    """How the bare row hands its buffers to MPI, for the header."""
    if dev.name != "gpu":
        how = "host buffers"
    elif dev.cuda_aware and has_datatype(dtype):
        how = "device buffers straight to MPI, CUDA-aware"
    else:
        how = "device buffers copied to host arrays and back: MPI not CUDA-aware"
    if not has_datatype(dtype):
        how += f"; no MPI datatype for {dtype.name}: MPI_UINT16_T words, a user-defined op"
    return how


def bare_call(
    comm: MPI.Intracomm,
    dev: Device,
    kind: Collective,
    b: Buffers,
    in_place: bool,
    op_name: str | None,
    root: int = 0,
) -> tuple[Callable[[], None], Any]:
    """``kind``'s library call on ``b`` (``comm.Allreduce``, ``comm.Reduce_scatter_block``...),
    written as a user of mpi4py writes it: the buffers to MPI, nothing of hpcring between; returns
    the call and the view that holds this rank's result. Where MPI has no datatype (bfloat16),
    the words go as unsigned integers (with a user-defined op where there is one to apply), as
    an MPI program does for a type of its own; mean is a sum divided by the rank count
    afterwards; on a GPU whose MPI is not CUDA-aware, host arrays made once carry the data there
    and back (in place, the input is in the buffer MPI writes)."""
    bare = kind.bare_call(comm, b, in_place, root)
    size, xp, dtype = comm.Get_size(), dev.xp, bare.recv.dtype
    op = None if op_name is None else OPS[op_name]
    words = None if has_datatype(dtype) else np.dtype(f"u{dtype.itemsize}")
    mpi_op = None if op is None else op.mpi_op() if words is None else user_op(op, dtype)
    own_send = bare.send is not None and bare.send is not MPI.IN_PLACE  # an input buffer of its own
    staged = dev.name == "gpu" and not (dev.cuda_aware and words is None)

    def typed(array: Any) -> Any:
        return array if words is None or array is None or array is MPI.IN_PLACE else array.view(words)

    host_recv = np.empty(bare.recv.shape, dtype=dtype) if staged else None
    host_send = np.empty(bare.send.shape, dtype=dtype) if staged and own_send else bare.send
    src, dst = (typed(host_send), typed(host_recv)) if staged else (typed(bare.send), typed(bare.recv))
    divide = op is not None and op.name == "mean" and size > 1
    device, result = dev.name == "gpu", bare.result

    def call() -> None:
        if staged:
            if own_send:
                bare.send.get(out=host_send)
            else:
                bare.recv.get(out=host_recv)
        elif device:
            dev.sync()  # mpi4py's rule: the stream's work done before MPI reads device memory
        bare.call(src, dst, mpi_op)
        if staged:
            bare.recv.set(host_recv)
        if divide:
            xp.true_divide(result, size, out=result)

    return call, result


# ---------------------------------------------------------------------------------------
# Measurement.


@dataclass
class Row:
    """One (size, algorithm) measurement; every figure the table or JSON shows."""

    size: int
    count: int
    dtype: str
    op: str
    algorithm: str
    iters: int
    time_us: float  # median over iterations of the max over ranks
    time_us_min: float
    time_us_max: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    bytes_sent: int | None  # max over ranks, per call; None for mpi
    bytes_expected: int | None
    bytes_sent_per_rank: list[int] | None
    bytes_expected_per_rank: list[int] | None
    wrong: int | None  # None when not checked
    bytes_match: bool = field(default=True)
    chosen: str | None = None  # what `auto` ran
    predicted_us: float | None = None  # the calibrated cost model's time (hpcring.model)
    # Over the same per-iteration maxima as time_us (OSU's -f and -z): the median again, under
    # the name the other statistics share, and the 99th percentile (NumPy's, interpolated).
    time_us_median: float | None = None
    time_us_p99: float | None = None

    def __post_init__(self) -> None:
        if self.time_us_median is None:
            self.time_us_median = self.time_us

    @property
    def label(self) -> str:
        return f"{self.algorithm}:{self.chosen}" if self.chosen else self.algorithm  # auto+bf16:ring


REPRODUCIBLE = "+rep"  # the suffix of a reproducible row's algorithm (fits the table's column)
WIRE_TAGS = {"bfloat16": "+bf16", "float16": "+f16"}  # suffix of a wire= row: "ring+bf16"


def wire_of(label: str) -> str | None:
    """The wire dtype a row's label names ("ring+bf16" -> "bfloat16"), or None."""
    return next((wire for wire, tag in WIRE_TAGS.items() if label.endswith(tag)), None)


def exact_bytes_sent(dtype: np.dtype, host: bool = True, nodes: int = 1) -> Any:
    """The formula of a reproducible row (`hpcring.exact.bytes_sent`), shaped as expected_bytes_sent;
    on the host, an algorithm that comes in two phases runs the sum inside them (`exact.fused`),
    gathering the contributions unreduced where `exact.gathers` says so for ``nodes``."""

    def formula(
        algorithm: str, nbytes: int, size: int, rank: int, itemsize: int = 1, per_node: int = 1
    ) -> Any:
        def sent(count: int, wordsize: int) -> int | None:
            return algorithms.bytes_sent(algorithm, count, wordsize, size, rank, per_node)

        count = nbytes // itemsize
        split = algorithms.spec(algorithms.ALLREDUCE, algorithm).split_sent if host else None
        phases = split(count, size, rank) if split else None
        return exact.bytes_sent(sent, count, dtype, phases, gathered=exact.gathers(size, nodes))

    return formula


def buffers(args: argparse.Namespace, comm: MPI.Intracomm, dev: Device, nbytes: int) -> tuple[Buffers, Any]:
    """The arrays of an ``nbytes`` cell of ``args.collective``, and a copy of its input."""
    rank, size, dtype = comm.Get_rank(), comm.Get_size(), args.dtype
    kind = kind_of(args.collective, getattr(args, "uneven", False))
    x = kind.inputs(dev.xp, kind.count(nbytes, size, dtype.itemsize), dtype, args.op, rank, args.root)
    b = kind.buffers(dev.xp, x, args.in_place, rank, size)
    return b, b.x.copy()


class Cell:
    """One (size, algorithm) cell of ``args.collective`` being measured: its call on the size's
    arrays (``data``: `buffers`), timed one call at a time (`once`), so that cells can take turns
    (`measure_rows`); ``algorithm`` the collective's bare name (`Collective.bare`) times the bare
    library call the same way.
    ``nbytes`` is nccl-tests' size: the whole buffer (`Collective.count` says each rank's input
    of it)."""

    def __init__(
        self,
        args: argparse.Namespace,
        comm: MPI.Intracomm,
        dev: Device,
        nbytes: int,
        algorithm: str,
        data: tuple[Buffers, Any],
    ) -> None:
        size, dtype = comm.Get_size(), args.dtype
        kind = kind_of(args.collective, getattr(args, "uneven", False))
        count = kind.count(nbytes, size, dtype.itemsize)
        b, original = data
        reproducible = algorithm.endswith(REPRODUCIBLE)  # allreduce(reproducible=True): "ring+rep"
        wire = wire_of(algorithm)  # allreduce(wire=...): "ring+bf16"
        label, algorithm = algorithm, algorithm.removesuffix(REPRODUCIBLE)
        if wire is not None:
            algorithm = algorithm.removesuffix(WIRE_TAGS[wire])
        # In place, where the call rewrites x, each call starts from the input rewritten (untimed), as
        # a training step's fresh gradients; out of place, x stays as it is.
        rewritten = args.in_place and kind.rewrites_input
        agree = not args.no_agree
        bare = algorithm == kind.bare
        channel = None if bare else channel_for(comm, adapter_for(b.x))
        # A chooser's row (auto) says what it chose for this size; a reproducible one chooses for the
        # sizes that travel there (named auto+rep, no choice)
        chooser = not bare and algorithms.spec(args.collective, algorithm).choose is not None
        chosen = (
            auto.chosen(
                channel,
                b.x.nbytes,
                args.in_place and kind.in_place_tables,
                args.collective,
                algorithms.choices(args.collective),
            )
            if chooser and not reproducible and not kind.uneven
            else None
        )  # collective
        if chooser and args.collective == "alltoall" and not kind.uneven:
            chosen = exchange.auto_runs(comm, b.x) or chosen  # blocks sent ahead: pairwise's pattern
        if chooser and kind.uneven:  # uneven blocks: one choice for every size (hpcring.algorithms.auto)
            chosen = auto.choose_alltoall(channel, -1, False, algorithms.uneven(args.collective))

        if bare:
            call, result = bare_call(comm, dev, kind, b, args.in_place, args.op, args.root)
        else:
            options = {"reproducible": reproducible, "wire": wire} if reproducible or wire else {}
            call = kind.caller(b, algorithm, comm, args.op, agree, args.root, **options)
            result = b.result

        def refill() -> None:
            if rewritten:
                b.x[...] = original
                dev.sync()

        self.args, self.comm, self.dev, self.nbytes, self.kind = args, comm, dev, nbytes, kind
        self.count, self.label, self.algorithm, self.bare = count, label, algorithm, bare
        self.reproducible, self.wire, self.chooser, self.chosen = reproducible, wire, chooser, chosen
        self.b, self.original, self.channel = b, original, channel
        self.call, self.result, self.refill = call, result, refill
        self.sent = 0  # bytes this rank's channel sent in the timed calls

    def warm(self) -> float:
        """The untimed calls first; their seconds on this rank."""
        start = MPI.Wtime()
        for _ in range(self.args.warmup):
            self.refill()
            self.call()
        self.dev.sync()
        return MPI.Wtime() - start

    def once(self) -> float:
        """One timed call (its input rewritten first, untimed): its seconds on this rank."""
        self.refill()
        channel = self.channel
        before = 0 if channel is None else channel.bytes_sent
        t0 = MPI.Wtime()
        self.call()
        self.dev.sync()
        took = MPI.Wtime() - t0
        if channel is not None:
            self.sent += channel.bytes_sent - before
        return took

    def wrong(self, corrupt_rank: int | None) -> int | None:
        """The wrong elements over every rank of one more call, its output poisoned first (None:
        not checked; collective)."""
        args, comm, dev, kind, result = self.args, self.comm, self.dev, self.kind, self.result
        if not args.check:
            return None
        rank = comm.Get_rank()
        expected = kind.expected(dev.xp, self.count, args.dtype, args.op, comm.Get_size(), rank, args.root)
        result[...] = expected + 1  # stale or untouched output can never pass
        self.b.x[...] = self.original  # in place, the input itself: it differs from the result wherever G > 1
        dev.sync()
        self.call()
        if corrupt_rank == rank and result.size:
            flat = result.reshape(-1)
            flat[flat.size // 2] += 1  # test hook: one wrong element on one rank
        return comm.allreduce(int((result != expected).sum()), op=MPI.SUM)

    def traffic(self, sent: float) -> tuple[list[int] | None, list[int] | None]:
        """Per rank, the bytes sent per call (``sent``: this rank's) and the formula's; (None,
        None) where hpcring does not see them (the bare call; collective otherwise)."""
        args, comm, kind, channel, chosen = self.args, self.comm, self.kind, self.channel, self.chosen
        size, dtype = comm.Get_size(), args.dtype
        ran = chosen or self.algorithm
        # Each rank's formula counts from its input, and, for a rooted collective, from the root.
        root = {"root": args.root} if kind.rooted else {}
        formula_of = functools.partial(expected_bytes_sent, collective=args.collective, **root)
        # The reproducible rows' formula is exact.bytes_sent's; auto's may choose again for the sizes
        # that travel there (codes and words), so that row is not counted against one.
        if self.reproducible:
            hosts = topology.of(channel.comm).nodes if channel is not None else 1
            formula_of = exact_bytes_sent(dtype, host=self.dev.name != "gpu", nodes=hosts)
        if kind.uneven:

            def formula_of(
                ran: str, nbytes: int, size: int, rank: int, itemsize: int, per_node: int = 1
            ) -> Any:
                return kind.bytes_sent(ran, nbytes // itemsize, itemsize, size, rank)

        spec = None if self.bare else algorithms.spec(args.collective, ran)
        if self.wire is not None and (chosen is None or auto.keep_wire(channel, spec)):
            # what travels: the formula in its itemsize (auto: where it narrows)
            narrowed = wire_dtype(self.wire)

            def formula_of(
                ran: str, nbytes: int, size: int, rank: int, itemsize: int, per_node: int = 1
            ) -> Any:
                return wire_bytes_sent(ran, nbytes // itemsize, itemsize, narrowed, size, rank, per_node)

        mine = self.count * dtype.itemsize  # the bytes of each rank's input, what the formulas count from
        hidden = self.bare or (self.reproducible and self.chooser)
        if hidden or formula_of(ran, mine, size, comm.Get_rank(), dtype.itemsize) is None:
            return None, None  # MPI's: not visible
        measured = [int(s) if s == int(s) else s for s in comm.allgather(sent)]
        assert channel is not None  # only the bare row has none, and it is not counted
        nodes = topology.of(channel.comm)
        per_node = nodes.per_node[0] if nodes.two_level else 1
        # Algorithms that run in node order (ranks placed round-robin, say) send what the rank
        # at that position of the order sends.
        place = nodes.order.index if spec is not None and spec.ring_order else int
        return measured, [
            formula_of(ran, mine, size, place(r), dtype.itemsize, per_node) or 0 for r in range(size)
        ]

    def row(self, times: np.ndarray, corrupt_rank: int | None) -> Row:
        """The cell's row from ``times`` (per timed call, the max over ranks), checked (collective)."""
        args, size = self.args, self.comm.Get_size()
        wrong = self.wrong(corrupt_rank)
        measured, formula = self.traffic(self.sent / len(times))
        median = statistics.median(times.tolist())
        algbw = self.nbytes / median / 1e9 if median > 0 else 0.0
        return Row(
            size=self.nbytes,
            count=self.count,
            dtype=args.dtype.name,
            op=args.op if self.kind.reduces else "none",
            algorithm=self.label,
            iters=len(times),
            time_us=median * 1e6,
            time_us_min=float(times.min()) * 1e6,
            time_us_max=float(times.max()) * 1e6,
            algbw=algbw,
            busbw=algbw * busbw_factor(size, args.collective),
            bytes_sent=None if measured is None else max(measured),
            bytes_expected=None if formula is None else max(formula),
            bytes_sent_per_rank=measured,
            bytes_expected_per_rank=formula,
            wrong=wrong,
            bytes_match=measured == formula,
            chosen=self.chosen,
            time_us_median=median * 1e6,
            time_us_p99=float(np.percentile(times, 99)) * 1e6,
        )


def measure_rows(
    args: argparse.Namespace,
    comm: MPI.Intracomm,
    dev: Device,
    nbytes: int,
    names: list[str],
    corrupt_rank: int | None,
    data: tuple[Buffers, Any],
) -> list[Row]:
    """Warm up, time, measure traffic and check the cells of ``names`` at one size, taking turns:
    each round calls every cell once, in an order shuffled from round to round, so that a slow
    spell of the machine falls on every cell alike and their ratios compare calls made side by
    side (`--interleave`; one name: that cell's calls back to back). ``data``: the size's arrays
    (`buffers`), one set for every cell of the size: each row's calls read and write the same
    memory (how the allocator placed separate arrays, in huge pages or not, moved one row by up
    to 2x)."""
    cells = [Cell(args, comm, dev, nbytes, name, data) for name in names]
    iters = args.iters
    warmed = [cell.warm() for cell in cells]
    if args.warmup and args.max_time > 0:  # the same on every rank
        per_round = comm.allreduce(sum(warmed) / args.warmup, op=MPI.MAX)
        if per_round * iters > args.max_time:
            iters = max(min(iters, 3), int(args.max_time / per_round))
    times = np.empty((len(cells), iters))
    # The order of a round: shuffled, the same on every rank (one seed), so that no cell always
    # follows the same one (a call that leaves the ranks apart slows the call after it).
    orders = np.random.default_rng(len(cells)).permuted(np.tile(np.arange(len(cells)), (iters, 1)), axis=1)
    comm.Barrier()
    for i in range(iters):
        for k in orders[i]:
            times[k, i] = cells[k].once()
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)  # per call: what the slowest rank saw
    return [cell.row(times[k], corrupt_rank) for k, cell in enumerate(cells)]


def median_rows(passes: list[list[Row]]) -> list[Row]:
    """Per (size, algorithm), the row of the pass whose median time is the median of the passes
    (the upper one of an even count), in the order the first pass measured them."""
    cells: dict[tuple[int, str], list[Row]] = {}
    for one in passes:
        for row in one:
            cells.setdefault((row.size, row.algorithm), []).append(row)
    return [sorted(rows, key=lambda r: r.time_us)[len(rows) // 2] for rows in cells.values()]


# ---------------------------------------------------------------------------------------
# The facts of the run (the header) and the yardsticks it is read against.


def header_facts(
    args: argparse.Namespace, argv: list[str], comm: MPI.Intracomm, dev: Device
) -> dict[str, Any]:
    """Everything that says what was measured where (collective: gathers host names)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_size = local.Get_size()
    local.Free()
    hosts = comm.allgather(MPI.Get_processor_name() or socket.gethostname())
    per_host = sorted(set(comm.allgather(local_size)))
    nodes = topology.of(channel_for(comm, adapter_for(dev.xp.empty(0))).comm)  # what hierarchical sees
    facts = info()
    kind = kind_of(args.collective, getattr(args, "uneven", False))
    return {
        "collective": kind.name,
        "uneven": kind.uneven,
        "hpcring": __version__,
        "mpi_library": facts["mpi_library"],
        "mpi4py": facts["mpi4py"],
        "ranks": comm.Get_size(),
        "hosts": len(set(hosts)),
        "ranks_per_host": per_host[0] if len(per_host) == 1 else f"{per_host[0]}-{per_host[-1]}",
        "topology": nodes.summary(),
        "device": dev.name,
        "cuda_aware": facts["cuda_aware"],
        "cuda_aware_reason": facts["cuda_aware_reason"],
        "core": facts["core"],
        "core_reason": facts["core_reason"],
        "dtype": args.dtype.name,
        "op": args.op if kind.reduces else "none",
        "root": args.root if kind.rooted else None,
        "algorithms": args.algorithms,
        "baseline": kind.bare,
        "baseline_call": bare_description(dev, args.dtype),
        "iters": args.iters,
        "passes": args.passes,
        "interleaved": bool(getattr(args, "interleave", False)),
        "warmup": args.warmup,
        "max_time_s": args.max_time,
        "check": bool(args.check),
        "agree": not args.no_agree,
        "placement": kind.placement(args.in_place),
        "time": "per iteration max over ranks; median over iterations",
        "busbw_factor": busbw_factor(comm.Get_size(), kind.name),
        "busbw_formula": kind.busbw_formula,
        "size_is": kind.size_is,  # None: the buffer, as the all-reduce's
        "argv": argv,
        **(_gpu_facts(comm) if dev.name == "gpu" else {}),
    }


def _gpu_facts(comm: MPI.Intracomm) -> dict[str, Any]:
    """What bounds the GPU path here: the GPUs, the pinned copy bandwidth, the staging piece size."""
    import cupy

    gpus = comm.allgather((MPI.Get_processor_name(), gpu_identity()))
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    comm.Barrier()
    d2h = pinned_d2h_bandwidth(64 << 20) if comm.Get_rank() == 0 else None  # alone, not contended
    comm.Barrier()
    chunk = ring_staged.staging_chunk_bytes()  # None: whole segments
    return {
        "gpu": name,
        "gpus": len(set(gpus)),
        "pinned_d2h_GBps": comm.bcast(d2h) / 1e9,
        "staging_chunk_bytes": chunk,
    }


def copyto_GBps(comm: MPI.Intracomm, nbytes: int) -> float:
    """np.copyto's bandwidth for ``nbytes`` in GB/s, what bounds the ring on the CPU (collective).

    Rank 0 alone, the others asleep: the memory bandwidth one process gets.
    """
    comm.Barrier()
    copyto = copyto_bandwidth(nbytes) if comm.Get_rank() == 0 else None
    idle_barrier(comm)
    return comm.bcast(copyto) / 1e9


# ---------------------------------------------------------------------------------------
# The cost model's column: the bench's one use of `hpcring.model`.


def load_model(comm: MPI.Intracomm) -> Params | None:
    """Rank 0's calibrated cost model (`python -m hpcring.model --calibrate`), broadcast to
    every rank; None: no column then (collective)."""
    params = None
    if comm.Get_rank() == 0:
        try:
            params = load_params()
        except ModelError:
            params = None
    return comm.bcast(params)


def model_source(params: Params | None) -> str | None:
    """What the header names as the model's origin: its file, or None without one."""
    return None if params is None else params.meta.get("path", "calibrated")


def predicted_us(
    algorithm: str,
    nbytes: int,
    comm: MPI.Intracomm,
    params: Params,
    wire: str | None = None,
    itemsize: int = 4,
    collective: str = algorithms.ALLREDUCE,
) -> float | None:
    """The cost model's time in us for a ``collective`` whose input is ``nbytes`` on each rank, on
    the nodes hpcring found (None where it cannot say)."""
    nodes = topology.of(channel_for(comm, adapter_for(np.empty(0))).comm)
    per_node = nodes.per_node[0] if nodes.two_level else None
    fallback = algorithms.spec(collective, algorithm).fallback
    if per_node is None and fallback:
        algorithm = fallback  # what a two-level algorithm runs without a second level
    try:
        seconds = predict(
            algorithm,
            nbytes,
            comm.Get_size(),
            params,
            per_node=per_node,
            wire=wire,
            itemsize=itemsize,
            collective=collective,
        )
        return seconds * 1e6
    except ModelError:
        return None  # hierarchical on nodes, but the calibration saw one node only


# ---------------------------------------------------------------------------------------
# What the header tells a newcomer: where `auto`'s table and the model's column come from.


def guidance_facts(
    comm: MPI.Intracomm, shape: dict[str, Any], in_place: bool, collective: str = algorithms.ALLREDUCE
) -> dict[str, Any]:
    """Whether `auto` runs a tuned table or the built-in defaults, and where the cost model was
    looked for, so the header can say why a row chose what it did and why `predicted` is empty
    (rank 0 reads, as `auto` and `load_model` do; broadcast: collective)."""
    facts = None
    if comm.Get_rank() == 0:
        auto_facts = _auto_facts(comm.Get_size(), shape, in_place, collective)
        facts = {"auto": auto_facts, "model_path": str(default_path())}
    return comm.bcast(facts)


def _auto_facts(size: int, shape: dict[str, Any], in_place: bool, collective: str) -> dict[str, Any]:
    """The table `auto` reads for this run of ``collective`` (tuning.load's own answer, in place
    where this collective's auto keeps such tables) and whether it was tuned."""
    path = tuning.tuning_path()
    plain = tuning.key_for(size, shape, collective=collective)
    in_place = in_place and COLLECTIVES[collective].in_place_tables
    keys = [tuning.key_for(size, shape, True, collective), plain] if in_place else [plain]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = tuning.load(keys[0], path, fallback=keys[1] if in_place else None)
    why, key = None, None
    try:
        present = path.exists()
    except OSError:
        present = False
    if caught:
        why = str(caught[0].message).removeprefix("hpcring: ")
    elif not present:
        why = f"no tuning file at {path}"
    else:
        tables = json.loads(path.read_text())["tables"]  # load() just read it without a complaint
        key = next(k for k in keys if k in tables)
    table = [list(t) for t in table]
    facts = {"tuned": why is None, "why": why, "path": str(path), "key": key, "table": table}
    upto = exchange.ahead_upto(size) if collective == algorithms.ALLTOALL else False
    if upto is not False:
        facts["ahead"] = upto  # before any table: `exchange.auto_runs`
    return facts
