"""Median of several bench runs: one table of busbw per (size, algorithm), and ratios to the baseline.

    for i in 1 2 3 4 5; do mpiexec -n 4 python -m hpcring.bench --json run$i.json ...; done
    python tools/median_of_runs.py run*.json

On a shared, noisy machine one run's rows jump by 2x from minute to minute; the median
over separate runs (each itself a median over iterations) is what the docs quote. Where
the runs measured np.copyto (the bench does on the CPU), also the ring's busbw at the
largest size against it; where they ran `auto`, at how many sizes it is within 10% of the best.
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
    for path in paths:
        with open(path) as stream:
            report = json.load(stream)
        ranks.add(report["header"]["ranks"])
        bare = report["header"].get("baseline", bare)
        ring = [r for r in report["rows"] if r["algorithm"] == "ring"]
        if ring and report["header"].get("copyto_GBps"):
            top = max(ring, key=lambda r: r["size"])
            copyto.append((top["size"], top["busbw"], report["header"]["copyto_GBps"]))
        for row in report["rows"]:
            name = f"auto:{row['chosen']}" if row.get("chosen") else row["algorithm"]
            key = (row["size"], name.split(":")[0])
            times[key].append(row["time_us"])
            busbw[key].append(row["busbw"])
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
