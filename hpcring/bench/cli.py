"""The bench's command line and driver: flags as in nccl-tests, then the sweep, on every rank.

Usage errors are raised by argparse identically on every rank (argv and the rank count are
the same everywhere), before any collective, so rank 0 prints one message and every rank
returns 2 without waiting for the others. ``--collective`` picks the collective measured; what
differs between collectives is their description (`hpcring.bench.collectives`), not this driver.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from .. import algorithms, config, exact
from ..algorithms.tuning import write_tuning
from ..ops import NAMES as DTYPE_NAMES
from ..ops import OPS, bfloat16, check_op, is_bfloat16
from ..units import format_size, parse_size
from ..wire import WIDE
from . import steploop
from .collectives import kind_of
from .data import sweep
from .measure import (
    REPRODUCIBLE,
    WIRE_TAGS,
    Device,
    Row,
    buffers,
    copyto_GBps,
    device_for,
    guidance_facts,
    header_facts,
    load_model,
    measure_rows,
    median_rows,
    model_source,
    predicted_us,
    wire_of,
)
from .report import (
    Progress,
    algorithm_width,
    ceiling_line,
    format_footer,
    format_header,
    format_row,
    plot,
    summarize,
    write_json,
)
from .startup import describe as describe_startup
from .startup import first_call

# nccl-tests names for dtypes and ops, accepted beside NumPy's and hpcring's own.
# What --framework torch times in (the dtypes torch and hpcring share, by NumPy's names)
TORCH_DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64", "complex64", "complex128")
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
        description="Benchmark hpcring's algorithms of a collective side by side with the bare MPI call "
        "(run under mpiexec).",
    )
    add = parser.add_argument
    add(
        "--collective",
        choices=algorithms.COLLECTIVES,
        default=algorithms.ALLREDUCE,
        help="the collective measured (default allreduce); a row's size is nccl-tests': the whole "
        "buffer (the all-gather's output, the reduce-scatter's input)",
    )
    add("-b", "--minbytes", type=_size_arg, default=8, metavar="SIZE", help="smallest message (default 8)")
    add("-e", "--maxbytes", type=_size_arg, default=16 << 20, metavar="SIZE", help="largest, measured (16M)")
    add("-f", "--stepfactor", type=_positive(float, 1.0001), default=2.0, help="size multiplier (default 2)")
    add("-n", "--iters", type=_positive(int, 1), default=20, help="timed iterations per row (default 20)")
    add("-w", "--warmup", type=_positive(int, 0), default=5, help="untimed iterations first (default 5)")
    add("-c", "--check", type=int, choices=(0, 1), default=1, nargs="?", const=1, help="check results (1)")
    add("-d", "--dtype", default="float32", help=f"one of {', '.join(DTYPE_NAMES)} (float32)")
    add("-o", "--op", default=None, help=f"one of {', '.join(OPS)} (sum; reductions only)")
    add("-r", "--root", type=_positive(int, 0), default=0, help="the broadcast's root (default 0)")
    add(
        "-a",
        "--algorithms",
        default=None,
        help="comma list of the collective's algorithms: "
        + "; ".join(f"{c}: {', '.join(algorithms.table(c))}" for c in algorithms.COLLECTIVES)
        + " (default: all; nccl on GPUs only)",
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
    add(
        "--interleave",
        action="store_true",
        help="time each size's rows call by call in turn (every row one call, then again, in an "
        "order shuffled each round) instead of each row's calls back to back: a slow spell falls on "
        "every row alike, so their ratios compare calls made side by side",
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
    add(
        "--reproducible",
        action="store_true",
        help="beside each algorithm's row, one of allreduce(reproducible=True), "
        f"named ALGORITHM{REPRODUCIBLE} (float dtypes, op sum or mean)",
    )
    add(
        "--wire",
        choices=list(WIRE_TAGS),
        help="beside each algorithm's row (but mpi's and nccl's), one of allreduce(wire=WIRE): what "
        "travels is narrowed to WIRE, named ALGORITHM+bf16 or +f16 (dtype float32 or float64)",
    )
    add(
        "--startup",
        action="store_true",
        help="print only what the first call costs (hpcring's import and first all-reduce against "
        "the bare first MPI_Allreduce), measured at the start of every run",
    )
    add(
        "--step-loop",
        action="store_true",
        help="run a simulation's step loop instead of the sweep: uneven work, a 192-byte all-reduce "
        "(bare, hpcring checked and unchecked, a plan) and an MPI_Allgather per step, quiet and "
        "beside --busy spinning processes",
    )
    add("--steps", type=_positive(int, 1), default=1000, help="--step-loop: steps per pass (1000)")
    add("--work-us", type=_positive(float, 0.0), default=50.0, help="--step-loop: work per step (50)")
    add("--late-us", type=_positive(float, 0.0), default=100.0, help="--step-loop: one rank's extra (100)")
    add("--busy", type=_positive(int, 0), default=1, help="--step-loop: spinning processes beside (1)")
    add(
        "--uneven",
        action="store_true",
        help="alltoall: uneven blocks (send_splits=, G sizes in proportion 1:2:...:G), rows against "
        "MPI_Alltoallv",
    )
    add(
        "--framework",
        choices=("torch", "jax"),
        help="instead of the sweep: torch, the collective timed four ways side by side (hpcring's "
        "blocking call, its non-blocking one waited for, torch.distributed on the hpcring backend, "
        "and on gloo; needs PyTorch; -a names the one algorithm); jax, a jax.jit step holding "
        "hpcring.jax.allreduce beside the same step with mpi4jax's (where installed; -a default "
        "auto, float dtypes)",
    )
    add("--json", metavar="FILE", help="write header and every row to FILE")
    add("--plot", metavar="FILE.png", help="plot busbw vs size to FILE.png (needs matplotlib)")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and validate; every check is a pure function of argv and the rank count, so all ranks
    agree without talking."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.uneven and args.collective != algorithms.ALLTOALL:
        parser.error("--uneven: all-to-all rows only (--collective alltoall)")
    kind = kind_of(args.collective, args.uneven)
    if args.minbytes > args.maxbytes:
        parser.error(f"minbytes ({args.minbytes}) is larger than maxbytes ({args.maxbytes})")
    name = DTYPE_ALIASES.get(args.dtype, args.dtype)
    if name not in DTYPE_NAMES:
        parser.error(f"unknown dtype {args.dtype!r}; choose one of {', '.join(DTYPE_NAMES)}")
    args.dtype = bfloat16() if name == "bfloat16" else np.dtype(name)
    if not kind.reduces and args.op is not None:
        parser.error(f"-o: the {kind.title} reduces nothing")
    args.op = OP_ALIASES.get(args.op, args.op or "sum") if kind.reduces else None
    if kind.reduces and args.op not in OPS:
        parser.error(f"unknown op {args.op!r}; choose one of {', '.join(OPS)}")
    if kind.reduces:
        try:
            check_op(OPS[args.op], args.dtype)
        except TypeError as error:
            parser.error(str(error).removeprefix("hpcring.allreduce: "))
    ranks = MPI.COMM_WORLD.Get_size()
    if not kind.rooted and args.root:
        parser.error(f"-r/--root: the {kind.title} has no root")
    if args.root >= ranks:
        parser.error(f"-r/--root {args.root}: there are {ranks} ranks")
    for option, given in (("reproducible", args.reproducible), ("wire", args.wire is not None)):
        if given and option not in kind.options:
            parser.error(f"--{option}: all-reduce rows only (hpcring.{kind.name} has no {option}=)")
    if args.in_place and kind.in_place_only:
        parser.error(f"--in-place: the {kind.title} is always in place")
    if args.in_place and kind.out_of_place_only:
        parser.error(f"--in-place: the {kind.title} has no in-place form")
    if args.in_place and args.tune and not kind.in_place_tables:
        parser.error(f"--in-place with --tune: auto keeps one {kind.title} table, for both placements")
    if args.reproducible:
        try:
            exact.check(args.op, args.dtype, accumulated=True)
        except (TypeError, ValueError) as error:
            parser.error(f"--reproducible: {str(error).removeprefix('hpcring.allreduce: ')}")
        if args.tune:
            parser.error("--reproducible and --tune: the tuning file is for the plain algorithms")
    if args.wire is not None:
        if args.dtype not in WIDE:
            parser.error(f"--wire: applies to dtype float32 or float64, not {args.dtype.name}")
        if args.tune or args.reproducible:
            parser.error("--wire with --tune or --reproducible: measure them apart")
    if args.framework == "jax":
        _jax_step_args(parser, args)
    args.default_algorithms = args.algorithms is None
    known = tuple(algorithms.table(args.collective))
    portable = algorithms.portable(args.collective)
    if args.uneven:  # what runs uneven blocks, auto included
        portable = tuple(a for a in portable if not algorithms.spec(args.collective, a).equal_only)
    given = args.algorithms or ",".join(portable)
    names = [a.strip() for a in given.split(",") if a.strip()]
    unknown = [a for a in names if a not in known]
    equal = [
        a for a in names if a in known and args.uneven and algorithms.spec(args.collective, a).equal_only
    ]
    if equal:
        parser.error(f"--uneven: {', '.join(map(repr, equal))} runs equal blocks only")
    if unknown or not names:
        parser.error(f"unknown algorithm {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    if args.device == "cpu" and "nccl" in names:
        parser.error("algorithm 'nccl' needs --device gpu")
    args.algorithms = list(dict.fromkeys(names))
    args.granule = kind.granule(args.dtype.itemsize, ranks)
    if not sweep(args.minbytes, args.maxbytes, args.stepfactor, args.granule):
        whole = f"a whole {args.dtype.name} element"
        if args.granule != args.dtype.itemsize:
            whole = f"{args.granule // args.dtype.itemsize} whole {args.dtype.name} elements (one per rank)"
        parser.error(f"no size between minbytes and maxbytes holds {whole}")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib (pip install -e '.[bench]' in hpcring's clone)")
    if args.framework == "torch":
        if args.dtype.name not in TORCH_DTYPES:
            parser.error(f"--framework torch: dtype one of {', '.join(TORCH_DTYPES)}")
        for option in ("json", "plot", "tune", "reproducible", "wire", "in_place", "no_agree"):
            if getattr(args, option):
                parser.error(f"--framework torch prints its own table: no --{option.replace('_', '-')}")
        # last: a command that is wrong anyway says so, here or on a machine with PyTorch alike
        if importlib.util.find_spec("torch") is None:
            parser.error("--framework torch needs PyTorch (pip install -e '.[torch]' in hpcring's clone)")
    return args


def _jax_step_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--framework jax: an all-reduce of floats in a jitted step, none of the sweep's extras."""
    if args.collective != algorithms.ALLREDUCE or args.op != "sum":
        parser.error("--framework jax: the all-reduce with op sum only")
    if args.dtype.kind not in "fV":
        parser.error(f"--framework jax: a float dtype, not {args.dtype.name}")
    extras = {"--tune": args.tune, "--reproducible": args.reproducible, "--wire": args.wire is not None}
    extras |= {"--in-place": args.in_place, "--no-agree": args.no_agree, "--json": bool(args.json)}
    extras |= {"--plot": bool(args.plot), "--device gpu": args.device == "gpu"}
    given = [flag for flag, on in extras.items() if on]
    if given:
        parser.error(f"--framework jax: {', '.join(given)} apply to the sweep, not to the jitted step")
    if args.algorithms is None:
        args.algorithms = "auto"
    if importlib.util.find_spec("jax") is None:
        parser.error("--framework jax needs JAX (pip install -e '.[jax]' in hpcring's clone)")


