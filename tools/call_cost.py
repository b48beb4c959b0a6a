"""Per-call cost of hpcring against the bare library call, same buffers, same run.

    mpiexec -n 2 python tools/call_cost.py [--sizes 8,4K,64K,1M] [-d float32,float64] [--in-place] [--fresh]
    mpiexec -n 2 python tools/call_cost.py --late-rank 1 --late-us 300
    mpiexec -n 2 python tools/call_cost.py --sizes 8,4K --rows wrap,wrap:nocheck,wrap:typed,bare:typed
    python tools/call_cost.py --python-only          # one rank: hpcring's dispatch against np.copyto

`bare` is ``comm.Allreduce`` on the user's NumPy buffers straight through mpi4py (MPI.IN_PLACE
in place), nothing of hpcring between; every other row goes through ``hpcring.allreduce``
(``ALG:nocheck`` is ``check=False``; ``plan:ALG`` is ``hpcring.plan`` where the tree has it).
``wrap`` is ``comm.Allreduce`` on ``hpcring.Intracomm(MPI.COMM_WORLD)`` (its defaults), ``wrap:nocheck``
with ``check=False``, ``wrap:typed`` the typed spec ``[buf, MPI.FLOAT]`` (``[buf, MPI.DOUBLE]``)
through it, and ``bare:typed`` that spec on the plain communicator: what a drop-in costs.
Each pass: a barrier, N calls timed on every rank, the max over ranks of elapsed/N. Variants
are interleaved pass by pass so machine noise hits them alike; the median over passes is
reported, with min and max in the JSON. hpcring comes from PYTHONPATH, so alternate runs on
two source trees compare a change before and after. Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

import hpcring
from hpcring.units import format_size, parse_size

DEFAULT_SIZES = "8,4K,64K,1M"
DEFAULT_ROWS = "mpi:nocheck,mpi,auto,ring"
PASS_SECONDS = 0.5  # N shrinks for large sizes so one pass of one variant stays under this
Call = Callable[[], object]


@dataclass
class Variant:
    """One column: a name and how to make its call on given buffers."""

    name: str
    make: Callable[[np.ndarray, np.ndarray | None], Call]


class Parser(argparse.ArgumentParser):
    """Help and errors printed by rank 0 only; every rank exits with the same status."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if MPI.COMM_WORLD.rank == 0:
            super()._print_message(message, file)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--sizes", help=f"comma-separated sizes in bytes, e.g. 8,4K,1M (default {DEFAULT_SIZES})")
    add("-b", "--minbytes", help="sweep from this size (default 8) ...")
    add("-e", "--maxbytes", help="... to this size (default 1M) ...")
    add("-f", "--stepfactor", type=float, default=2.0, help="... by this factor (default 2)")
    add("-d", "--dtype", default="float32", help="float32, float64 or both, comma-separated")
    add("--in-place", action="store_true", help="in place (default: out of place)")
    add(
        "--fresh",
        action="store_true",
        help="write the input before each call, untimed, as a code's data is written before it is "
        "reduced (default: the same input every call; in place, the last call's result)",
    )
    add("--rows", default=DEFAULT_ROWS, help=f"hpcring variants after bare (default {DEFAULT_ROWS})")
    add("--passes", type=int, default=5, help="passes per variant (default 5)")
    add("--iters", type=int, default=200, help="calls per pass, fewer for large sizes (default 200)")
    add("--warmup", type=int, default=20, help="untimed calls per variant first (default 20)")
    add("--late-rank", type=int, help="this rank spins --late-us before every call")
    add("--late-us", type=float, default=0.0, help="microseconds the late rank spins")
    add("--python-only", action="store_true", help="one rank: hpcring's dispatch against np.copyto")
    add("--json", help="write every row (per-pass figures, min, median, max) to this file")
    args = parser.parse_args(argv)
    try:
        args.sizes = sizes(args)
        args.dtypes = [np.dtype(name) for name in args.dtype.split(",")]
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    if any(d not in (np.float32, np.float64) for d in args.dtypes):
        parser.error(f"-d: choose float32 and/or float64, got {args.dtype!r}")
    if args.passes < 1 or args.iters < 1 or args.warmup < 0 or args.stepfactor <= 1:
        parser.error("--passes and --iters must be >= 1, --warmup >= 0, -f > 1")
    try:
        args.variants = variants(args.rows, args.python_only)
    except ValueError as error:
        parser.error(str(error))
    size = MPI.COMM_WORLD.size
    if args.late_rank is not None and not 0 <= args.late_rank < size:
        parser.error(f"--late-rank must be a rank of 0..{size - 1}, got {args.late_rank}")
    if args.python_only and size != 1:
        parser.error("--python-only measures at one rank: run it without mpiexec (or with -n 1)")
    return args


