"""The figures of docs/elastic.md, measured: how fast a failed rank is detected, how fast the
survivors shrink and resume, and what elastic mode costs per step when nothing fails.

    python tools/elastic_figures.py [--repeats 3] [--json figures.json]

Four parts, each from real jobs under ``mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self``
(Open MPI; tests/ulfm_helpers.py launches them):

- detection: tests/ulfm_job.py at 4 ranks, a rank SIGKILLing itself inside an all-reduce (ring,
  then mpi on the 3 survivors, and the other way round): seconds from its death to each
  survivor's RankFailedError, and what `hpcring.shrink` took;
- recovery: the digits example (``--elastic --reproducible --max-steps 60``) at 4 and 3 ranks, one
  rank SIGKILLed from outside after step 20: the example's own figure (from the error caught to
  the survivors' agreement on the step: revoke, shrink, rebuild, agree), and from the kill to the
  first step printed on the survivors (detection, recovery, the step done again, the output);
- overhead: what `Elastic` adds to a step when nothing fails, measured inside one job (the
  example's steps in blocks of 20, a block by a plain loop and one by `Elastic` in turn, 10 of
  each; the step time from one applied update to the next), and its end-of-run agreement;
- cost: the whole example at 4 ranks, nothing killed, with and without ``--elastic`` under the
  same launch (and without it under the default launch, shared memory), ``--reproducible`` and
  not: each run's median step time, runs interleaved (noisy where the machine is shared).

Every figure is the median over runs (min and max with it); ranks oversubscribe the machine's
cores, so read it with the load average printed alongside.
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
from helpers import launch
from ulfm_helpers import PYTHON, Job, steps_of, ulfm_launch

JOB = str(Path(__file__).resolve().parent.parent / "tests" / "ulfm_job.py")
TRAIN = [PYTHON, "-m", "hpcring.examples.train", "--max-steps", "60", "--digest"]
LINE = re.compile(r"^(DIED|RAISED|SHRUNK) case (\d+) rank (\d+) (.*)$")
MEDIAN = re.compile(r"^# median per step \(.*\): (?:step )?([\d.]+) ms")
RECOVERED = re.compile(r"^# lost rank.* shrunk and agreed in ([\d.]+) ms")


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": values,
    }


def detection(repeats: int) -> dict[str, Any]:
    found: dict[str, list[float]] = {}
    for run in range(repeats):
        for first, second in (("ring", "mpi"), ("mpi", "ring")):
            cases = [f"allreduce-{first}:{1 + run % 3}:kill", f"allreduce-{second}:{run % 3}:kill"]
            lines = Job([*ulfm_launch(4), PYTHON, JOB, *cases], 300).finish()
            died: dict[int, float] = {}
            for line in lines:
                match = LINE.match(line)
                if not match:
                    continue
                kind, case, _, rest = match.groups()
                ranks = 4 - int(case)
                name = (first, second)[int(case)]
                if kind == "DIED":
                    died[int(case)] = float(rest.split()[-1])
                elif kind == "RAISED":
                    at = float(rest.split()[1])
                    found.setdefault(f"detect {name} G={ranks}", []).append(at - died[int(case)])
                else:
                    found.setdefault(f"shrink G={ranks}->{ranks - 1}", []).append(float(rest.split()[3]))
    return {key: spread(values) for key, values in sorted(found.items())}


def recovery(repeats: int) -> dict[str, Any]:
    found: dict[str, list[float]] = {}
    for _ in range(repeats):
        for ranks, victim in ((4, 2), (3, 1)):
            job = Job([*ulfm_launch(ranks), *TRAIN, "--elastic", "--reproducible"], 300)
            job.wait_for(r"^step 1/")
            job.find(ranks)
            job.wait_for(r"^step 20/")
            job.kill(victim)
            killed = job.killed[victim]
            job.finish()
            resumed = next(
                t for t, line in job.lines if line.startswith("step ") and line.endswith(f"ranks {ranks - 1}")
            )
            agreed = next(float(m.group(1)) for _, line in job.lines if (m := RECOVERED.match(line)))
            found.setdefault(f"shrink+agree G={ranks}->{ranks - 1} (ms)", []).append(agreed)
            found.setdefault(f"kill -> first step G={ranks}->{ranks - 1} (s)", []).append(resumed - killed)
    return {key: spread(values) for key, values in sorted(found.items())}


def cost(repeats: int) -> dict[str, Any]:
    variants = {
        "ulfm launch, --elastic": (ulfm_launch(4), ["--elastic"]),
        "ulfm launch, not elastic": (ulfm_launch(4), []),
        "default launch (sm), not elastic": (launch(4), []),
    }
    found: dict[str, list[float]] = {}
    for _ in range(repeats):
        for exact in (["--reproducible"], []):
            for name, (start, flags) in variants.items():
                lines = Job([*start, *TRAIN, *exact, *flags], 300).finish()
                assert steps_of(lines) or not flags, lines
                step = next(float(m.group(1)) for line in lines if (m := MEDIAN.match(line)))
                found.setdefault(f"{name}{', reproducible' if exact else ''} (ms/step)", []).append(step)
    return {key: spread(values) for key, values in found.items()}


def overhead_worker(exact: bool, blocks: int, per_block: int) -> None:
    """Under mpiexec: the example's steps in blocks, a block by a plain loop and one by
    `hpcring.elastic.Elastic` in turn, on the same ranks and buffers; each step timed from one
    applied update to the next on rank 0 (the blocks' last agreement excluded: timed apart)."""
    import numpy as np
    from mpi4py import MPI

    import hpcring
    from hpcring.elastic import Elastic
    from hpcring.examples import train
    from hpcring.training import GradientSync

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    x_train, y_train, _, _ = train.load_digits_split()
    params = train.init_params([64, 128, 128, 10], 0, np.dtype(np.float32), np)
    opt = train.Optimizer("adam", params, 1e-3, np)
    flat = np.zeros(sum(p.size for p in params), dtype=np.float32)
    bounds = np.cumsum([0, *(p.size for p in params)])
    grads = [flat[a:b].reshape(p.shape) for a, b, p in zip(bounds[:-1], bounds[1:], params, strict=True)]
    acc = hpcring.ExactSum(like=flat)
    sync = GradientSync([np.zeros_like(p) for p in params], comm=comm, algorithm="auto", op="sum")
    order = np.random.default_rng(1).permutation(len(y_train))
    marks: list[float] = []

    def compute(comm: MPI.Intracomm, t: int) -> list[np.ndarray]:
        samples = order[(t % 23) * 64 : (t % 23 + 1) * 64]
        if exact:
            data = (x_train, y_train, np.dtype(np.float32), 64, np, comm, "auto")
            train._exact_step(params, grads, flat, acc, samples, 12, size, rank, data)
            return grads
        mine = np.array_split(samples, size)[rank]
        xb, yb = x_train[mine].astype(np.float32), y_train[mine]
        train.loss_and_backward(params, sync.grads, xb, yb, 1 / 64, np, sync.ready)
        sync.wait()
        return sync.grads

    def apply(t: int, result: list[np.ndarray]) -> None:
        opt.t = t
        opt.step(result)
        marks.append(time.perf_counter())

    times: dict[str, list[float]] = {"plain": [], "elastic": []}
    settle: list[float] = []
    step = 0
    for block in range(2 * blocks):
        marks.clear()
        if block % 2:
            loop = Elastic([*params, *opt.m, *opt.v], comm=comm, step=step)
            loop.run(compute, apply, step + per_block)
            began = time.perf_counter()
            loop.settle(True)
            settle.append(time.perf_counter() - began)
        else:
            for t in range(step, step + per_block):
                apply(t, compute(comm, t))
        step += per_block
        times["elastic" if block % 2 else "plain"] += list(np.diff(marks)[2:])  # warm steps only
    if rank == 0:
        for name, values in times.items():
            print(f"OVERHEAD {name} {1e3 * statistics.median(values):.4f}", flush=True)
        print(f"OVERHEAD settle {1e3 * statistics.median(settle):.4f}", flush=True)


def overhead(repeats: int) -> dict[str, Any]:
    found: dict[str, list[float]] = {}
    for _ in range(repeats):
        for exact in (True, False):
            command = [PYTHON, __file__, "--worker", "exact" if exact else "plain"]
            for line in Job([*ulfm_launch(4), *command], 600).finish():
                if line.startswith("OVERHEAD "):
                    _, name, value = line.split()
                    label = "reproducible" if exact else "GradientSync"
                    found.setdefault(f"{label}: {name} (ms{'/step' if name != 'settle' else ''})", []).append(
                        float(value)
                    )
    return {key: spread(values) for key, values in found.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/elastic_figures.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="detection,recovery,overhead,cost")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", choices=("exact", "plain"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        overhead_worker(args.worker == "exact", blocks=10, per_block=20)
        return 0
    began = time.time()
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    for part in args.parts.split(","):
        results[part] = globals()[part](args.repeats)
        for key, value in results[part].items():
            print(
                f"{part:9s} {key:52s} median {value['median']:9.4f}  min {value['min']:9.4f}  "
                f"max {value['max']:9.4f}  (n={value['n']})",
                flush=True,
            )
    results["load_after"] = os.getloadavg()
    results["seconds"] = time.time() - began
    load = f"# load average before {results['load_before']}, after {results['load_after']}"
    print(f"{load}; cores {os.cpu_count()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
