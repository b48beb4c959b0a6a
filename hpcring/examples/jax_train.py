"""Data-parallel training in JAX with ``jax.jit`` around the whole step: the digits MLP of
`hpcring.examples.train`, its gradient summed by `hpcring.jax.allreduce` inside the jitted step.

    mpiexec -n 2 python -m hpcring.examples.jax_train [--steps 60] [--dtype float64] ...

The model, data, batches and optimizer are `hpcring.examples.train`'s (the same seeded weights,
the same global batches, each rank its slice of every one, Adam), written in JAX: one jitted
function computes this rank's share of the global mean loss and its gradient (``jax.grad``),
sums the gradient over the ranks with one all-reduce (the gradients raveled into one vector, the
NumPy example's one bucket), and takes the optimizer's step. Nothing leaves the compiled program
between the batch going in and the new weights coming out.

It runs the same steps with mpi4jax's all-reduce in place of hpcring's beside it, where mpi4jax
is installed (the two runs take their steps in turn), then the NumPy example itself, and prints
each one's median time per step and the largest difference between its final weights and
these (they agree to rounding: 1e-6 in float32 after a few dozen steps, far less in float64;
hpcring's and mpi4jax's sums are the same operation on the same gradients, ``--algorithm mpi``
makes them the same call).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI

from . import train as numpy_example


def make_step(reduce: Callable[[Any], Any], optimizer: str) -> Callable[..., Any]:
    """The jitted training step: (params, m, v, x, y, scale, lr, c1, c2) -> (params, m, v, loss)."""
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    def local_loss(params: list[Any], x: Any, y: Any, scale: Any) -> Any:
        """This rank's samples' cross-entropy, summed, times 1/global batch (the NumPy example's)."""
        act = x
        layers = len(params) // 2
        for layer in range(layers):
            z = act @ params[2 * layer] + params[2 * layer + 1]
            act = jnp.where(z > 0, z, 0) if layer < layers - 1 else z  # ReLU: its gradient 0 at 0
        shifted = act - act.max(axis=1, keepdims=True)
        total = jnp.exp(shifted).sum(axis=1)
        return (jnp.log(total) - shifted[jnp.arange(y.shape[0]), y]).sum() * scale

    @partial(jax.jit, donate_argnums=(0, 1, 2))
    def step(
        params: list[Any], m: list[Any], v: list[Any], x: Any, y: Any, scale: Any, lr: Any, c1: Any, c2: Any
    ):
        loss, grads = jax.value_and_grad(local_loss)(params, x, y, scale)
        flat, unravel = ravel_pytree(grads)
        grads = unravel(reduce(flat))  # the sum over the ranks: the global batch's gradient
        if optimizer == "sgd":
            m = [mi * 0.9 + g for mi, g in zip(m, grads, strict=True)]
            return [p - lr * mi for p, mi in zip(params, m, strict=True)], m, v, loss
        b1, b2, eps = 0.9, 0.999, 1e-8
        m = [mi * b1 + (1 - b1) * g for mi, g in zip(m, grads, strict=True)]
        v = [vi * b2 + (1 - b2) * g * g for vi, g in zip(v, grads, strict=True)]
        params = [
            p - (lr / c1) * mi / (jnp.sqrt(vi / c2) + eps) for p, mi, vi in zip(params, m, v, strict=True)
        ]
        return params, m, v, loss

    return step


def train(
    comm: MPI.Intracomm,
    reducers: dict[str, Callable[[Any], Any]],
    *,
    steps: int,
    batch: int = 64,
    width: int = 128,
    depth: int = 2,
    optimizer: str = "adam",
    lr: float = 1e-3,
    dtype: str = "float32",
    seed: int = 0,
) -> dict[str, tuple[list[np.ndarray], list[float], list[float]]]:
    """``steps`` steps of the NumPy example's training, in JAX, once per gradient sum of
    ``reducers``, the runs taking their steps in turn (so that a slow spell of the machine
    hits each alike): per run, (final weights, seconds per step on this rank, local losses)."""
    import jax
    import jax.numpy as jnp

    size, rank = comm.Get_size(), comm.Get_rank()
    np_dtype = np.dtype(dtype)
    x_train, y_train, _, _ = numpy_example.load_digits_split()
    sizes = [x_train.shape[1], *[width] * depth, 10]
    first = numpy_example.init_params(sizes, seed, np_dtype, np)
    runs = {}
    for name, reduce in reducers.items():
        params = [jnp.asarray(p) for p in first]
        state = [params, [jnp.zeros_like(p) for p in params], [jnp.zeros_like(p) for p in params]]
        runs[name] = (make_step(reduce, optimizer), state, [], [])
    order_rng = np.random.default_rng(seed + 1)  # the epochs' orders, as the NumPy example draws them
    t = 0
    while t < steps:
        order = order_rng.permutation(len(y_train))
        for start in range(0, len(order) - batch + 1, batch):  # fixed global batch: drop the tail
            if t >= steps:
                break
            t += 1
            mine = np.array_split(order[start : start + batch], size)[rank]
            xb, yb = jnp.asarray(x_train[mine].astype(np_dtype)), jnp.asarray(y_train[mine])
            c1, c2 = 1 - 0.9**t, 1 - 0.999**t
            for step, state, seconds, losses in runs.values():
                began = time.perf_counter()
                params, m, v, loss = step(*state, xb, yb, 1.0 / batch, lr, c1, c2)
                state[:] = [params, m, v]
                jax.block_until_ready(state[0])
                seconds.append(time.perf_counter() - began)
                losses.append(float(loss))
    return {
        name: ([np.asarray(p) for p in state[0]], seconds, losses)
        for name, (_, state, seconds, losses) in runs.items()
    }


def reducers(comm: MPI.Intracomm, algorithm: str) -> dict[str, Callable[[Any], Any]]:
    """The gradient sum: hpcring's, and mpi4jax's where it is installed."""
    import hpcring.jax

    made = {"hpcring.jax": lambda g: hpcring.jax.allreduce(g, algorithm=algorithm, comm=comm)}
    try:
        import mpi4jax
    except ImportError:
        return made
    made["mpi4jax"] = lambda g: mpi4jax.allreduce(g, op=MPI.SUM, comm=comm)
    return made


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcring.examples.jax_train", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=60, help="training steps (23 per epoch)")
    parser.add_argument("--algorithm", default="auto", help="hpcring's all-reduce algorithm (default auto)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--batch", type=int, default=64, help="global batch size, split over the ranks")
    parser.add_argument("--width", type=int, default=128, help="hidden layer width")
    parser.add_argument("--depth", type=int, default=2, help="number of hidden layers")
    parser.add_argument("--optimizer", default="adam", choices=("adam", "sgd"))
    parser.add_argument("--lr", type=float, default=None, help="learning rate (adam 1e-3, sgd 0.05)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per rank (default 1)")
    parser.add_argument("--no-numpy", action="store_true", help="skip the NumPy example's run")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        import jax
    except ImportError as error:
        raise SystemExit(
            f"hpcring.examples.jax_train needs JAX ({error}): pip install -e '.[jax]' in hpcring's clone"
        ) from None
    import hpcring

    jax.config.update("jax_enable_x64", args.dtype == "float64")
    comm = MPI.COMM_WORLD
    numpy_example.limit_threads(args.threads)
    lr = args.lr if args.lr is not None else (1e-3 if args.optimizer == "adam" else 0.05)
    say = print if comm.Get_rank() == 0 else (lambda *a, **k: None)
    facts = hpcring.info()
    common = {
        "steps": args.steps,
        "batch": args.batch,
        "width": args.width,
        "depth": args.depth,
        "optimizer": args.optimizer,
        "lr": lr,
        "dtype": args.dtype,
        "seed": args.seed,
    }
    say(
        f"# hpcring {facts['hpcring']} | JAX {jax.__version__} | {comm.Get_size()} ranks | MLP "
        f"64-{'-'.join([str(args.width)] * args.depth)}-10, {args.dtype} | global batch {args.batch} | "
        f"{args.optimizer} lr {lr:g} | {args.steps} steps, jax.jit around each | hpcring.jax: {facts['jax']}",
        flush=True,
    )
    runs: dict[str, tuple[list[np.ndarray], list[float]]] = {}
    for name, (weights, seconds, losses) in train(comm, reducers(comm, args.algorithm), **common).items():
        runs[name] = (weights, seconds)
        warm = seconds[min(5, len(seconds) - 1) :]
        slowest = comm.allreduce(statistics.median(warm), op=MPI.MAX)
        label = f"{name} ({args.algorithm})" if name == "hpcring.jax" else name
        say(f"{label:24s} median step {1e3 * slowest:7.3f} ms (slowest rank, after 5 warm-up)  last loss "
            f"{comm.allreduce(losses[-1], op=MPI.SUM):.4f}", flush=True)  # fmt: skip
    mine, _ = runs["hpcring.jax"]
    if not args.no_numpy:
        result = numpy_example.train(comm, algorithm=args.algorithm, epochs=10**6, max_steps=args.steps, **{
            k: common[k] for k in ("batch", "width", "depth", "optimizer", "lr", "dtype", "seed")
        })  # fmt: skip
        runs["numpy example"] = ([np.asarray(p) for p in result.params], [s["step"] for s in result.steps])
        warm = runs["numpy example"][1][5:] or runs["numpy example"][1]
        slowest = comm.allreduce(statistics.median(warm), op=MPI.MAX)
        say(f"{'numpy example':24s} median step {1e3 * slowest:7.3f} ms (slowest rank, after 5 warm-up)")
    for name, (weights, _) in runs.items():
        if name != "hpcring.jax":
            gap = max(float(np.max(np.abs(a - b))) for a, b in zip(mine, weights, strict=True))
            say(f"largest weight difference, hpcring.jax - {name}: {comm.allreduce(gap, op=MPI.MAX):.2e}")
    same = all(np.array_equal(a, b) for a, b in zip(mine, comm.bcast(mine), strict=True))
    say(f"weights identical on every rank: {comm.allreduce(same, op=MPI.LAND)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
