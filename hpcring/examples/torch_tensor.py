"""Tensor parallelism on the "hpcring" backend, side by side with gloo: each weight cut across ranks.

    mpiexec -n 2 python -m hpcring.examples.torch_tensor [--steps 5] [--hidden 64]

An MLP's blocks (Linear, Tanh, Linear) are parallelized over a 1-D device mesh of every rank with
`torch.distributed.tensor.parallel.parallelize_module`: the first Linear of each block
``ColwiseParallel`` (each rank holds a slice of its output features), the second
``RowwiseParallel`` (a slice of its input features; the partial outputs are summed across ranks).
Every rank sees the whole batch. The mesh is ``init_device_mesh("cpu", (G,))``, which reuses the
default group, hpcring's; gloo's run uses a mesh over a gloo group of the same ranks
(``DeviceMesh.from_group``). The collectives DTensor issues: the scatter that shards each weight
(``distribute_tensor``), the all-reduce of the row-parallel partial sums forward and of the
column-parallel input gradients backward, and the all-gathers of ``full_tensor()``. Rank 0
prints the median time per step and the largest difference between the weights the two runs
end with; every rank prints the digest of the full final weights per run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from .sidebyside import digest, need_torch, table, timed_step


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcring.examples.torch_tensor", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="steps not timed")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64, help="a multiple of the rank count")
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--backends", default="hpcring,gloo", help="comma-separated: hpcring, gloo")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch = need_torch("torch_tensor")
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import hpcring.torch

    comm = MPI.COMM_WORLD
    if args.hidden % comm.size:
        raise SystemExit(f"--hidden {args.hidden} must be a multiple of the {comm.size} ranks")
    backends = [b for b in args.backends.split(",") if b]
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    hpcring.torch.init_process_group()  # the default group: hpcring's
    meshes = {"hpcring": init_device_mesh("cpu", (comm.size,))}  # reuses the default group
    assert dist.get_backend(meshes["hpcring"].get_group()) == "hpcring"
    if "gloo" in backends:
        meshes["gloo"] = DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")
    generator = torch.Generator().manual_seed(args.seed)
    inputs = torch.randn(args.batch, args.width, generator=generator, dtype=dtype)
    targets = torch.sin(inputs)

    def run(mesh: Any) -> tuple[np.ndarray, list[float]]:
        torch.manual_seed(args.seed)
        layers: list[torch.nn.Module] = []
        for _ in range(args.blocks):
            layers += [
                torch.nn.Linear(args.width, args.hidden),
                torch.nn.Tanh(),
                torch.nn.Linear(args.hidden, args.width),
            ]
        net = torch.nn.Sequential(*layers).to(dtype)
        plan: dict[str, Any] = {}
        for block in range(args.blocks):
            plan[str(3 * block)] = ColwiseParallel()
            plan[str(3 * block + 2)] = RowwiseParallel()
        model = parallelize_module(net, mesh, plan)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        times = []

        def step() -> None:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()

        for number in range(args.warmup + args.steps):
            elapsed = timed_step(comm, step)
            if number >= args.warmup:
                times.append(elapsed)
        full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
        return torch.cat([p.detach().reshape(-1) for p in full]).numpy(), times

    runs = {}
    for backend in backends:
        runs[backend] = run(meshes[backend])
        weights = runs[backend][0]
        print(
            f"torch_tensor: TP on {backend}: weights {digest(weights)} after {args.warmup + args.steps} steps"
        )
    sys.stdout.flush()
    comm.Barrier()
    shape = f"{args.width}-{args.hidden}-{args.width}"
    heading = (
        f"# {comm.size} ranks, {args.dtype}, {args.blocks} block(s) {shape} (Colwise, Rowwise), batch "
        f"{args.batch}, {args.steps} timed steps after {args.warmup} "
        "(ms per step: median of the slowest rank's)"
    )
    table(comm, heading, backends, {"TP": runs})
    hpcring.torch.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
