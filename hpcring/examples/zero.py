"""Sharded data-parallel training (ZeRO stage 1-2) from the ring's two phases, in NumPy.

    mpiexec -n 4 python -m hpcring.examples.zero [--epochs 20] [--reproducible] [--digest]

The MLP, data and Adam of `hpcring.examples.train`, trained another way. The all-reduce
version keeps on every rank the whole gradient after the sum, and Adam's two moments for every
parameter. Here a step is the ring's two phases with the update between them:

1. `hpcring.reduce_scatter` of the flat gradient: each rank gets only its shard of the sum;
2. Adam on that shard alone: each rank keeps the moments (m, v) of its shard of the
   parameters only, 1/G of the all-reduce version's optimizer state;
3. `hpcring.allgather` of the updated shards, in place, into the flat parameters every rank
   computes the next forward pass with.

The bytes sent are the all-reduce's (a reduce-scatter plus an all-gather is a ring all-reduce),
and the arithmetic of the update is 1/G of it. The flat vectors are padded to a multiple of G,
so every shard has one length and the all-gather takes one shape on every rank.

``--reproducible`` gives the same weights at any rank count, as ``train --reproducible`` does:
every global batch is cut into the same 12 microbatches whatever G is, and their gradients are
summed by `hpcring.ExactSum`, which is an all-reduce (every rank gets the whole sum, and keeps
its shard): `hpcring.reduce_scatter` has no ``reproducible=`` yet. The optimizer state stays
sharded; only the gradient's sum costs an all-reduce's memory and bytes in this mode.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import hpcring
from hpcring.examples.train import (
    TEST_SIZE,
    forward,
    init_params,
    limit_threads,
    load_digits_split,
    loss_and_backward,
)


class ShardedAdam:
    """Adam over this rank's shard of one flat parameter vector: the moments of that shard only.

    Element-wise, as `hpcring.examples.train.Optimizer` is, so a shard's update is bitwise what
    the whole vector's update gives at those elements."""

    def __init__(self, shard: np.ndarray, lr: float) -> None:
        self.shard, self.lr, self.t = shard, lr, 0
        self.m = np.zeros_like(shard)
        self.v = np.zeros_like(shard)

    @property
    def state_bytes(self) -> int:
        return self.m.nbytes + self.v.nbytes

    def step(self, g: np.ndarray) -> None:
        b1, b2, eps = 0.9, 0.999, 1e-8
        self.t += 1
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        self.m *= b1
        self.m += (1 - b1) * g
        self.v *= b2
        self.v += (1 - b2) * g * g
        self.shard -= (self.lr / c1) * self.m / (np.sqrt(self.v / c2) + eps)


def flat_views(flat: np.ndarray, like: list[np.ndarray]) -> list[np.ndarray]:
    """Views of ``flat`` shaped as each of ``like``, in order."""
    bounds = list(itertools.accumulate((p.size for p in like), initial=0))
    return [flat[a:b].reshape(p.shape) for a, b, p in zip(bounds[:-1], bounds[1:], like, strict=True)]


