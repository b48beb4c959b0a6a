"""FSDP2 and DDP on the "hpcring" backend, side by side with gloo, in one run under mpiexec.

    mpiexec -n 2 python -m hpcring.examples.torch_fsdp [--steps 5] [--hidden 256] [--dtype float64]

`hpcring.torch.init_process_group()` makes hpcring's process group the default one (rank and
size from MPI; no launcher variables), and a gloo group over the same ranks is made beside it.
The same model (a digits MLP, seeded), the same global batches (each rank its contiguous share)
and the same SGD steps run four times: DDP and FSDP2 (``fully_shard`` on each Linear and on the
model), each on hpcring's group and on gloo's, with no hook: every collective DDP and FSDP2
issue (broadcast, all-gather, all-reduce, reduce-scatter) is the backend's. Rank 0 prints the
median time per step of each and the largest difference between the weights hpcring's and
gloo's runs end with; every rank prints the digest of its final weights per run, the same line
on every rank.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from typing import Any

import numpy as np


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcring.examples.torch_fsdp", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="steps not timed")
    parser.add_argument("--batch", type=int, default=96, help="global batch; each rank takes batch/ranks")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument(
        "--algorithm", default=None, help="hpcring's algorithm (default HPCRING_ALGO, else ring)"
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        import torch

        from hpcring.examples.train import digits

        pixels, targets = digits()
    except ImportError as error:
        raise SystemExit(
            f"hpcring.examples.torch_fsdp needs PyTorch and scikit-learn ({error}): "
            "pip install -e '.[torch,train]' in hpcring's clone"
        ) from None
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    import hpcring.torch

    comm = MPI.COMM_WORLD
    if args.batch % comm.size:
        raise SystemExit(f"--batch {args.batch} must be a multiple of the {comm.size} ranks")
    torch.set_num_threads(1)  # ranks share the cores; one thread each keeps the runs comparable
    dtype = getattr(torch, args.dtype)
    hpcring.torch.init_process_group(algorithm=args.algorithm)  # the default group: hpcring's
    groups = {"hpcring": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    images = torch.tensor(pixels / 16.0, dtype=dtype)
    labels = torch.tensor(targets, dtype=torch.int64)
    share = args.batch // comm.size

    def run(strategy: str, group: Any) -> tuple[torch.Tensor, list[float]]:
        torch.manual_seed(args.seed)
        net = torch.nn.Sequential(
            torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10)
        ).to(dtype)
        if strategy == "DDP":
            model = DistributedDataParallel(net, process_group=group)
        else:
            mesh = DeviceMesh.from_group(group, "cpu")
            for layer in net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            model = fully_shard(net, mesh=mesh)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        rng = np.random.default_rng(args.seed)
        times = []
        for step in range(args.warmup + args.steps):
            batch = rng.choice(len(labels), args.batch, replace=False)  # the same on every rank
            mine = torch.from_numpy(batch[comm.rank * share : (comm.rank + 1) * share])
            comm.Barrier()
            began = time.perf_counter()
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images[mine]), labels[mine]).backward()
            optimizer.step()
            elapsed = comm.allreduce(time.perf_counter() - began, op=MPI.MAX)  # the slowest rank's
            if step >= args.warmup:
                times.append(elapsed)
        full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in net.parameters()]
        return torch.cat([p.detach().reshape(-1) for p in full]), times

    results: dict[tuple[str, str], tuple[torch.Tensor, list[float]]] = {}
    for strategy in ("DDP", "FSDP2"):
        for backend, group in groups.items():
            results[strategy, backend] = run(strategy, group)
            weights = results[strategy, backend][0].numpy()
            digest = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
            steps = args.steps + args.warmup
            print(f"torch_fsdp: {strategy} on {backend}: weights {digest} after {steps} steps")
    sys.stdout.flush()
    comm.Barrier()
    if comm.rank == 0:
        print(
            f"# {comm.size} ranks, {args.dtype}, MLP 64-{args.hidden}-10, global batch {args.batch}, "
            f"{args.steps} timed steps after {args.warmup} (ms per step: median of the slowest rank's)"
        )
        print("| strategy | hpcring | gloo | max abs difference of the weights |")
        print("| --- | --- | --- | --- |")
        for strategy in ("DDP", "FSDP2"):
            (ours, ours_t), (theirs, theirs_t) = results[strategy, "hpcring"], results[strategy, "gloo"]
            difference = float((ours - theirs).abs().max())
            ms = [1e3 * statistics.median(t) for t in (ours_t, theirs_t)]
            print(f"| {strategy} | {ms[0]:.2f} | {ms[1]:.2f} | {difference:.3g} |")
    hpcring.torch.destroy_process_group()  # and a moment for gloo's threads (see its docstring)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
