"""PyTorch DDP under mpiexec, its gradients all-reduced by hpcring through a communication hook.

    mpiexec -n 2 python -m hpcring.examples.torch_ddp [--steps 20] [--algorithm ring] [--gloo]

A small MLP on scikit-learn's digits (bundled with it, no download). `hpcring.torch.init_process_group`
brings up torch.distributed from the MPI ranks (no MASTER_ADDR, no torchrun), DDP wraps the model,
and `hpcring.torch.allreduce_hook` replaces DDP's own all-reduce (``--gloo`` keeps DDP's, to
compare). Every rank walks the same seeded global batches and takes its contiguous share of
each, so the mean of the ranks' gradients is the gradient of the global batch: the final weights
match a one-process run of the same global batch (to rounding), whatever the rank count.

Every rank prints the digest of its final weights, which must be the same line on every rank;
rank 0 then prints the loss and the time per step. ``--save PATH`` (rank 0) writes the final
weights, flat, as a NumPy file.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import numpy as np

DTYPES = {"float32": "float32", "float64": "float64"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcring.examples.torch_ddp", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=96, help="global batch; each rank takes batch/ranks")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--algorithm", default="ring", help="hpcring's algorithm in the hook")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    parser.add_argument("--gloo", action="store_true", help="DDP's own gloo all-reduce, no hook")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", default=None, help="rank 0 writes the final weights here (.npy)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        import torch

        from hpcring.examples.train import digits

        pixels, targets = digits()
    except ImportError as error:
        raise SystemExit(
            f"hpcring.examples.torch_ddp needs PyTorch and scikit-learn ({error}): "
            "pip install -e '.[torch,train]' in hpcring's clone"
        ) from None
    from mpi4py import MPI
    from torch.nn.parallel import DistributedDataParallel

    import hpcring.torch

    comm = MPI.COMM_WORLD
    if args.batch % comm.size:
        raise SystemExit(f"--batch {args.batch} must be a multiple of the {comm.size} ranks")
    torch.set_num_threads(1)  # ranks share the cores; one thread each keeps the runs comparable
    dtype = getattr(torch, DTYPES[args.dtype])
    hpcring.torch.init_process_group("gloo")

    images = torch.tensor(pixels / 16.0, dtype=dtype)
    labels = torch.tensor(targets, dtype=torch.int64)
    torch.manual_seed(args.seed)  # the same weights everywhere (DDP broadcasts rank 0's anyway)
    net = torch.nn.Sequential(
        torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10)
    ).to(dtype)
    model = DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb)
    how = "DDP's gloo all-reduce"
    if not args.gloo:
        model.register_comm_hook(
            hpcring.torch.HookState(algorithm=args.algorithm), hpcring.torch.allreduce_hook
        )
        how = f"hpcring {args.algorithm} hook"
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    rng = np.random.default_rng(args.seed)
    share = args.batch // comm.size
    loss = torch.zeros(())
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        batch = rng.choice(len(labels), args.batch, replace=False)  # the same on every rank
        mine = torch.from_numpy(batch[comm.rank * share : (comm.rank + 1) * share])
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images[mine]), labels[mine])
        loss.backward()  # the hook reduces each bucket as DDP fills it
        optimizer.step()
    seconds = (time.perf_counter() - start) / max(args.steps, 1)

    weights = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
    digest = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
    print(f"torch_ddp: weights {digest} after {args.steps} steps on {comm.size} ranks ({how}, {args.dtype})")
    sys.stdout.flush()
    mean_loss = comm.allreduce(float(loss.detach())) / comm.size
    comm.Barrier()
    if comm.rank == 0:
        print(f"loss: {mean_loss:.6f}; time: {seconds * 1e3:.2f} ms per step")
        if args.save:
            np.save(args.save, weights.astype(np.float64))
    hpcring.torch.destroy_process_group()  # and a moment for gloo's threads (see its docstring)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
