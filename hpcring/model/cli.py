"""The command line of ``python -m hpcring.model``: predictions without MPI, calibration and
validation under mpiexec.

Only rank 0 prints; a user error is one line on stderr and exit status 2 on every rank.
``--collective`` predicts that collective's algorithms, sizes and busbw as the bench reports
them (nccl-tests'); calibration and validation time all-reduces.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import units
from ..algorithms import ALLREDUCE, COLLECTIVES
from ..units import busbw, busbw_formula, collective_title, format_size, input_bytes
from .calibrate import calibrate, check_array, runnable, validate
from .costs import (
    AGREEMENT_BYTES,
    BCAST_FORMS,
    DEFAULT_SOFTWARE,
    GB,
    NO_SOFTWARE,
    PRESETS,
    Link,
    ModelError,
    Nodes,
    Preset,
    Software,
    log2_floor,
    modelled,
    predict,
    spec_of,
)
from .params import default_path, keep_busy, load_params, save_params


def parse_size(text: str) -> int:
    """'100M' -> 104857600 (`hpcring.units.parse_size`, binary units as in nccl-tests), or the
    model's one-line ModelError for a size that is not a positive whole number of bytes."""
    try:
        nbytes = units.parse_size(text)
    except ValueError as error:
        if text.strip().startswith("-"):
            raise ModelError(f"sizes must be positive, got {text!r}") from None
        if "whole number" in str(error):  # a fraction of a byte (0.3, 1.5): refused, not truncated
            raise ModelError(f"bad size {text!r}: not a whole number of bytes") from None
        raise ModelError(f"bad size {text!r}: use a number with an optional K, M, G or T") from None
    if not nbytes > 0:
        raise ModelError(f"sizes must be positive, got {text!r}")
    return nbytes


def parse_ranks(text: str) -> list[int]:
    try:
        ranks = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise ModelError(f"bad rank list {text!r}: use integers like 8,64,512") from None
    if not ranks or any(r <= 0 for r in ranks):
        raise ModelError(f"ranks must be positive integers, got {text!r}")
    return ranks


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise ModelError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m hpcring.model",
        description="Alpha-beta-gamma cost model of hpcring's algorithms (all-reduce by default).",
        epilog="Link presets (assumptions, see docs/scaling.md): "
        + "; ".join(f"{k}: {v.description}" for k, v in PRESETS.items()),
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--calibrate", action="store_true", help="measure alpha, beta, gamma (under mpiexec -n 2)"
    )
    mode.add_argument("--validate", action="store_true", help="measured vs predicted (under mpiexec)")
    parser.add_argument("--output", help="calibration file to write (default: $HPCRING_MODEL or ~/.cache)")
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (tests)")
    parser.add_argument("--array", default="numpy", help="array module gamma is measured with: numpy, cupy")
    parser.add_argument("--params", help="calibration file to read (default: $HPCRING_MODEL or ~/.cache)")
    parser.add_argument("--ranks", default="8,64,512,1000", help="rank counts, e.g. 8,64,512,1000")
    parser.add_argument(
        "--bytes",
        default="100M,1G",
        help="sizes, e.g. 1M,100M,1G (K/M/G = 1024^k): each rank's buffer; with --collective, nccl-tests' "
        "size, the whole buffer (an all-gather's output, G times each rank's input)",
    )
    parser.add_argument(
        "--collective",
        choices=COLLECTIVES,
        default=ALLREDUCE,
        help="predict this collective's algorithms (default allreduce; --validate times all-reduces)",
    )
    parser.add_argument("--sizes", default="1M,4M,16M", help="--validate: sizes to time")
    parser.add_argument("--iterations", type=int, default=10, help="--validate: timed iterations per point")
    parser.add_argument("--algorithms", help="comma-separated (default: all that apply)")
    parser.add_argument("--link", help=f"interconnect preset: {', '.join(PRESETS)} (default: calibrated)")
    parser.add_argument("--alpha", type=float, help="seconds per message (overrides the link)")
    parser.add_argument("--beta", type=float, help="seconds per byte (overrides the link)")
    parser.add_argument("--gamma", type=float, help="seconds per byte reduced")
    parser.add_argument("--gpus-per-node", type=int, help="ranks per node: predict on a machine of nodes")
    parser.add_argument(
        "--intra",
        default=None,
        help="preset of the link inside a node (default: the calibrated one when the calibration "
        "spanned nodes, else nvlink4)",
    )
    parser.add_argument("--nic", choices=("shared", "per-gpu"), default="per-gpu", help="NICs per node")
    parser.add_argument(
        "--wire",
        choices=("bfloat16", "float16"),
        help="also predict each algorithm but mpi with allreduce(wire=WIRE) on float32: rows ALGORITHM+WIRE",
    )
    parser.add_argument(
        "--bcast", choices=BCAST_FORMS, default="binomial", help="ps: how MPI_Bcast is modelled"
    )
    parser.add_argument(
        "--software",
        default="auto",
        metavar="auto|default|none|STEP_US[,CALL_US]",
        help="hpcring's own cost on top of the network's: us per message step of its algorithms "
        "and us per checked call (plus the agreement's collective, priced on the link); auto: "
        "the calibration file's figures, else default (measured with the compiled core, "
        "docs/scaling.md); none: the network alone",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="draw time vs ranks")
    return parser


