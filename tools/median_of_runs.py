"""Median of several bench runs: one table of busbw per (size, algorithm), and ratios to the baseline.

    for i in 1 2 3 4 5; do mpiexec -n 4 python -m hpcring.bench --json run$i.json ...; done
    python tools/median_of_runs.py run*.json

On a shared, noisy machine one run's rows jump by 2x from minute to minute; the median
over separate runs (each itself a median over iterations) is what the docs quote. Where
the runs measured np.copyto (the bench does on the CPU), also the ring's busbw at the
largest size against it; where they ran `auto`, at how many sizes it is within 10% of the best:
by the medians over runs, and by each run's own ratio (its rows measured side by side, as
`--interleave` measures them), the median over runs.
The baseline is the bare library call's row (the header's `baseline`: MPI_Allreduce, or
MPI_Alltoall for --collective alltoall) where the runs have it, else `mpi` (older runs).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

BARE = "MPI_Allreduce"  # hpcring.bench.measure.BARE, spelled out: this script reads JSON, not hpcring


def main(paths: list[str]) -> None:
    times: dict[tuple[int, str], list[float]] = defaultdict(list)
    busbw: dict[tuple[int, str], list[float]] = defaultdict(list)
    ranks = set()
    bare = BARE
    copyto: list[tuple[int, float, float]] = []  # (largest size, ring busbw, np.copyto GB/s) per run
    paired: dict[int, list[float]] = defaultdict(list)  # per size, auto over the best other row, per run
    for path in paths:
        with open(path) as stream:
            report = json.load(stream)
        ranks.add(report["header"]["ranks"])
        bare = report["header"].get("baseline", bare)
        ring = [r for r in report["rows"] if r["algorithm"] == "ring"]
        if ring and report["header"].get("copyto_GBps"):
            top = max(ring, key=lambda r: r["size"])
            copyto.append((top["size"], top["busbw"], report["header"]["copyto_GBps"]))
        run: dict[int, dict[str, float]] = defaultdict(dict)
        for row in report["rows"]:
            name = f"auto:{row['chosen']}" if row.get("chosen") else row["algorithm"]
            key = (row["size"], name.split(":")[0])
            times[key].append(row["time_us"])
            busbw[key].append(row["busbw"])
            run[row["size"]][key[1]] = row["busbw"]
        for size, rows in run.items():
            others = [value for name, value in rows.items() if name != "auto"]
            if "auto" in rows and others and max(others) > 0:
                paired[size].append(rows["auto"] / max(others))
    names = list(dict.fromkeys(name for _, name in times))
    sizes = sorted({size for size, _ in times})
    baseline = bare if bare in names else "mpi"
    print(f"# {len(paths)} runs, ranks {sorted(ranks)}: median busbw (GB/s), and x {baseline}")
    print(f"# {'size':>10} " + " ".join(f"{n:>18}" for n in names))
    for size in sizes:
        base = statistics.median(busbw[(size, baseline)]) if (size, baseline) in busbw else None
        cells = []
        for name in names:
            if (size, name) not in busbw:
                cells.append(f"{'-':>18}")
                continue
            value = statistics.median(busbw[(size, name)])
            ratio = f" ({value / base:4.2f}x)" if base else ""
            cells.append(f"{value:>10.3f}{ratio:>8}")
        print(f"  {size:>10} " + " ".join(cells))
    if "auto" in names:
        print(_auto_verdict(busbw, sizes, bare))
    if paired and len(paths) > 1:  # the ratio in each run first (rows measured side by side), then the median
        ratios = {size: statistics.median(values) for size, values in sorted(paired.items())}
        hits = sum(ratio >= 0.9 for ratio in ratios.values())
        print(
            f"# auto over the best other row in the same run, median of {len(paths)} runs: within 10% at "
            f"{hits} of {len(ratios)} sizes ("
            + ", ".join(f"{size}: {ratio:.2f}" for size, ratio in ratios.items())
            + f"; lowest single run {min(min(v) for v in paired.values()):.2f})"
        )
    if copyto:
        ratios = [ring / bandwidth for _, ring, bandwidth in copyto]
        print(
            f"# ring at {copyto[0][0]} B against one process's np.copyto of the same size, same run: "
            f"median {statistics.median(ratios):.3f}x (runs: {', '.join(f'{r:.3f}' for r in ratios)}; "
            f"np.copyto {statistics.median(b for _, _, b in copyto):.2f} GB/s)"
        )


def _auto_verdict(
    busbw: dict[tuple[int, str], list[float]], sizes: list[int], bare: str = BARE, within: float = 0.9
) -> str:
    """How often auto's median busbw is within 10% of the best other row's median (the
    Performance issue's target; the bare library call among them where the runs have it), and
    where it is furthest behind."""
    ratios = []
    for size in sizes:
        others = [statistics.median(v) for (s, name), v in busbw.items() if s == size and name != "auto"]
        if (size, "auto") in busbw and others:
            ratios.append((statistics.median(busbw[(size, "auto")]) / max(others), size))
    hits = sum(ratio >= within for ratio, _ in ratios)
    rivals = f"algorithm or {bare}" if any(name == bare for _, name in busbw) else "algorithm"
    worst, where = min(ratios)
    return (
        f"# auto within {1 - within:.0%} of the best {rivals} at {hits} of {len(ratios)} sizes "
        f"(lowest {worst:.2f}x, at {where} B)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