def sizes(args: argparse.Namespace) -> list[int]:
    """The sizes to run: --sizes, else a -b/-e/-f sweep, else the default list."""
    if args.sizes and (args.minbytes or args.maxbytes):
        raise ValueError("give --sizes or -b/-e/-f, not both")
    if args.sizes or not (args.minbytes or args.maxbytes):
        return [parse_size(s) for s in (args.sizes or DEFAULT_SIZES).split(",")]
    low, high = parse_size(args.minbytes or "8"), parse_size(args.maxbytes or "1M")
    out: list[int] = []
    nbytes = float(max(low, 1))
    while nbytes <= high:
        if int(nbytes) not in out:
            out.append(int(nbytes))
        nbytes *= args.stepfactor
    return out


def variants(rows: str, python_only: bool) -> list[Variant]:
    """The baseline (bare Allreduce, or np.copyto for --python-only) and then each of ``rows``."""
    comm = MPI.COMM_WORLD

    def bare(x: np.ndarray, out: np.ndarray | None) -> Call:
        if python_only:
            dst = x if out is None else out
            return lambda: np.copyto(dst, x)
        if out is None:
            return lambda: comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        return lambda: comm.Allreduce(x, out, op=MPI.SUM)

    def through(algorithm: str, check: bool) -> Callable[[np.ndarray, np.ndarray | None], Call]:
        def make(x: np.ndarray, out: np.ndarray | None) -> Call:
            return lambda: hpcring.allreduce(x, algorithm=algorithm, comm=comm, out=out, check=check)

        return make

    def planned(algorithm: str) -> Callable[[np.ndarray, np.ndarray | None], Call]:
        def make(x: np.ndarray, out: np.ndarray | None) -> Call:
            return hpcring.plan(x, op="sum", algorithm=algorithm, comm=comm, out=out)

        return make

    def dropin(spec: str) -> Callable[[np.ndarray, np.ndarray | None], Call]:
        """The drop-in communicator (``wrap...``), or the typed spec on the plain one (``bare:typed``)."""
        head, *words = spec.split(":")
        known = [["typed"]] if head == "bare" else [[], ["nocheck"], ["typed"], ["typed", "nocheck"]]
        if words not in known:
            raise ValueError(f"--rows {spec}: use wrap[:typed][:nocheck] or bare:typed")
        on = comm if head == "bare" else hpcring.Intracomm(comm, check="nocheck" not in words)

        def make(x: np.ndarray, out: np.ndarray | None) -> Call:
            typed = "typed" in words
            send = [x, MPI._typedict[x.dtype.char]] if typed else x
            if out is None:
                return lambda: on.Allreduce(MPI.IN_PLACE, send, op=MPI.SUM)
            recv = [out, MPI._typedict[out.dtype.char]] if typed else out
            return lambda: on.Allreduce(send, recv, op=MPI.SUM)

        return make

    out = [Variant("copyto" if python_only else "bare", bare)]
    for spec in rows.split(","):
        head, _, tail = spec.partition(":")
        if head in ("wrap", "bare"):
            if python_only:
                raise ValueError(f"--rows {spec}: the drop-in runs MPI: not with --python-only")
            out.append(Variant(spec, dropin(spec)))
            continue
        if head == "plan":
            if not hasattr(hpcring, "plan"):
                raise ValueError(f"--rows {spec}: this hpcring ({hpcring.__file__}) has no plan()")
            algorithm, make = tail or "mpi", planned(tail or "mpi")
        else:
            if tail not in ("", "nocheck"):
                raise ValueError(f"--rows {spec}: use ALG, ALG:nocheck or plan:ALG")
            algorithm, make = head, through(head, check=not tail)
        if algorithm not in hpcring.ALGORITHMS:
            known = ", ".join(hpcring.ALGORITHMS)
            raise ValueError(f"--rows {spec}: unknown algorithm {algorithm!r}; choose one of {known}")
        out.append(Variant(spec, make))
    return out