def _rank_from_env() -> int:
    """This process's rank without initializing MPI (predictions must not need mpiexec)."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ModelError(f"unknown link preset {name!r}; choose one of {', '.join(PRESETS)}") from None


def _positive(name: str, value: float | None) -> None:
    if value is not None and not 0 < value < math.inf:
        raise ModelError(f"--{name} must be a positive number, got {value!r}")


def _machine(args: argparse.Namespace) -> tuple[Link | Nodes, float, str]:
    """The machine the predictions are for, its gamma, and a line that says where they come from."""
    for name in ("alpha", "beta", "gamma"):
        _positive(name, getattr(args, name))
    calibrated_intra: Link | None = None  # from a calibration across nodes: the link inside one
    if args.link is None and (args.alpha is None or args.beta is None):
        params = load_params(args.params)
        inter = params.inter
        if inter is not None:  # calibrated across nodes: the predictions' network is that link
            calibrated_intra = params.link
            where_from = f"calibrated between nodes, {params.meta['path']}"
            base = Preset(inter.alpha, inter.beta, params.gamma, where_from)
        else:
            base = Preset(
                params.alpha, params.beta, params.gamma, f"calibrated, {params.meta['path']}, a core per rank"
            )
    else:
        base = _preset(args.link) if args.link else Preset(args.alpha, args.beta, 1e-12, "explicit")
    link = Link(args.alpha or base.alpha, args.beta or base.beta)
    gamma = args.gamma or base.gamma
    where = f"{base.description}: alpha {link.alpha * 1e6:.3g} us, {1 / link.beta / GB:.3g} GB/s"
    if args.gpus_per_node is None:
        return link, gamma, where + f", gamma {1 / gamma / GB:.3g} GB/s reduced"
    if args.gpus_per_node <= 0:
        raise ModelError(f"--gpus-per-node must be positive, got {args.gpus_per_node}")
    if args.intra is None and calibrated_intra is not None:
        inside, described = (
            calibrated_intra,
            (
                f"the calibrated link inside a node ({calibrated_intra.alpha * 1e6:.3g} us, "
                f"{1 / calibrated_intra.beta / GB:.3g} GB/s)"
            ),
        )
    else:
        intra = _preset(args.intra or "nvlink4")
        inside, described = Link(intra.alpha, intra.beta), intra.description
    nodes = Nodes(args.gpus_per_node, inside, link, args.nic == "shared")
    where = (
        f"{args.gpus_per_node} ranks per node on {described}; between nodes {where}, "
        f"NIC {args.nic}; gamma {1 / gamma / GB:.3g} GB/s reduced"
    )
    return nodes, gamma, where


def _software(args: argparse.Namespace) -> tuple[Software, str]:
    """hpcring's software the predictions count (--software), and a line that says which."""
    default = DEFAULT_SOFTWARE, "the default: the compiled core's, docs/scaling.md"
    match args.software.strip():
        case "none":
            return NO_SOFTWARE, "software: none (the network alone, as unchecked)"
        case "default":
            software, source = default
        case "auto":  # the calibration file's, where it has them
            software, source = default
            try:
                found = load_params(args.params)
            except ModelError:
                if args.params is not None or default_path().exists():
                    raise  # a file that is there but cannot be read is an error, not a default
                found = None
            if found is not None and found.software is not None:
                ranks, software = found.software
                source = f"calibrated at {ranks} ranks, {found.meta.get('core', '?')} core"
        case text:
            try:
                figures = [float(v) for v in text.split(",")]
            except ValueError:
                figures = []
            if not 1 <= len(figures) <= 2 or not all(0 <= v < math.inf for v in figures):
                raise ModelError(
                    f"--software {args.software!r}: use auto, default, none, or STEP_US[,CALL_US] "
                    "(numbers >= 0)"
                )
            software, source = Software(figures[0] * 1e-6, (figures[1:] or [0.0])[0] * 1e-6), "given"
    return software, (
        f"software: {software.step * 1e6:.3g} us a step, {software.call * 1e6:.3g} us a call and the "
        f"agreement's {AGREEMENT_BYTES} B all-reduce ({source})"
    )