def _baselines(args: argparse.Namespace, comm: MPI.Intracomm, dev: Device) -> dict[str, str]:
    """Add NCCL on GPUs (by default) and drop it where it cannot run; returns {name: why not run}."""
    from ..algorithms import nccl

    if "nccl" not in algorithms.table(args.collective):  # by name: what this function is about
        return {}
    if dev.name == "gpu" and args.default_algorithms:
        args.algorithms.append("nccl")
    if "nccl" not in args.algorithms:
        return {}
    reason = "needs --device gpu" if dev.name != "gpu" else nccl.unavailable(comm)  # collective
    if not reason:
        return {}
    args.algorithms.remove("nccl")
    return {"nccl": reason}


# ---------------------------------------------------------------------------------------


def main(
    argv: list[str] | None = None, *, corrupt_rank: int | None = None, startup: dict[str, float] | None = None
) -> int:
    """Run the benchmark; return 0, 1 if any element was wrong or bytes disagree, 2 on a usage error.

    ``corrupt_rank`` is a test hook: that rank flips one element after each checked
    reduction, to prove that a wrong result fails the run. ``HPCRING_BENCH_CORRUPT``
    (a rank number) does the same from outside. ``startup``: the first call's cost, as
    `hpcring.bench.startup` measured it before the rest was imported (``python -m hpcring.bench``).
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
    if corrupt_rank is None:
        corrupt_rank = config.current().bench_corrupt
    if args.startup:
        facts = startup if startup is not None else first_call(comm)
        if rank == 0:
            print(describe_startup(facts), flush=True)
        return 0
    if args.step_loop:
        steploop.run(args, comm)
        return 0
    if args.framework == "torch":  # four ways side by side (hpcring.bench.torchcalls)
        from . import torchcalls

        return torchcalls.main(args, comm)
    if args.framework == "jax":  # a jitted step beside mpi4jax's (hpcring.bench.jaxstep)
        from . import jaxstep

        return jaxstep.run(args, comm)

    # From here on every rank runs the same collectives in the same order.
    dev = device_for(args.device, comm)
    if not isinstance(dev, str) and dev.name == "gpu" and is_bfloat16(args.dtype):
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
    header = header_facts(args, argv, comm, dev)
    header["not_run"] = not_run
    if startup is not None:
        header["startup"] = startup
    params = load_model(comm)
    header["model"] = model_source(params)
    # auto's table, the model's file
    header.update(guidance_facts(comm, header["topology"], args.in_place, args.collective))
    sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor, args.granule)
    width = algorithm_width(header)
    if rank == 0:
        print(format_header(header), flush=True)
    # The bare library call is measured at every size whatever -a says: it is the footer's yardstick.
    kind = kind_of(args.collective, args.uneven)
    bare = kind.bare
    names = [bare, *args.algorithms]
    if args.reproducible:  # each algorithm's reproducible row right after its plain one
        names = [bare, *(f"{a}{tag}" for a in args.algorithms for tag in ("", REPRODUCIBLE))]
    if args.wire is not None:  # each algorithm's wire row right after its plain one
        tag = WIRE_TAGS[args.wire]
        narrows = [a for a in args.algorithms if algorithms.spec(algorithms.ALLREDUCE, a).narrowings]
        names = [bare, *(f"{a}{t}" for a in args.algorithms for t in ("", tag) if not t or a in narrows)]
    progress = Progress(len(sizes) * len(names) * args.passes, enabled=rank == 0)
    passes: list[list[Row]] = []
    for done in range(args.passes):
        if rank == 0 and args.passes > 1:
            progress.clear()
            print(f"# pass {done + 1} of {args.passes}", flush=True)
        passes.append([])
        for nbytes in sizes:
            data = buffers(args, comm, dev, nbytes)  # every row of a size on the same arrays
            if args.interleave:  # the size's cells take turns, call by call
                measured = measure_rows(args, comm, dev, nbytes, names, corrupt_rank, data)
            else:  # each cell's calls back to back, one cell after another
                measured = (measure_rows(args, comm, dev, nbytes, [n], corrupt_rank, data)[0] for n in names)
            for algorithm, row in zip(names, measured, strict=True):
                if params is not None:  # the model's `mpi` is the library's own algorithm
                    modelled = "mpi" if algorithm == bare else row.chosen or algorithm
                    wire = wire_of(algorithm)
                    if wire is not None:
                        modelled = modelled.removesuffix(WIRE_TAGS[wire])
                    itemsize = args.dtype.itemsize
                    row.predicted_us = predicted_us(
                        modelled, row.count * itemsize, comm, params, wire, itemsize, args.collective
                    )
                passes[-1].append(row)
                if rank == 0:
                    progress.clear()
                    print(format_row(row, width), flush=True)
                progress.step(f"{algorithm} {format_size(nbytes)}B")
    rows = median_rows(passes)
    if rank == 0 and args.passes > 1:
        progress.clear()
        print(f"# per row, the pass with the median time of {args.passes}", flush=True)
        print("\n".join(format_row(row, width) for row in rows), flush=True)

    summary = summarize(rows, bare)
    every = [r for one in passes for r in one]
    failed = any(r.wrong for r in every) or not all(r.bytes_match for r in every)
    if dev.name != "gpu":  # rank 0 alone, the others asleep: the memory bandwidth one process gets
        header["copyto_GBps"] = copyto_GBps(comm, max(sizes))
    if rank == 0:
        progress.clear()
        print(format_footer(rows, summary, bare), flush=True)
        print(ceiling_line(header, rows), flush=True)
        if args.json:
            write_json(args.json, header, rows, summary, passes)
        if args.plot:
            plot(args.plot, header, rows)
        if args.tune:  # auto chooses by each rank's input: the all-gather's is a G-th of the row's size
            by_input = [dataclasses.replace(r, size=r.count * args.dtype.itemsize) for r in rows]
            path, key = write_tuning(
                by_input,
                size=comm.Get_size(),
                header=header,
                known=algorithms.choices(args.collective),
                in_place=args.in_place,
                collective=args.collective,
            )
            print(f"# tuning for {comm.Get_size()} ranks (table {key}) written to {path}", flush=True)
        if failed:
            sys.stderr.write(
                "hpcring.bench: FAILED: wrong elements or bytes sent off the formula (see table)\n"
            )
    return WRONG_EXIT if failed else 0
