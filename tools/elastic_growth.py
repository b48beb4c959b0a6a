"""The growing-back figures of docs/elastic.md, measured: how long from a rank's death to the first
step at full size again, in parts, and what sending the state to a newcomer costs beside a bare
``MPI_Bcast`` of the same bytes.

    python tools/elastic_growth.py [--repeats 5] [--json growth.json] [--plot docs/img/elastic-transfer.png]

Two parts, each from real jobs under ``mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self``
(Open MPI; tests/ulfm_helpers.py launches them):

- recovery: the digits example (``--elastic --grow --reproducible --max-steps 60``) at 4 ranks, a
  rank SIGKILLed from outside after step 20. Detection: the kill to the survivors' error (the
  example prints when it caught it); shrink: the error to the agreed step (revoke, shrink,
  rebuild, agree); spawn: ``MPI_Comm_spawn`` of the replacement and ``MPI_Intercomm_merge``
  (the replacement's Python start and imports included: it runs the same program); transfer:
  the state to the newcomer (``hpcring.growth.send_state``); first step: from there to the first
  ``step S/T ranks 4`` line read from the job (the step itself, its output's way through the
  launcher). The parts add up to the whole, the kill to that line.
- transfer: 3 ranks spawn one more and merge (the grown world of 4, as after a recovery), then
  for each size (float32 state of 4 KiB to 64 MiB) the state as a join's first try sends it
  (``direct``: ``send_state(comm, [state], header, newcomers)``, rank 0's messages to the
  newcomer alone), as a try after a loss sends it (``transfer(comm, [state], header,
  algorithm=...)``: the header and the state by ``hpcring.broadcast``, checked, to every rank)
  and a bare ``comm.Bcast`` of the same bytes, interleaved, 5 each per round; medians.
  ``--ranks 2`` measures 1 survivor and 1 newcomer.

Every figure is the median over runs (min and max with it); the ranks oversubscribe the
machine's cores: run it under the CPU lock, with the load average printed alongside.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from ulfm_helpers import PYTHON, Job, digest_of, ulfm_launch

TRAIN = [PYTHON, "-m", "hpcring.examples.train", "--elastic", "--grow", "--reproducible"]
LOST = re.compile(r"^# lost rank.* shrunk and agreed in ([\d.]+) ms")
GROWN = re.compile(
    r"^# grown: (\d+) -> (\d+) ranks .*?, spawn ([\d.]+) ms, state ([\d.]+) ms \((\d+) bytes\); "
    r"topology (.*); failure caught at ([\d.]+)$"
)
SIZES = [1 << k for k in range(12, 27, 2)]  # 4 KiB .. 64 MiB
ALGORITHMS = ("auto", "mpi", "ring", "binomial")


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def recovery(repeats: int, ranks: int = 4, victim: int = 2) -> dict[str, Any]:
    parts: dict[str, list[float]] = {}
    for _ in range(repeats):
        job = Job([*ulfm_launch(ranks), *TRAIN, "--max-steps", "60", "--digest"], 300)
        job.wait_for(r"^step 1/")
        job.find(ranks)
        job.wait_for(r"^step 20/")
        job.kill(victim)
        killed = job.killed[victim]
        lines = job.finish()
        digest_of(lines)
        shrink = next(float(m.group(1)) / 1e3 for line in lines if (m := LOST.match(line)))
        grown_at, grown = next((t, m) for t, line in job.lines if (m := GROWN.match(line)))
        spawn, transfer = float(grown.group(3)) / 1e3, float(grown.group(4)) / 1e3
        caught = float(grown.group(7))
        full = next(
            t
            for t, line in job.lines
            if t >= grown_at and line.startswith("step ") and line.endswith(f"ranks {ranks}")
        )
        found = {
            "detection": caught - killed,
            "shrink": shrink,
            "spawn": spawn,
            "transfer": transfer,
            "first step": full - (caught + shrink + spawn + transfer),
            "total": full - killed,
            "bytes": float(grown.group(5)),
        }
        print(f"recovery {ranks} ranks: " + ", ".join(f"{k} {v:.4f}" for k, v in found.items()), flush=True)
        for key, value in found.items():
            parts.setdefault(key, []).append(value)
    return {key: spread(values) for key, values in parts.items()}


def transfer_worker(rounds: int) -> None:
    """Under mpiexec: the first ranks spawn one newcomer (this script again), merge, and time the
    transfer beside MPI_Bcast per size; rank 0 prints one line per size and algorithm."""
    import numpy as np
    from mpi4py import MPI

    from hpcring import growth

    inter = growth.parent()
    if inter is None:
        world = growth.errors_return(MPI.COMM_WORLD.Dup())
        comm = growth.merge(growth.spawn(world, 1, [PYTHON, __file__, "--worker", str(rounds)]), high=False)
    else:
        comm = growth.merge(inter, high=True)
    rank = comm.Get_rank()
    header = np.zeros(len(growth.HEADER), dtype=np.int64)
    header[growth.HEADER.index("holds")] = 1
    for size in SIZES:
        state = np.full(size // 4, rank, dtype=np.float32)
        times: dict[str, list[float]] = {name: [] for name in ("bcast", "direct", *ALGORITHMS)}
        for _ in range(rounds):
            for name in times:
                comm.Barrier()
                began = time.perf_counter()
                if name == "bcast":
                    comm.Bcast(state, root=0)
                elif name == "direct":  # the newcomer is the last rank; the others keep their own
                    growth.send_state(
                        comm, [state], header.copy(), range(comm.Get_size() - 1, comm.Get_size())
                    )
                else:
                    growth.transfer(comm, [state], header.copy(), algorithm=name)
                took = comm.allreduce(time.perf_counter() - began, op=MPI.MAX)
                times[name].append(took)
                assert (state == 0).all() or (name == "direct" and rank < comm.Get_size() - 1)
                state.fill(rank)
        if rank == 0:
            medians = {name: statistics.median(values) for name, values in times.items()}
            print("TRANSFER " + json.dumps({"bytes": size, "ranks": comm.Get_size(), **medians}), flush=True)


def transfer(repeats: int, ranks: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for _ in range(repeats):
        command = [*ulfm_launch(ranks - 1), PYTHON, __file__, "--worker", "5"]
        for line in Job(command, 900).finish():
            if line.startswith("TRANSFER "):
                rows.append(json.loads(line.split(" ", 1)[1]))
                print(line, flush=True)
    table = []
    for size in SIZES:
        mine = [r for r in rows if r["bytes"] == size]
        entry: dict[str, Any] = {"bytes": size, "ranks": ranks}
        for name in ("bcast", "direct", *ALGORITHMS):
            entry[name] = spread([r[name] for r in mine])
        table.append(entry)
    return table


def plot(table: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [row["bytes"] for row in table]
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    axes.plot(sizes, [row["bcast"]["median"] * 1e3 for row in table], "k--o", label="bare MPI_Bcast")
    axes.plot(sizes, [row["direct"]["median"] * 1e3 for row in table], "-o", label="a join's first try")
    for name, style in (("auto", "-s"), ("mpi", "-^"), ("ring", "-v")):
        axes.plot(sizes, [row[name]["median"] * 1e3 for row in table], style, label=f"after a loss ({name})")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("state (bytes)")
    axes.set_ylabel("time (ms), median")
    axes.set_title(f"State to a newcomer, {table[0]['ranks']} ranks (Open MPI ULFM, TCP)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=4, help="the grown world's ranks (transfer)")
    parser.add_argument("--parts", default="recovery,transfer")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--plot", help="write the transfer plot here (PNG)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        transfer_worker(int(args.worker))
        return 0
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    figures: dict[str, Any] = {"load_before": os.getloadavg()}
    if "recovery" in args.parts:
        figures["recovery"] = recovery(args.repeats)
    if "transfer" in args.parts:
        figures["transfer"] = transfer(args.repeats, args.ranks)
        if args.plot:
            plot(figures["transfer"], args.plot)
    figures["load_after"] = os.getloadavg()
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