def _names(args: argparse.Namespace, known: Sequence[str]) -> list[str]:
    if args.algorithms is None:
        return list(known)
    names = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    for name in names:
        if name not in known:
            raise ModelError(f"unknown algorithm {name!r}; choose one of {', '.join(known)}")
    return names


def _predictions(args: argparse.Namespace, out: Any) -> None:
    machine, gamma, where = _machine(args)
    ranks, sizes = parse_ranks(args.ranks), [parse_size(s) for s in args.bytes.split(",") if s.strip()]
    if not sizes:
        raise ModelError("--bytes needs at least one size")
    collective = args.collective
    if args.wire and collective != ALLREDUCE:
        raise ModelError(f"--wire: all-reduce predictions only (hpcring.{collective} has no wire=)")
    known = [*modelled(collective), *(modelled(collective, True) if isinstance(machine, Nodes) else ())]
    algorithms = _names(args, known)
    if isinstance(machine, Nodes):
        for p in ranks:
            if p % machine.per_node:
                raise ModelError(f"{p} ranks do not fill nodes of {machine.per_node} (--gpus-per-node)")
    for p in ranks:
        for nbytes in sizes:
            if input_bytes(nbytes, p, collective) == 0:
                raise ModelError(f"--bytes {nbytes} gathered from {p} ranks: less than a byte from each")
    software, counted = _software(args)
    print(f"# hpcring.model: {where}; ps Bcast {args.bcast}; {counted}", file=out)
    if collective != ALLREDUCE:  # what a row's size and busbw are, as the bench's
        gathered = input_bytes(2, 2, collective) == 1
        what = "the gathered output, G inputs" if gathered else "each rank's input"
        print(
            f"# {collective_title(collective)}: size = the whole buffer, as nccl-tests ({what}); "
            f"busbw = algbw * {busbw_formula(collective)}",
            file=out,
        )
    print(
        f"# {'ranks':>6} {'size':>8} {'algorithm':>13} {'time (us)':>14} {'algbw (GB/s)':>13} "
        f"{'busbw (GB/s)':>13}",
        file=out,
    )
    for p in ranks:
        for nbytes in sizes:
            wired = [(a, None) for a in algorithms]
            if args.wire:  # each algorithm's wire row right after its plain one
                wired = [
                    (a, w)
                    for a in algorithms
                    for w in (None, args.wire)
                    if w is None or spec_of(a).narrowings
                ]
            mine = input_bytes(nbytes, p, collective)  # what each rank passes in: what predict takes
            for algorithm, wire in wired:
                t = predict(
                    algorithm,
                    mine,
                    p,
                    machine,
                    gamma=gamma,
                    bcast=args.bcast,
                    wire=wire,
                    collective=collective,
                    software=software,
                )
                name = algorithm if wire is None else f"{algorithm}+{wire}"
                algbw = f"{nbytes / t / GB:13.3f}" if t > 0 else f"{'-':>13}"
                bus = f"{busbw(nbytes, p, t, collective) / GB:13.3f}" if t > 0 else f"{'-':>13}"
                print(
                    f"  {p:>6} {format_size(nbytes):>8} {name:>13} {t * 1e6:14.1f} {algbw} {bus}",
                    file=out,
                )
    if args.plot and out is sys.stdout:
        _plot(args.plot, machine, gamma, ranks, sizes, algorithms, args.bcast, where, collective, software)
        print(f"# plot: {args.plot}", file=out)


