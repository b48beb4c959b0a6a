"""Two strategies at once on the "hpcring" backend, side by side with gloo: FSDP2 across one mesh
dimension, tensor parallelism across the other.

    mpiexec -n 4 python -m hpcring.examples.torch_2d [--steps 5] [--tp 2]

The ranks form a 2-D device mesh of G/tp rows ("dp") by ``--tp`` columns ("tp"): each row's
ranks split every weight between them (``ColwiseParallel`` then ``RowwiseParallel`` for each
block, as `hpcring.examples.torch_tensor` does), and the rows shard what each holds with FSDP2
(``fully_shard`` on each block and on the model, along "dp") and take each its share of the
batch. On hpcring the mesh is ``init_device_mesh("cpu", (G/tp, tp))``: its row and column groups
are new groups of the default backend, hpcring's; on gloo the same call with
``backend_override`` naming gloo for both dimensions. Every collective of both strategies (the
scatter that shards the weights, TP's all-reduces, FSDP2's all-gathers and reduce-scatters) runs
on the mesh's groups. Rank 0 prints the median time per step and the largest difference between
the weights the two runs end with; every rank prints the digest of the full final weights.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from .sidebyside import digest, need_torch, table, timed_step


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcring.examples.torch_2d", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="steps not timed")
    parser.add_argument("--tp", type=int, default=2, help="ranks per tensor-parallel group (mesh columns)")
    parser.add_argument("--batch", type=int, default=32, help="global batch; each mesh row takes its share")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--backends", default="hpcring,gloo", help="comma-separated: hpcring, gloo")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch = need_torch("torch_2d")
    import logging
    import warnings

    import torch.distributed as dist
    from mpi4py import MPI
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import hpcring.torch

    comm = MPI.COMM_WORLD
    if comm.size % args.tp or args.hidden % args.tp:
        raise SystemExit(f"--tp {args.tp} must divide the {comm.size} ranks and --hidden {args.hidden}")
    rows = comm.size // args.tp
    if args.batch % rows:
        raise SystemExit(f"--batch {args.batch} must be a multiple of the {rows} mesh rows")
    backends = [b for b in args.backends.split(",") if b]
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    hpcring.torch.init_process_group()  # the default group: hpcring's
    # FSDP2 warns that the Sequential's output is a view (nothing here writes it in place), and
    # full_tensor() that it gathers the 2-D shards in two steps
    warnings.filterwarnings("ignore", "FSDP2-wrapped module .* returned a view tensor")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    names = ("dp", "tp")
    meshes = {"hpcring": init_device_mesh("cpu", (rows, args.tp), mesh_dim_names=names)}
    assert {dist.get_backend(meshes["hpcring"].get_group(n)) for n in names} == {"hpcring"}
    if "gloo" in backends:
        gloo = {"dp": "gloo", "tp": "gloo"}
        meshes["gloo"] = init_device_mesh("cpu", (rows, args.tp), mesh_dim_names=names, backend_override=gloo)
    generator = torch.Generator().manual_seed(args.seed)
    inputs = torch.randn(args.batch, args.width, generator=generator, dtype=dtype)
    targets = torch.sin(inputs)
    row = meshes["hpcring"].get_local_rank("dp")
    share = args.batch // rows
    mine = slice(row * share, (row + 1) * share)

    def run(mesh: Any) -> tuple[np.ndarray, list[float]]:
        torch.manual_seed(args.seed)
        blocks = [
            torch.nn.Sequential(
                torch.nn.Linear(args.width, args.hidden),
                torch.nn.Tanh(),
                torch.nn.Linear(args.hidden, args.width),
            )
            for _ in range(args.blocks)
        ]
        net = torch.nn.Sequential(*blocks).to(dtype)
        for block in net:
            parallelize_module(block, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(net, mesh=mesh["dp"])
        optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
        times = []

        def step() -> None:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(inputs[mine]), targets[mine]).backward()
            optimizer.step()

        for number in range(args.warmup + args.steps):
            elapsed = timed_step(comm, step)
            if number >= args.warmup:
                times.append(elapsed)
        full = [p.full_tensor() for p in net.parameters()]
        return torch.cat([p.detach().reshape(-1) for p in full]).numpy(), times

    runs = {}
    for backend in backends:
        runs[backend] = run(meshes[backend])
        steps = args.warmup + args.steps
        print(f"torch_2d: FSDP2 x TP on {backend}: weights {digest(runs[backend][0])} after {steps} steps")
    sys.stdout.flush()
    comm.Barrier()
    heading = (
        f"# {comm.size} ranks as {rows} (dp, FSDP2) x {args.tp} (tp), {args.dtype}, {args.blocks} block(s) "
        f"{args.width}-{args.hidden}-{args.width}, global batch {args.batch}, {args.steps} timed steps after "
        f"{args.warmup} (ms per step: median of the slowest rank's)"
    )
    table(comm, heading, backends, {"FSDP2 x TP": runs})
    hpcring.torch.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
