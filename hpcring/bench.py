"""`python -m hpcring.bench`: the nccl-tests-style benchmark of every algorithm side by side.

One driver owns arguments, warm-up, timing, checking and the table (as nccl-tests'
``common.cu`` does); what is specific to an algorithm is one line of
`expected_bytes_sent`. Time is taken per iteration on every rank, the max over ranks
of each iteration is what a synchronous training step would wait for, and a row
reports the median of those maxima. Bytes sent are *measured* by the Channel (what
hpcring hands to MPI) and printed beside the textbook formula, so a disagreement is
visible. With ``-c 1`` (the default) inputs are small integers whose reduction is
exact in every dtype and summation order, so every element can be compared exactly;
any wrong element makes the exit status 1, so a batch job fails loudly.

Usage errors are raised by argparse identically on every rank (argv is the same
everywhere), before any collective, so rank 0 prints one message and every rank
returns 2 without waiting for the others.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from . import ALGORITHMS, __version__, algorithms, info, model, topology
from .algorithms import auto
from .algorithms.tuning import write_tuning
from .api import allreduce, channel_for
from .backend import backend_for, copyto_bandwidth, gpu_problem_anywhere, select_device
from .errors import abort_on_error
from .ops import BFLOAT16, DTYPES, OPS, check_op

# nccl-tests names for dtypes and ops, accepted beside NumPy's and hpcring's own.
DTYPE_ALIASES = {
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "int": "int32",
    "bf16": "bfloat16",
}
OP_ALIASES = {"avg": "mean"}
USAGE_EXIT = 2
WRONG_EXIT = 1

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


# ---------------------------------------------------------------------------------------
# The formulas: one place each.


def parse_size(text: str) -> int:
    """Bytes from ``8``, ``64K``, ``16M``, ``1G`` (binary units, as nccl-tests); ValueError otherwise."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"invalid size {text!r}: use a number of bytes with an optional K, M, G or T suffix")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value != int(value):
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(nbytes: int) -> str:
    """The shortest exact binary-suffixed spelling of ``nbytes`` (for the footer)."""
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def busbw_factor(size: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor 2(G-1)/G, the same for every algorithm.

    It scales algbw so that an ideal all-reduce reaches the link bandwidth whatever G is,
    which makes numbers comparable across rank counts. It is a property of the
    collective, not of the algorithm: a naive all-reduce that sends more does not get
    a bigger factor, it gets a lower busbw.
    """
    return 2.0 * (size - 1) / size if size > 0 else 0.0


def expected_bytes_sent(
    algorithm: str, nbytes: int, size: int, rank: int, itemsize: int = 1, per_node: int = 1
) -> int | None:
    """Bytes rank ``rank`` of ``size`` should hand to MPI for one all-reduce of ``nbytes``.

    Each algorithm module states its own formula (`hpcring.algorithms.bytes_sent`): naive
    (G-1)·N; ps (G-1)·N at the root (its Bcast), N elsewhere (its Gather row); ring
    2(G-1)/G·N, exactly from the segment bounds, so when G does not divide the count a
    rank sends up to a couple of elements more or less; rabenseifner 2(G-1)/G·N plus the
    fold; hierarchical a ring of ``per_node`` ranks plus a ring across nodes on one shard;
    mpi None, MPI's own traffic is not visible.
    """
    return algorithms.bytes_sent(algorithm, nbytes // itemsize, itemsize, size, rank, per_node)


def sweep(minbytes: int, maxbytes: int, stepfactor: float, itemsize: int) -> list[int]:
    """Message sizes in bytes, minbytes * stepfactor**k up to maxbytes, whole elements, no repeats."""
    sizes: list[int] = []
    nbytes = float(minbytes)
    while nbytes <= maxbytes * (1 + 1e-12):
        rounded = int(nbytes) // itemsize * itemsize
        if rounded > 0 and (not sizes or rounded > sizes[-1]):
            sizes.append(rounded)
        nbytes = nbytes * stepfactor if nbytes > 0 else 1.0
    return sizes


# ---------------------------------------------------------------------------------------
# Verifiable data: small integers from (rank, index), periodic in the index.

PERIOD = 60  # lcm of the residues used below, so a table of PERIOD values describes every index
BFLOAT16_RANKS = 128  # ranks whose +-2 a bfloat16 sum can take in any order and stay exact


def _value(op: str, dtype: np.dtype, rank: int, index: int) -> complex:
    """Rank ``rank``'s input at ``index``: integers small enough that any summation order is exact.

    Sums stay within +-2G (exact in float16 up to G = 1024), products are +-1 or +-2.
    bfloat16 holds integers exactly only to 256: ranks from BFLOAT16_RANKS on give zeros.
    """
    if op == "prod":
        value = -1 if (rank + index) % 3 == 0 else 1
        return value * (2 if rank == 0 and index % 4 == 1 else 1)
    if dtype == BFLOAT16 and rank >= BFLOAT16_RANKS:
        return 0
    value = (rank + index) % 5 - 2
    if dtype.kind == "c":
        return complex(value, (2 * rank + index) % 3 - 1)
    return value


def _reduce_exact(op: str, values: list[complex]) -> complex:
    if op in ("sum", "mean"):
        return sum(values)
    if op == "prod":
        return math.prod(values)
    real = [v.real for v in values]  # max/min never see complex (refused by the op)
    return max(real) if op == "max" else min(real)


def verifiable_input(xp: Any, count: int, dtype: np.dtype, op: str, rank: int) -> Any:
    """Rank ``rank``'s input of ``count`` elements, on the array module ``xp``."""
    period = np.array([_value(op, dtype, rank, i) for i in range(PERIOD)]).astype(dtype)
    return xp.asarray(np.resize(period, count))


def expected_result(xp: Any, count: int, dtype: np.dtype, op: str, size: int) -> Any:
    """The exact reduction over ``size`` ranks, rounded once to ``dtype`` (mean: divided as the API does)."""
    exact = [_reduce_exact(op, [_value(op, dtype, r, i) for r in range(size)]) for i in range(PERIOD)]
    if dtype.kind != "c":
        exact = [v.real for v in exact]
    period = xp.asarray(np.array(exact).astype(dtype))
    if op == "mean" and size > 1:
        xp.true_divide(period, size, out=period)  # the very operation hpcring.allreduce does
    return period[xp.arange(count) % PERIOD]


# ---------------------------------------------------------------------------------------
# Command line.


class _Usage(Exception):
    """A usage error or help request: print on rank 0 only, then every rank returns ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting, so only rank 0 speaks."""

    def error(self, message: str) -> NoReturn:
        raise _Usage(USAGE_EXIT, f"{self.format_usage()}{self.prog}: error: {message}\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _Usage(status, message or "")

    def _print_message(self, message: str, file: Any = None) -> None:
        if message and MPI.COMM_WORLD.Get_rank() == 0:
            (file or sys.stdout).write(message)


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive(kind: type, minimum: float) -> Any:
    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value

    return convert


def build_parser() -> argparse.ArgumentParser:
    """The command line, flags as in nccl-tests where they exist there."""
    parser = _Parser(
        prog="python -m hpcring.bench",
        description="Benchmark hpcring's all-reduce algorithms side by side (run under mpiexec).",
    )
    add = parser.add_argument
    add("-b", "--minbytes", type=_size_arg, default=8, metavar="SIZE", help="smallest message (default 8)")
    add("-e", "--maxbytes", type=_size_arg, default=16 << 20, metavar="SIZE", help="largest (default 16M)")
    add("-f", "--stepfactor", type=_positive(float, 1.0001), default=2.0, help="size multiplier (default 2)")
    add("-n", "--iters", type=_positive(int, 1), default=20, help="timed iterations per row (default 20)")
    add("-w", "--warmup", type=_positive(int, 0), default=5, help="untimed iterations first (default 5)")
    add("-c", "--check", type=int, choices=(0, 1), default=1, nargs="?", const=1, help="check results (1)")
    add("-d", "--dtype", default="float32", help=f"one of {', '.join(d.name for d in DTYPES)} (float32)")
    add("-o", "--op", default="sum", help=f"one of {', '.join(OPS)} (sum)")
    add(
        "-a",
        "--algorithms",
        default=None,
        help=f"comma list of {', '.join((*ALGORITHMS, *algorithms.BASELINES))} "
        "(default: all; nccl on GPUs only)",
    )
    add("--device", choices=("cpu", "gpu", "auto"), default="auto", help="gpu if CuPy sees one (auto)")
    add(
        "--max-time",
        type=_positive(float, 0.0),
        default=1.0,
        metavar="SECONDS",
        help="fewer iterations (at least 3) where the warm-up predicts a row would take longer (1.0; 0: off)",
    )
    add(
        "--passes",
        type=_positive(int, 1),
        default=1,
        help="run the whole sweep N times and keep, per row, the pass with the median time: "
        "a slow spell of seconds then hits every algorithm alike, not one (default 1)",
    )
    add("--no-agree", action="store_true", help="time allreduce(check=False): skip the agreement step")
    add(
        "--in-place",
        action="store_true",
        help="time allreduce(x) in place, x rewritten with the input before each call (untimed); "
        "default: out of place, allreduce(x, out=)",
    )
    add(
        "--tune",
        action="store_true",
        help="write the fastest algorithm per size to the tuning file that algorithm 'auto' reads",
    )
    add("--json", metavar="FILE", help="write header and every row to FILE")
    add("--plot", metavar="FILE.png", help="plot busbw vs size to FILE.png (needs matplotlib)")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and validate; every check is a pure function of argv, so all ranks agree without talking."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.minbytes > args.maxbytes:
        parser.error(f"minbytes ({args.minbytes}) is larger than maxbytes ({args.maxbytes})")
    name = DTYPE_ALIASES.get(args.dtype, args.dtype)
    if name not in [d.name for d in DTYPES]:
        parser.error(f"unknown dtype {args.dtype!r}; choose one of {', '.join(d.name for d in DTYPES)}")
    args.dtype = np.dtype(name)
    args.op = OP_ALIASES.get(args.op, args.op)
    if args.op not in OPS:
        parser.error(f"unknown op {args.op!r}; choose one of {', '.join(OPS)}")
    try:
        check_op(OPS[args.op], args.dtype)
    except TypeError as error:
        parser.error(str(error).removeprefix("hpcring.allreduce: "))
    args.default_algorithms = args.algorithms is None
    known = (*ALGORITHMS, *algorithms.BASELINES)
    names = [a.strip() for a in (args.algorithms or ",".join(ALGORITHMS)).split(",") if a.strip()]
    unknown = [a for a in names if a not in known]
    if unknown or not names:
        parser.error(f"unknown algorithm {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    if args.device == "cpu" and "nccl" in names:
        parser.error("algorithm 'nccl' needs --device gpu")
    args.algorithms = list(dict.fromkeys(names))
    if not sweep(args.minbytes, args.maxbytes, args.stepfactor, args.dtype.itemsize):
        parser.error(f"no size between minbytes and maxbytes holds a whole {args.dtype.name} element")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib (pip install 'hpcring[bench]')")
    return args


# ---------------------------------------------------------------------------------------
# Device: the one place in the bench that picks NumPy or CuPy.


@dataclass
class Device:
    name: str  # cpu or gpu
    xp: Any

    def sync(self) -> None:
        """Wait for queued device work, so a timer sees the whole call."""
        if self.name == "gpu":
            self.xp.cuda.get_current_stream().synchronize()


def _device(choice: str, comm: MPI.Intracomm) -> Device | str:
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
    return Device("gpu", cupy)


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

    @property
    def label(self) -> str:
        return f"auto:{self.chosen}" if self.chosen else self.algorithm


def _measure(
    args: argparse.Namespace,
    comm: MPI.Intracomm,
    dev: Device,
    nbytes: int,
    algorithm: str,
    corrupt_rank: int | None,
) -> Row:
    """Warm up, time, measure traffic and check one (size, algorithm) cell."""
    rank, size, dtype = comm.Get_rank(), comm.Get_size(), args.dtype
    count = nbytes // dtype.itemsize
    x = verifiable_input(dev.xp, count, dtype, args.op, rank)
    # In place, the result lands in x: each call starts from the input rewritten (untimed),
    # as a training step's fresh gradients; out of place, x stays as it is.
    pristine = x.copy() if args.in_place else None
    out = x if args.in_place else dev.xp.empty_like(x)
    agree = not args.no_agree
    channel = channel_for(comm, backend_for(x))
    chosen = auto.chosen(channel, nbytes, args.in_place) if algorithm == "auto" else None  # collective

    def call() -> None:
        allreduce(x, op=args.op, algorithm=algorithm, comm=comm, out=out, check=agree)

    def refill() -> None:
        if pristine is not None:
            x[...] = pristine
            dev.sync()

    start = MPI.Wtime()
    for _ in range(args.warmup):
        refill()
        call()
    dev.sync()
    iters = args.iters
    if args.warmup and args.max_time > 0:
        per_call = comm.allreduce((MPI.Wtime() - start) / args.warmup, op=MPI.MAX)  # same on every rank
        if per_call * iters > args.max_time:
            iters = max(min(iters, 3), int(args.max_time / per_call))

    times = np.empty(iters)
    sent_before = channel.bytes_sent
    comm.Barrier()
    for i in range(iters):
        refill()
        t0 = MPI.Wtime()
        call()
        dev.sync()
        times[i] = MPI.Wtime() - t0
    sent = (channel.bytes_sent - sent_before) / iters
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)  # per iteration: what the slowest rank saw

    wrong: int | None = None
    if args.check:
        expected = expected_result(dev.xp, count, dtype, args.op, size)
        if pristine is None:
            out[...] = expected + 1  # stale or untouched output can never pass
        refill()  # in place, the input itself: it differs from the result wherever G > 1
        call()
        if corrupt_rank == rank and count:
            out[count // 2] += 1  # test hook: one wrong element on one rank
        wrong = comm.allreduce(int((out != expected).sum()), op=MPI.SUM)

    median = statistics.median(times.tolist())
    algbw = nbytes / median / 1e9 if median > 0 else 0.0
    ran = chosen or algorithm
    if expected_bytes_sent(ran, nbytes, size, rank, dtype.itemsize) is None:  # mpi, nccl: not visible
        measured: list[int] | None = None
        formula: list[int] | None = None
    else:
        measured = [int(s) if s == int(s) else s for s in comm.allgather(sent)]
        nodes = topology.of(channel.comm)
        per_node = nodes.per_node[0] if nodes.two_level else 1
        # Algorithms that run in node order (ranks placed round-robin, say) send what the rank
        # at that position of the order sends.
        place = nodes.order.index if getattr(algorithms.module(ran), "RING_ORDER", False) else int
        formula = [
            expected_bytes_sent(ran, nbytes, size, place(r), dtype.itemsize, per_node) or 0
            for r in range(size)
        ]
    return Row(
        size=nbytes,
        count=count,
        dtype=dtype.name,
        op=args.op,
        algorithm=algorithm,
        iters=iters,
        time_us=median * 1e6,
        time_us_min=float(times.min()) * 1e6,
        time_us_max=float(times.max()) * 1e6,
        algbw=algbw,
        busbw=algbw * busbw_factor(size),
        bytes_sent=None if measured is None else max(measured),
        bytes_expected=None if formula is None else max(formula),
        bytes_sent_per_rank=measured,
        bytes_expected_per_rank=formula,
        wrong=wrong,
        bytes_match=measured == formula,
        chosen=chosen,
    )


# ---------------------------------------------------------------------------------------
# Output.


def _baselines(args: argparse.Namespace, comm: MPI.Intracomm, dev: Device) -> dict[str, str]:
    """Add NCCL on GPUs (by default) and drop it where it cannot run; returns {name: why not run}."""
    from .algorithms import nccl

    if dev.name == "gpu" and args.default_algorithms:
        args.algorithms.append("nccl")
    if "nccl" not in args.algorithms:
        return {}
    reason = "needs --device gpu" if dev.name != "gpu" else nccl.unavailable(comm)  # collective
    if not reason:
        return {}
    args.algorithms.remove("nccl")
    return {"nccl": reason}


def _header(args: argparse.Namespace, argv: list[str], comm: MPI.Intracomm, dev: Device) -> dict[str, Any]:
    """Everything that says what was measured where (collective: gathers host names)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_size = local.Get_size()
    local.Free()
    hosts = comm.allgather(MPI.Get_processor_name() or socket.gethostname())
    per_host = sorted(set(comm.allgather(local_size)))
    nodes = topology.of(channel_for(comm, backend_for(dev.xp.empty(0))).comm)  # what hierarchical sees
    facts = info()
    return {
        "hpcring": __version__,
        "mpi_library": facts["mpi_library"],
        "mpi4py": facts["mpi4py"],
        "ranks": comm.Get_size(),
        "hosts": len(set(hosts)),
        "ranks_per_host": per_host[0] if len(per_host) == 1 else f"{per_host[0]}-{per_host[-1]}",
        "topology": topology.summary(nodes),
        "device": dev.name,
        "cuda_aware": facts["cuda_aware"],
        "cuda_aware_reason": facts["cuda_aware_reason"],
        "dtype": args.dtype.name,
        "op": args.op,
        "algorithms": args.algorithms,
        "iters": args.iters,
        "passes": args.passes,
        "warmup": args.warmup,
        "max_time_s": args.max_time,
        "check": bool(args.check),
        "agree": not args.no_agree,
        "placement": "in place, input rewritten before each call (untimed)"
        if args.in_place
        else "out-of-place (out=), input constant across iterations",
        "time": "per iteration max over ranks; median over iterations",
        "busbw_factor": busbw_factor(comm.Get_size()),
        "argv": argv,
        **(_gpu_facts(comm) if dev.name == "gpu" else {}),
    }


def _gpu_facts(comm: MPI.Intracomm) -> dict[str, Any]:
    """What bounds the GPU path here: the GPUs, the pinned copy bandwidth, the staging piece size."""
    import cupy

    from .algorithms import ring
    from .backend import gpu_identity, pinned_d2h_bandwidth

    gpus = comm.allgather((MPI.Get_processor_name(), gpu_identity()))
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    comm.Barrier()
    d2h = pinned_d2h_bandwidth(64 << 20) if comm.Get_rank() == 0 else None  # alone, not contended
    comm.Barrier()
    chunk = ring.staging_chunk_bytes()  # None: whole segments
    return {
        "gpu": name,
        "gpus": len(set(gpus)),
        "pinned_d2h_GBps": comm.bcast(d2h) / 1e9,
        "staging_chunk_bytes": chunk,
    }


_COLUMNS = (
    ("size", ">12", "(B)"),
    ("count", ">11", "(elements)"),
    ("type", ">10", ""),
    ("redop", ">6", ""),
    ("algorithm", ">17", ""),
    ("time", ">10", "(us)"),
    ("predicted", ">10", "(us)"),
    ("algbw", ">8", "(GB/s)"),
    ("busbw", ">8", "(GB/s)"),
    ("sent/rank", ">11", "measured"),
    ("sent/rank", ">11", "formula"),
    ("#wrong", ">7", ""),
)


def _format_header(h: dict[str, Any]) -> str:
    aware = "yes" if h["cuda_aware"] else "no"
    lines = [
        f"# hpcring {h['hpcring']} all-reduce benchmark  ({h['mpi_library']}, mpi4py {h['mpi4py']})",
        f"# ranks {h['ranks']}  hosts {h['hosts']}  ranks/host {h['ranks_per_host']}  "
        f"device {h['device']}  CUDA-aware {aware} ({h['cuda_aware_reason']})",
        f"# topology: {h['topology']['describe']}, two-level {'yes' if h['topology']['two_level'] else 'no'}"
        f", ring in {h['topology']['ring_order']}",
        *_gpu_header(h),
        *(f"# {name}: not run: {why}" for name, why in h.get("not_run", {}).items()),
        f"# dtype {h['dtype']}  op {h['op']}  iters {h['iters']} (fewer past {h['max_time_s']:g} s/row)  "
        f"warmup {h['warmup']}  passes {h['passes']}  check {int(h['check'])}  agree {int(h['agree'])}  "
        f"{h['placement']}",
        f"# time: {h['time']};  busbw = algbw * 2(G-1)/G = algbw * {h['busbw_factor']:.4g};  "
        "sent/rank: bytes handed to MPI per call, max over ranks",
        "#",
        "# " + " ".join(f"{name:{spec}}" for name, spec, _ in _COLUMNS)[2:],
        "# " + " ".join(f"{unit:{spec}}" for _, spec, unit in _COLUMNS)[2:],
    ]
    return "\n".join(lines)


def _gpu_header(h: dict[str, Any]) -> list[str]:
    if h["device"] != "gpu":
        return []
    piece = h["staging_chunk_bytes"]
    piece = f"pieces of {format_size(piece)}B" if piece else "whole segments"
    staging = "" if h["cuda_aware"] else f"  host staging: {piece}"
    lines = [
        f"# GPU {h['gpu']}: {h['gpus']} for {h['ranks']} ranks  pinned device-to-host "
        f"{h['pinned_d2h_GBps']:.1f} GB/s (one rank alone){staging}"
    ]
    return lines


def _format_row(row: Row) -> str:
    def num(value: int | None) -> str:
        return "-" if value is None else str(value)

    measured = num(row.bytes_sent) + ("" if row.bytes_match else "!")
    cells = (
        row.size,
        row.count,
        row.dtype,
        row.op,
        row.label,
        f"{row.time_us:.1f}",
        "-" if row.predicted_us is None else f"{row.predicted_us:.1f}",
        f"{row.algbw:.3f}",
        f"{row.busbw:.3f}",
        measured,
        num(row.bytes_expected),
        "N/A" if row.wrong is None else row.wrong,
    )
    return " ".join(f"{cell:{spec}}" for cell, (_, spec, _) in zip(cells, _COLUMNS, strict=True))


def _model_params() -> model.Params | None:
    """The calibrated cost model (`python -m hpcring.model --calibrate`), or None: no column then."""
    try:
        return model.load_params()
    except model.ModelError:
        return None


def _predicted(algorithm: str, nbytes: int, comm: MPI.Intracomm, params: model.Params) -> float | None:
    """The cost model's time in us, on the nodes hpcring found (None where it cannot say)."""
    nodes = topology.of(channel_for(comm, backend_for(np.empty(0))).comm)
    per_node = nodes.per_node[0] if nodes.two_level else None
    if algorithm == "hierarchical" and per_node is None:
        algorithm = "ring"  # what it runs without a second level
    try:
        return model.predict(algorithm, nbytes, comm.Get_size(), params, per_node=per_node) * 1e6
    except model.ModelError:
        return None  # hierarchical on nodes, but the calibration saw one node only


def median_rows(passes: list[list[Row]]) -> list[Row]:
    """Per (size, algorithm), the row of the pass whose median time is the median of the passes
    (the upper one of an even count), in the order the first pass measured them."""
    cells: dict[tuple[int, str], list[Row]] = {}
    for one in passes:
        for row in one:
            cells.setdefault((row.size, row.algorithm), []).append(row)
    return [sorted(rows, key=lambda r: r.time_us)[len(rows) // 2] for rows in cells.values()]


def summarize(rows: list[Row]) -> list[dict[str, Any]]:
    """Per size: the fastest algorithm and each one's busbw relative to mpi (= mpi time / its time)."""
    summary = []
    for nbytes in dict.fromkeys(r.size for r in rows):
        cells = [r for r in rows if r.size == nbytes]
        best = min(cells, key=lambda r: r.time_us)
        base = next((r for r in cells if r.algorithm == "mpi"), None)
        relative = {
            r.algorithm: (base.time_us / r.time_us if base and r.time_us > 0 else None) for r in cells
        }
        summary.append({"size": nbytes, "best": best.algorithm, "busbw_vs_mpi": relative})
    return summary


def _format_footer(rows: list[Row], summary: list[dict[str, Any]]) -> str:
    names = list(dict.fromkeys(r.algorithm for r in rows))
    lines = [
        "#",
        "# best algorithm per size, and busbw relative to mpi (>1: faster than MPI_Allreduce)",
        "# " + f"{'size':>8} {'best':>12}  " + " ".join(f"{n:>{max(7, len(n))}}" for n in names),
    ]
    for entry in summary:
        rel = entry["busbw_vs_mpi"]
        cells = " ".join(
            f"{'-' if rel.get(n) is None else format(rel[n], '.2f'):>{max(7, len(n))}}" for n in names
        )
        lines.append(f"# {format_size(entry['size']):>8} {entry['best']:>12}  {cells}")
    checked = [r.wrong for r in rows if r.wrong is not None]
    wrong = sum(checked)
    mismatched = sum(not r.bytes_match for r in rows)
    verdict = f"{wrong} wrong element{'s' if wrong != 1 else ''}" if checked else "results not checked"
    avg = statistics.mean(r.busbw for r in rows)
    lines += [
        f"# out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}  ({verdict})",
        f"# bytes sent vs formula: {len(rows) - mismatched}/{len(rows)} rows agree"
        + ("" if not mismatched else "  (! marks rows that do not: a bug)"),
        f"# avg bus bandwidth    : {avg:.4f} GB/s",
    ]
    return "\n".join(lines)


def _ceiling_line(header: dict[str, Any], rows: list[Row]) -> str:
    """The ring's busbw at the largest size against what bounds it on this device: the pinned
    copy bandwidth of host staging on a GPU, one process's np.copyto on the CPU."""
    ring = [r for r in rows if r.algorithm == "ring"]
    if not ring:
        return "# ring not run: no figure against the copy bandwidth"
    top = max(ring, key=lambda r: r.size)
    mpi = next((r for r in rows if r.algorithm == "mpi" and r.size == top.size), None)
    versus = f", {mpi.time_us / top.time_us:.2f}x mpi" if mpi and top.time_us > 0 else ""
    if header["device"] == "gpu":
        ceiling, what = header["pinned_d2h_GBps"], "pinned device-to-host"
    else:
        ceiling = header["copyto_GBps"]
        what = f"np.copyto ({ceiling:.2f} GB/s, one process, {format_size(top.size)}B, same run)"
    ring_at = f"# ring at {format_size(top.size)}B: busbw {top.busbw:.2f} GB/s"
    return f"{ring_at} = {top.busbw / ceiling:.3f} x {what}{versus}"


class _Progress:
    """Progress of the sweep on rank 0's stderr: a bar on a terminal, plain lines otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.tty = enabled and sys.stderr.isatty()
        self.start = self.last = time.monotonic()

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        if self.tty:
            filled = 30 * self.done // self.total
            bar = "#" * filled + "." * (30 - filled)
            sys.stderr.write(f"\r[{bar}] {self.done}/{self.total} {label:<22} {elapsed:6.1f} s")
        elif time.monotonic() - self.last >= 2.0 or self.done == self.total:  # a log, not a flood
            self.last = time.monotonic()
            sys.stderr.write(
                f"hpcring.bench: {self.done}/{self.total} rows, last {label} ({elapsed:.1f} s)\n"
            )
        sys.stderr.flush()

    def clear(self) -> None:
        """Erase the bar, so the table lines on the same terminal stay clean."""
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _plot(path: str, header: dict[str, Any], rows: list[Row]) -> None:
    """busbw against size, one line per algorithm (matplotlib imported here only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r.algorithm for r in rows):
        mine = [r for r in rows if r.algorithm == name]
        ax.plot([r.size for r in mine], [r.busbw for r in mine], marker="o", markersize=3, label=name)
    ax.set_xscale("log", base=2)
    if all(r.busbw > 0 for r in rows):  # one rank has busbw 0 (factor 0): keep that linear
        ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(
        f"hpcring all-reduce, {header['ranks']} ranks on {header['hosts']} "
        f"host{'s' if header['hosts'] > 1 else ''}, {header['device']}, "
        f"{header['dtype']} {header['op']}"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, *, corrupt_rank: int | None = None) -> int:
    """Run the benchmark; return 0, 1 if any element was wrong or bytes disagree, 2 on a usage error.

    ``corrupt_rank`` is a test hook: that rank flips one element after each checked
    reduction, to prove that a wrong result fails the run. ``HPCRING_BENCH_CORRUPT``
    (a rank number) does the same from outside.
    """
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args, usage = parse_args(argv), None
    except _Usage as error:
        usage = error
    # argv is the same on every rank, but what is installed (matplotlib for --plot) may not
    # be: agree, so that no rank goes on alone into the collectives below.
    stops = [stop for stop in comm.allgather(None if usage is None else (usage.status, str(usage))) if stop]
    if stops:
        status, text = stops[0]
        if rank == 0 and text:
            sys.stderr.write(text)
        return status
    if corrupt_rank is None and os.environ.get("HPCRING_BENCH_CORRUPT", "").strip():
        corrupt_rank = int(os.environ["HPCRING_BENCH_CORRUPT"])

    # From here on every rank runs the same collectives in the same order.
    dev = _device(args.device, comm)
    if not isinstance(dev, str) and dev.name == "gpu" and args.dtype == BFLOAT16:
        dev = "bfloat16 is ml_dtypes' NumPy dtype, CuPy has none: run it with --device cpu"
    if isinstance(dev, str):
        if rank == 0:
            sys.stderr.write(f"{build_parser().prog}: error: {dev}\n")
        return USAGE_EXIT

    not_run = _baselines(args, comm, dev)
    if not args.algorithms:
        if rank == 0:
            sys.stderr.write(f"{build_parser().prog}: error: nothing to run: {not_run}\n")
        return USAGE_EXIT
    header = _header(args, argv, comm, dev)
    header["not_run"] = not_run
    params = comm.bcast(_model_params() if rank == 0 else None)
    header["model"] = None if params is None else params.meta.get("path", "calibrated")
    sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor, args.dtype.itemsize)
    if rank == 0:
        print(_format_header(header), flush=True)
    progress = _Progress(len(sizes) * len(args.algorithms) * args.passes, enabled=rank == 0)
    passes: list[list[Row]] = []
    for done in range(args.passes):
        if rank == 0 and args.passes > 1:
            progress.clear()
            print(f"# pass {done + 1} of {args.passes}", flush=True)
        passes.append([])
        for nbytes in sizes:
            for algorithm in args.algorithms:
                row = _measure(args, comm, dev, nbytes, algorithm, corrupt_rank)
                if params is not None:
                    row.predicted_us = _predicted(row.chosen or algorithm, nbytes, comm, params)
                passes[-1].append(row)
                if rank == 0:
                    progress.clear()
                    print(_format_row(row), flush=True)
                progress.step(f"{algorithm} {format_size(nbytes)}B")
    rows = median_rows(passes)
    if rank == 0 and args.passes > 1:
        progress.clear()
        print(f"# per row, the pass with the median time of {args.passes}", flush=True)
        print("\n".join(map(_format_row, rows)), flush=True)

    summary = summarize(rows)
    every = [r for one in passes for r in one]
    failed = any(r.wrong for r in every) or not all(r.bytes_match for r in every)
    if dev.name != "gpu":  # rank 0 alone, the others asleep: the memory bandwidth one process gets
        comm.Barrier()
        copyto = copyto_bandwidth(max(sizes)) if rank == 0 else None
        model.idle_barrier(comm)
        header["copyto_GBps"] = comm.bcast(copyto) / 1e9
    if rank == 0:
        progress.clear()
        print(_format_footer(rows, summary), flush=True)
        print(_ceiling_line(header, rows), flush=True)
        if args.json:
            with open(args.json, "w") as stream:
                report = {"header": header, "rows": [asdict(r) for r in rows], "summary": summary}
                if args.passes > 1:
                    report["passes"] = [[asdict(r) for r in one] for one in passes]
                json.dump(report, stream, indent=1)
        if args.plot:
            _plot(args.plot, header, rows)
        if args.tune:
            path, key = write_tuning(rows, size=comm.Get_size(), header=header, in_place=args.in_place)
            print(f"# tuning for {comm.Get_size()} ranks (table {key}) written to {path}", flush=True)
        if failed:
            sys.stderr.write(
                "hpcring.bench: FAILED: wrong elements or bytes sent off the formula (see table)\n"
            )
    return WRONG_EXIT if failed else 0


if __name__ == "__main__":
    with abort_on_error():  # an exception on one rank ends the job instead of hanging the others
        sys.exit(main())