def _plot(
    path: str,
    machine: Link | Nodes,
    gamma: float,
    ranks: list[int],
    sizes: list[int],
    algorithms: list[str],
    bcast: str,
    where: str,
    collective: str = ALLREDUCE,
    software: Software | None = None,
) -> None:
    """Time vs ranks, log-log: ring and rabenseifner flatten out, ps and naive climb linearly."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = machine.per_node if isinstance(machine, Nodes) else 1
    top = max(ranks)
    grid = sorted({*ranks, *(round(2 ** (k / 4)) * step for k in range(0, 4 * 14))})
    grid = [p for p in grid if step <= p <= top and p % step == 0]
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = ["-", "--", ":", "-."]
    for i, nbytes in enumerate(sizes):
        for j, algorithm in enumerate(a for a in algorithms if not spec_of(a, collective).modelled_as):
            times = [
                predict(
                    algorithm,
                    max(1, input_bytes(nbytes, p, collective)),
                    p,
                    machine,
                    gamma=gamma,
                    bcast=bcast,
                    collective=collective,
                    software=software,
                )
                for p in grid
            ]
            ax.plot(
                grid,
                times,
                styles[i % len(styles)],
                color=f"C{j}",
                label=f"{algorithm}, {format_size(nbytes)}{'iB' if nbytes >= 1024 else ' B'}",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ranks")
    ax.set_ylabel(f"predicted time per {collective_title(collective)} (s)")
    ax.set_title(textwrap.fill(where, 110), fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _mpi_main(args: argparse.Namespace) -> int:
    """--calibrate and --validate: collective; every rank returns the same exit code."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    # What each rank can check alone is checked, and agreed on, before any collective: a rank
    # that fails it must not leave the others waiting in the measurements.
    problem: str | None = None
    try:
        if args.calibrate:
            check_array(args.array)
        else:
            params = load_params(args.params)
            names = _names(args, runnable())
            sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
            if args.iterations <= 0:
                raise ModelError(f"--iterations must be positive, got {args.iterations}")
    except ModelError as error:
        problem = str(error)
    if _first_problem(comm, problem):
        return 2
    try:
        if args.calibrate:
            output = Path(args.output).expanduser() if args.output else default_path()
            params = calibrate(comm, quick=args.quick, array=args.array)
            if rank == 0:
                params = keep_busy(params, output)
                save_params(params, output)
                print(
                    f"# calibrated on {comm.Get_size()} ranks ({params.meta['host']}, load "
                    f"{' '.join(f'{x:.2f}' for x in params.meta['load_average'])}, "
                    f"{params.meta['core']} core): alpha "
                    f"{params.alpha * 1e6:.3g} us, beta {params.beta * 1e9:.4g} ns/B "
                    f"({1 / params.beta / GB:.3g} GB/s), gamma {params.gamma * 1e9:.4g} ns/B "
                    f"({1 / params.gamma / GB:.3g} GB/s)"
                    + (
                        f"; between nodes alpha {params.inter_alpha * 1e6:.3g} us, "
                        f"{1 / params.inter_beta / GB:.3g} GB/s both ways at once "
                        f"({1 / params.meta['inter_beta_one_way'] / GB:.3g} GB/s one way)"
                        if params.inter_beta
                        else ""
                    )
                    + f" -> {output}"
                )
                for p, b in sorted(params.busy.items()):
                    print(
                        f"#   all {p} ranks busy: alpha {b.alpha * 1e6:.3g} us, "
                        f"beta {b.beta * 1e9:.4g} ns/B ({1 / b.beta / GB:.3g} GB/s), "
                        f"gamma {b.gamma * 1e9:.4g} ns/B ({1 / b.gamma / GB:.3g} GB/s); a call "
                        f"{b.call * 1e6:.3g} us, {b.cold * 1e6:.3g} us more with cold caches"
                        + (
                            f"; hpcring's software {b.step * 1e6:.3g} us a step, {b.overhead * 1e6:.3g} us "
                            "a checked call besides the agreement's collective"
                            if b.step is not None and b.overhead is not None
                            else ""
                        )
                    )
                for p, b in sorted(params.partial.items()):
                    print(
                        f"#   {1 << log2_floor(p - 1)} of {p} ranks busy, the rest waiting: alpha "
                        f"{b.alpha * 1e6:.3g} us, beta {b.beta * 1e9:.4g} ns/B ({1 / b.beta / GB:.3g} GB/s), "
                        f"gamma {b.gamma * 1e9:.4g} ns/B ({1 / b.gamma / GB:.3g} GB/s)"
                    )
        else:
            rows = validate(comm, params, sizes, names, args.iterations, args.bcast)
            if rank == 0:
                print(
                    f"# validate: {comm.Get_size()} ranks, {os.cpu_count()} cores, load "
                    f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; median of {args.iterations}, "
                    f"max over ranks; ps Bcast {args.bcast}; params {params.meta['path']}"
                )
                print(
                    f"# {'ranks':>5} {'size':>6} {'algorithm':>12} {'predicted (us)':>15} "
                    f"{'measured (us)':>14} {'ratio':>6}"
                )
                for r in rows:
                    flag = "" if 0.7 <= r["ratio"] <= 1.3 else "  off by >30%"
                    print(
                        f"  {r['ranks']:>5} {format_size(r['bytes']):>6} {r['algorithm']:>12} "
                        f"{r['predicted'] * 1e6:15.0f} {r['measured'] * 1e6:14.0f} {r['ratio']:6.2f}{flag}"
                    )
    except ModelError as error:
        problem = str(error)
    # Errors found on one rank (a file only rank 0 wrote, say) still give every rank exit 2.
    return 2 if _first_problem(comm, problem) else 0


def _first_problem(comm: Any, problem: str | None) -> bool:
    """Collective: whether any rank has a problem; rank 0 prints the first one."""
    first = next((p for p in comm.allgather(problem) if p is not None), None)
    if first is not None and comm.Get_rank() == 0:
        print(f"python -m hpcring.model: error: {first}", file=sys.stderr)
    return first is not None


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 for any user error, after one line on stderr)."""
    try:
        args = _parser().parse_args(argv)
        if args.calibrate or args.validate:
            if args.collective != ALLREDUCE:
                raise ModelError("--collective: for predictions; --calibrate and --validate time all-reduces")
            return _mpi_main(args)
        # Every rank checks the arguments (same exit code everywhere); only rank 0 prints.
        _predictions(args, sys.stdout if _rank_from_env() == 0 else io.StringIO())
        return 0
    except ModelError as error:
        if _rank_from_env() == 0:
            print(f"python -m hpcring.model: error: {error}", file=sys.stderr)
        return 2
