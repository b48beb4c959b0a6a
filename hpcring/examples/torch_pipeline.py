"""Pipeline parallelism on the "hpcring" backend, side by side with gloo: one stage per rank.

    mpiexec -n 2 python -m hpcring.examples.torch_pipeline [--steps 5] [--microbatches 4]

A model of ``--blocks`` Linear+Tanh blocks and a last Linear is cut into one stage per rank
(`torch.distributed.pipelining.PipelineStage`), and each schedule, ``ScheduleGPipe`` (every
microbatch forward, then every one backward) and ``Schedule1F1B`` (one forward, one backward
in turn), trains it for a few SGD steps on the same batches, on hpcring's group and on a gloo
group over the same ranks. What crosses between stages is point to point: activations forward
and gradients back with ``batch_isend_irecv`` (``isend``/``irecv``, each returning at once), and
the shapes once, with ``send_object_list``/``recv_object_list``. Rank 0 prints the median time
per step of each run (the slowest rank's) and the largest difference between the weights the
hpcring and gloo runs end with; every rank prints the digest of the whole model's final
weights per run, the same line on every rank.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from .sidebyside import digest, need_torch, table, timed_step

SCHEDULES = ("GPipe", "1F1B")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcring.examples.torch_pipeline", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="steps not timed")
    parser.add_argument("--batch", type=int, default=64, help="global batch, cut into microbatches")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=4, help="Linear+Tanh blocks, cut evenly into stages")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated: GPipe, 1F1B")
    parser.add_argument("--backends", default="hpcring,gloo", help="comma-separated: hpcring, gloo")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch = need_torch("torch_pipeline")
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    import hpcring.torch

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    if args.batch % args.microbatches:
        raise SystemExit(f"--batch {args.batch} must be a multiple of --microbatches {args.microbatches}")
    schedules = [s for s in args.schedules.split(",") if s]
    backends = [b for b in args.backends.split(",") if b]
    torch.set_num_threads(1)  # ranks share the cores; one thread each keeps the runs comparable
    dtype = getattr(torch, args.dtype)
    hpcring.torch.init_process_group()  # the default group: hpcring's
    groups = {"hpcring": dist.group.WORLD}
    if "gloo" in backends:
        groups["gloo"] = dist.new_group(backend="gloo")
    per = -(-args.blocks // size)  # blocks per stage
    generator = torch.Generator().manual_seed(args.seed)
    inputs = torch.randn(args.batch, args.width, generator=generator, dtype=dtype)
    targets = torch.sin(inputs.sum(dim=1, keepdim=True))

    def stage_module() -> torch.nn.Module:
        """This rank's stage of the whole model, built whole with one seed and cut, so every run
        starts from the same weights."""
        torch.manual_seed(args.seed)
        layers: list[torch.nn.Module] = []
        for _ in range(per * size):
            layers += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
        layers.append(torch.nn.Linear(args.width, 1))
        whole = torch.nn.Sequential(*layers).to(dtype)
        mine = list(whole)[2 * per * rank : 2 * per * (rank + 1)]
        if rank == size - 1:
            mine.append(whole[-1])
        return torch.nn.Sequential(*mine)

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(output, target)

    def run(schedule: str, group: Any) -> tuple[np.ndarray, list[float], float]:
        module = stage_module()
        stage = PipelineStage(module, rank, size, torch.device("cpu"), group=group)
        kind = ScheduleGPipe if schedule == "GPipe" else Schedule1F1B
        pipe = kind(stage, args.microbatches, loss_fn=loss_fn)
        optimizer = torch.optim.SGD(module.parameters(), lr=args.lr)
        times, losses = [], []

        def step() -> None:
            optimizer.zero_grad()
            losses.clear()
            if size == 1:
                pipe.step(inputs, target=targets, losses=losses)
            elif rank == 0:
                pipe.step(inputs)
            elif rank == size - 1:
                pipe.step(target=targets, losses=losses)
            else:
                pipe.step()
            optimizer.step()

        for number in range(args.warmup + args.steps):
            elapsed = timed_step(comm, step)
            if number >= args.warmup:
                times.append(elapsed)
        loss = float(torch.stack(losses).mean()) if losses else 0.0
        mine = torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy()
        whole = np.concatenate(comm.allgather(mine))  # every stage's weights, in stage order
        return whole, times, comm.bcast(loss, root=size - 1)

    rows: dict[str, dict[str, tuple[np.ndarray, list[float]]]] = {}
    for schedule in schedules:
        for backend in backends:
            weights, times, loss = run(schedule, groups[backend])
            rows.setdefault(schedule, {})[backend] = weights, times
            print(
                f"torch_pipeline: {schedule} on {backend}: weights {digest(weights)} after "
                f"{args.warmup + args.steps} steps, loss {loss:.6g}"
            )
    sys.stdout.flush()
    comm.Barrier()
    heading = (
        f"# {size} stages (one per rank), {args.dtype}, {per} block(s) of width {args.width} per stage, "
        f"global batch {args.batch} in {args.microbatches} microbatches, {args.steps} timed steps after "
        f"{args.warmup} (ms per step: median of the slowest rank's)"
    )
    table(comm, heading, backends, rows)
    hpcring.torch.destroy_process_group()  # and a moment for gloo's threads (hpcring.torch.launch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