def train(
    comm: MPI.Intracomm,
    *,
    epochs: int = 20,
    batch: int = 64,
    width: int = 128,
    depth: int = 2,
    lr: float = 1e-3,
    dtype: str = "float32",
    seed: int = 0,
    max_steps: int | None = None,
    algorithm: str = "ring",
    reproducible: bool = False,
    microbatches: int = 12,
    say: Any = print,
) -> dict[str, Any]:
    """Train with sharded Adam on ``comm``; every rank returns the same weights (bitwise)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    np_dtype = np.dtype(dtype)
    x_train, y_train, x_test, y_test = load_digits_split()
    sizes = [x_train.shape[1], *[width] * depth, 10]
    count = sum(p.size for p in init_params(sizes, seed, np_dtype, np))
    length = -(-count // size)  # every shard this long: the flat vectors padded to size * length
    params_flat = np.zeros(size * length, dtype=np_dtype)
    params = flat_views(params_flat, init_params(sizes, seed, np_dtype, np))
    for view, value in zip(params, init_params(sizes, seed, np_dtype, np), strict=True):
        view[...] = value
    grads_flat = np.zeros(size * length, dtype=np_dtype)  # the padding stays 0
    grads = flat_views(grads_flat, params)
    rows = params_flat.reshape(size, length)
    mine = rows[rank]  # this rank's shard of the parameters: a view, updated in place
    optimizer = ShardedAdam(mine, lr)
    shard_grad = np.empty(length, dtype=np_dtype)
    acc = hpcring.ExactSum(like=grads_flat) if reproducible else None
    order_rng = np.random.default_rng(seed + 1)
    step, accuracy, seconds = 0, 0.0, []
    for epoch in range(epochs):
        order = order_rng.permutation(len(y_train))
        for start in range(0, len(order) - batch + 1, batch):
            if max_steps is not None and step >= max_steps:
                break
            began = time.perf_counter()
            samples = order[start : start + batch]
            if acc is None:
                local = np.array_split(samples, size)[rank]
                loss_and_backward(
                    params,
                    grads,
                    x_train[local].astype(np_dtype),
                    y_train[local],
                    1.0 / batch,
                    np,
                    lambda i: None,
                )
                hpcring.reduce_scatter(grads_flat, out=shard_grad, algorithm=algorithm, comm=comm)  # phase 1
            else:
                pieces = np.array_split(samples, microbatches)
                acc.clear()
                for piece in np.array_split(np.arange(microbatches), size)[rank]:
                    local = pieces[piece]
                    loss_and_backward(
                        params,
                        grads,
                        x_train[local].astype(np_dtype),
                        y_train[local],
                        1.0 / batch,
                        np,
                        lambda i: None,
                    )
                    acc.add(grads_flat)
                acc.allreduce(comm=comm, algorithm=algorithm, out=grads_flat)
                shard_grad[...] = grads_flat.reshape(size, length)[rank]
            optimizer.step(shard_grad)  # this rank's shard only
            hpcring.allgather(mine, out=rows, algorithm=algorithm, comm=comm)  # phase 2, in place
            seconds.append(time.perf_counter() - began)
            step += 1
        predicted = forward(params, x_test.astype(np_dtype), np)[-1].argmax(axis=1)
        accuracy = float((predicted == y_test).mean())
        say(f"epoch {epoch + 1:3d}  test acc {100 * accuracy:5.1f}%  step {1e3 * np.median(seconds):6.2f} ms")
        if max_steps is not None and step >= max_steps:
            break
    # What the all-reduce version holds per rank: Adam's moments of every parameter.
    full_state = 2 * count * np_dtype.itemsize
    return {
        "params": params,
        "accuracy": accuracy,
        "count": count,
        "state_bytes": optimizer.state_bytes,
        "full_state_bytes": full_state,
        "steps": step,
        "step_seconds": float(np.median(seconds)) if seconds else 0.0,
        "digest": hashlib.sha256(b"".join(p.tobytes() for p in params)).hexdigest(),
        "test_size": TEST_SIZE,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcring.examples.zero", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="global batch size, split over the ranks")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--algorithm", default="ring", help="of the reduce-scatter and the all-gather")
    parser.add_argument("--reproducible", action="store_true", help="the same weights at any rank count")
    parser.add_argument("--microbatches", type=int, default=12, help="per global batch, with --reproducible")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per rank (default 1)")
    parser.add_argument("--digest", action="store_true", help="print the final weights' SHA-256")
    return parser.parse_args(argv)


@hpcring.aborting
def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    comm = MPI.COMM_WORLD
    limit_threads(args.threads)
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(
        f"# hpcring sharded Adam (reduce-scatter, update the shard, all-gather) | {comm.size} ranks | "
        f"MLP 64-{'-'.join([str(args.width)] * args.depth)}-10, {args.dtype} | global batch {args.batch} | "
        f"algorithm {args.algorithm}{' | reproducible' if args.reproducible else ''}"
    )
    result = train(
        comm,
        epochs=args.epochs,
        batch=args.batch,
        width=args.width,
        depth=args.depth,
        lr=args.lr,
        dtype=args.dtype,
        seed=args.seed,
        max_steps=args.max_steps,
        algorithm=args.algorithm,
        reproducible=args.reproducible,
        microbatches=args.microbatches,
        say=lambda line: say(line, flush=True),
    )
    held = comm.allreduce(result["state_bytes"], op=MPI.MAX)
    full = result["full_state_bytes"]
    say(
        f"# optimizer state per rank: {held:,} bytes (Adam's m and v of one shard), against {full:,} for "
        f"the all-reduce version: {held / full:.4f} = 1/{full / held:.2f} (G = {comm.size})"
    )
    say(f"# final test accuracy {100 * result['accuracy']:.1f}%")
    digests = comm.allgather(result["digest"])
    if len(set(digests)) != 1:
        raise SystemExit("weights differ between ranks")
    if args.reproducible or args.digest:
        say(f"# weights digest {result['digest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
