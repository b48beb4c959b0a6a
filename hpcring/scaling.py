"""`python -m hpcring.scaling DIR`: one scaling table and plot from many benchmark runs.

Reads every ``bench.json`` that `python -m hpcring.bench --json` wrote under DIR (the
layout jobs/scaling.sh produces: one folder per job), groups the rows by algorithm and
message size, and shows how time and bus bandwidth change with the number of ranks.
Writes ``scaling.txt`` (the table), ``scaling.json`` and, with matplotlib, ``scaling.png``
into DIR. No MPI: it runs anywhere, e.g. as the last job of a sweep or on a laptop.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Point:
    """One (algorithm, size) row of one run."""

    ranks: int
    hosts: int
    algorithm: str
    size: int
    time_us: float
    busbw: float
    wrong: int | None
    source: str


def load(directory: Path) -> tuple[list[Point], list[str]]:
    """Every row of every bench.json under ``directory``; a later run at the same rank count wins.

    Returns the points and one warning per file skipped or run superseded.
    """
    warnings: list[str] = []
    runs: dict[int, tuple[float, Path, dict[str, Any]]] = {}
    for path in sorted(directory.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
            ranks = int(data["header"]["ranks"])
            if not isinstance(data["rows"], list):
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue  # env.json, scaling.json and anything else that is not a bench result
        mtime = path.stat().st_mtime
        if ranks in runs:
            kept = runs[ranks]
            if kept[0] > mtime:
                warnings.append(f"{ranks} ranks: using {kept[1]}, not the older {path}")
                continue
            warnings.append(f"{ranks} ranks: using {path}, not the older {kept[1]}")
        runs[ranks] = (mtime, path, data)
    points = [
        Point(
            ranks=ranks,
            hosts=int(data["header"].get("hosts", 1)),
            algorithm=row["algorithm"],
            size=int(row["size"]),
            time_us=float(row["time_us"]),
            busbw=float(row["busbw"]),
            wrong=row.get("wrong"),
            source=str(path.relative_to(directory)),
        )
        for ranks, (_, path, data) in sorted(runs.items())
        for row in data["rows"]
    ]
    return points, warnings


def table(points: list[Point]) -> str:
    """Time (us) and busbw (GB/s) per (size, algorithm), one column per rank count."""
    ranks = sorted({p.ranks for p in points})
    by_key = {(p.size, p.algorithm, p.ranks): p for p in points}
    keys = sorted({(p.size, p.algorithm) for p in points})
    hosts = {p.ranks: p.hosts for p in points}
    width = max([9, *(len(p.algorithm) for p in points)])  # "MPI_Allreduce", the bare row, is 13
    head = f"{'size (B)':>12} {'algorithm':>{width}} |" + "".join(f"{r:>10}" for r in ranks) + " |"
    head += "".join(f"{r:>9}" for r in ranks)
    lines = [
        "# time per all-reduce (us, left) and busbw (GB/s, right) by number of ranks",
        "# hosts: " + ", ".join(f"{r} ranks on {hosts[r]}" for r in ranks),
        head,
    ]
    for size, algorithm in keys:
        cells = [by_key.get((size, algorithm, r)) for r in ranks]
        times = "".join(f"{c.time_us:>10.1f}" if c else f"{'-':>10}" for c in cells)
        busbw = "".join(f"{c.busbw:>9.3f}" if c else f"{'-':>9}" for c in cells)
        flag = "  WRONG" if any(c and c.wrong for c in cells) else ""
        lines.append(f"{size:>12} {algorithm:>{width}} |{times} |{busbw}{flag}")
    return "\n".join(lines)


def _size_label(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g} {unit}"
    return f"{nbytes} B"


def plot(points: list[Point], path: Path) -> None:
    """Left: time vs ranks at the smallest size (latency); right: busbw vs ranks at the largest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({p.size for p in points})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for axis, size, value, label in (
        (left, sizes[0], "time_us", "time per all-reduce (us)"),
        (right, sizes[-1], "busbw", "bus bandwidth (GB/s)"),
    ):
        for algorithm in sorted({p.algorithm for p in points}):
            line = sorted(
                (p.ranks, getattr(p, value)) for p in points if p.size == size and p.algorithm == algorithm
            )
            if line:
                axis.plot(*zip(*line, strict=True), marker="o", label=algorithm)
        axis.set_xscale("log", base=2)
        ranks = sorted({p.ranks for p in points})
        axis.set_xticks(ranks, [str(r) for r in ranks])  # rank counts, not powers of two
        axis.set_xlabel("ranks")
        axis.set_ylabel(label)
        axis.set_title(_size_label(size))
        axis.grid(True, alpha=0.3)
        axis.legend()
    fig.suptitle("hpcring all-reduce scaling")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcring.scaling", description=__doc__.splitlines()[0])
    parser.add_argument(
        "directory", type=Path, help="folder with the runs' bench.json files (searched recursively)"
    )
    parser.add_argument("--no-plot", action="store_true", help="skip scaling.png")
    args = parser.parse_args(argv)
    points, warnings = load(args.directory)
    for warning in warnings:
        print(f"hpcring.scaling: {warning}", file=sys.stderr)
    if not points:
        print(f"hpcring.scaling: no bench.json with rows under {args.directory}", file=sys.stderr)
        return 1
    text = table(points)
    print(text)
    (args.directory / "scaling.txt").write_text(text + "\n")
    (args.directory / "scaling.json").write_text(json.dumps([asdict(p) for p in points], indent=1))
    if not args.no_plot:
        try:
            plot(points, args.directory / "scaling.png")
        except ImportError:
            print(
                "hpcring.scaling: no matplotlib, no scaling.png "
                "(pip install -e '.[bench]' in hpcring's clone)",
                file=sys.stderr,
            )
    return 1 if any(p.wrong for p in points) else 0


if __name__ == "__main__":
    sys.exit(main())