def spin(seconds: float) -> None:
    """Busy-wait: a sleep would wake up late by more than the delays measured here."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def timed(call: Call, calls: int, late: float, fresh: Call | None = None) -> float:
    """Seconds per call of ``calls`` calls on this rank (spinning ``late`` seconds before each);
    with ``fresh``, it runs before each call, untimed (the input written, as a code's is)."""
    if fresh is not None:
        total = 0.0
        for _ in range(calls):
            fresh()
            spin(late)
            start = time.perf_counter()
            call()
            total += time.perf_counter() - start
        return total / calls
    if late:
        start = time.perf_counter()
        for _ in range(calls):
            spin(late)
            call()
    else:
        start = time.perf_counter()
        for _ in range(calls):
            call()
    return (time.perf_counter() - start) / calls


def measure(
    calls: list[Call], args: argparse.Namespace, late: float, fresh: Call | None = None
) -> tuple[int, list[list[float]]]:
    """(N, per-pass seconds per call for each of ``calls``): warm-up, then interleaved passes.

    The warm-up sets up what a first call makes (duplicated communicator, plans, scratch,
    auto's choice) and times the calls to pick N, agreed across ranks (the max), so every
    rank makes the same number of calls. It is timed in two halves and the faster one
    counts, so one descheduling on a busy machine does not cut N.
    """
    comm = MPI.COMM_WORLD
    slowest = 0.0
    half = args.warmup // 2
    for call in calls:
        call()
        if half:
            first, second = timed(call, half, late, fresh), timed(call, args.warmup - half, late, fresh)
            slowest = max(slowest, min(first, second))
    slowest = comm.allreduce(slowest, op=MPI.MAX)
    n = max(1, min(args.iters, int(PASS_SECONDS / slowest))) if slowest > 0 else args.iters
    passes: list[list[float]] = [[] for _ in calls]
    for _ in range(args.passes):
        for call, figures in zip(calls, passes, strict=True):
            comm.Barrier()
            figures.append(comm.allreduce(timed(call, n, late, fresh), op=MPI.MAX))
    return n, passes


def header(args: argparse.Namespace) -> dict[str, Any]:
    """What the run measured, and on what: the table's first lines and the JSON's header."""
    return {
        "ranks": MPI.COMM_WORLD.size,
        "mpi": MPI.Get_library_version().splitlines()[0].split(",")[0].strip(),
        "hpcring": hpcring.__file__,
        "core": hpcring.info()["core"],  # "python" where the compiled core is off or refused (stale)
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "placement": "in place" if args.in_place else "out of place",
        "fresh": args.fresh,
        "passes": args.passes,
        "iters": args.iters,
        "late_rank": args.late_rank,
        "late_us": args.late_us if args.late_rank is not None else 0.0,
        "python_only": args.python_only,
    }


def rows_for(nbytes: int, dtype: np.dtype, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per variant for this size and dtype, all on the same buffers."""
    count = max(1, nbytes // dtype.itemsize)
    x = np.full(count, 0, dtype=dtype)  # written (np.zeros maps the zero page); sums stay finite
    out = None if args.in_place else np.full(count, 0, dtype=dtype)
    late = args.late_us * 1e-6 if MPI.COMM_WORLD.rank == args.late_rank else 0.0
    fresh = None
    if args.fresh:  # the input written before each call (untimed), as a code's data is
        written = x.copy()
        fresh = functools.partial(np.copyto, x, written)
    n, passes = measure([v.make(x, out) for v in args.variants], args, late, fresh)
    base = statistics.median(passes[0]) * 1e6
    rows = []
    for variant, figures in zip(args.variants, passes, strict=True):
        us = [t * 1e6 for t in figures]
        median = statistics.median(us)
        rows.append(
            {
                "size": count * dtype.itemsize,
                "count": count,
                "dtype": dtype.name,
                "variant": variant.name,
                "iters": n,
                "passes_us": us,
                "min_us": min(us),
                "median_us": median,
                "max_us": max(us),
                "ratio": median / base if base > 0 else float("nan"),
                "over_us": median - base,
            }
        )
    return rows


def cell(row: dict[str, Any], delta: bool) -> str:
    """``us (ratio)``, or ``us (+us over the baseline)`` where the difference is what counts."""
    us = row["median_us"]
    text = f"{us:.2f}" if us < 10 else f"{us:.1f}"
    return f"{text} ({row['over_us']:+.2f})" if delta else f"{text} ({row['ratio']:.2f}x)"


def print_table(head: dict[str, Any], rows: list[dict[str, Any]], names: list[str]) -> None:
    """Sizes as rows, variants as columns; the baseline's column is plain microseconds."""
    delta = head["python_only"] or head["late_rank"] is not None
    base = "np.copyto" if head["python_only"] else "bare comm.Allreduce"
    late = ""
    if head["late_rank"] is not None:
        late = f"; rank {head['late_rank']} {head['late_us']:g} us late at every call"
    written = ", input written before each call" if head["fresh"] else ""
    print(
        f"# call_cost: G={head['ranks']}  MPI: {head['mpi']}  hpcring: {head['hpcring']}  "
        f"core: {head['core']}  {head['date']}"
    )
    print(
        f"# sum, {head['placement']}{written}{late}; us per call, median of {head['passes']} passes x N "
        f"calls (max over ranks); in brackets: {'+us over' if delta else 'ratio to'} {base}"
    )
    widths = [max(len(name), 18) for name in names]
    print("#    size     type  iters " + " ".join(n.rjust(w) for n, w in zip(names, widths, strict=True)))
    for at in range(0, len(rows), len(names)):
        group = rows[at : at + len(names)]
        first = group[0]
        cells = [f"{first['median_us']:.2f}" if first["median_us"] < 10 else f"{first['median_us']:.1f}"]
        cells += [cell(row, delta) for row in group[1:]]
        line = f"{format_size(first['size']):>9} {first['dtype']:>8} {first['iters']:>6} "
        print(line + " ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    head = header(args)
    rows = [row for dtype in args.dtypes for nbytes in args.sizes for row in rows_for(nbytes, dtype, args)]
    if MPI.COMM_WORLD.rank != 0:
        return
    print_table(head, rows, [v.name for v in args.variants])
    if args.json:
        with open(args.json, "w") as stream:
            json.dump({"header": head, "rows": rows}, stream, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
