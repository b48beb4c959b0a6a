"""A data-parallel training step in JAX: ``jax.grad`` on each rank's share, `hpcring.allreduce`
between jitted steps.

    mpiexec -n 2 python -m hpcring.examples.jax_step [--steps 50] [--algorithm ring]

Softmax regression on synthetic data that every rank draws alike from one seed. Each rank
takes its contiguous share of every global batch; ``jax.jit(jax.grad(loss))`` runs on it, then
`hpcring.allreduce` averages each gradient over the ranks, between jitted steps (inside a jitted
function, `hpcring.jax.allreduce` does the same). JAX arrays are immutable, so
`hpcring.allreduce` returns a new array each time.

Every rank prints the digest of its final weights, the same line on every rank; rank 0 then
prints the loss.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

import numpy as np


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcring.examples.jax_step", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=128, help="global batch; each rank takes batch/ranks")
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--algorithm", default="ring")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as error:
        raise SystemExit(
            f"hpcring.examples.jax_step needs JAX ({error}): pip install -e '.[jax]' in hpcring's clone"
        ) from None
    from mpi4py import MPI

    import hpcring

    comm = MPI.COMM_WORLD
    if args.batch % comm.size:
        raise SystemExit(f"--batch {args.batch} must be a multiple of the {comm.size} ranks")
    rng = np.random.default_rng(args.seed)
    features, classes, samples = 16, 4, 2048
    truth = rng.standard_normal((features, classes))
    x_all = rng.standard_normal((samples, features)).astype(np.float32)
    y_all = np.argmax(x_all @ truth + 0.5 * rng.standard_normal((samples, classes)), axis=1)

    def loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        logits = x @ params["w"] + params["b"]
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(y.shape[0]), y])

    grad = jax.jit(jax.grad(loss))
    params = {"w": jnp.zeros((features, classes), jnp.float32), "b": jnp.zeros(classes, jnp.float32)}
    share = args.batch // comm.size
    for _ in range(args.steps):
        batch = rng.choice(samples, args.batch, replace=False)[comm.rank * share : (comm.rank + 1) * share]
        grads = grad(params, jnp.asarray(x_all[batch]), jnp.asarray(y_all[batch]))
        # Outside jit: each gradient is averaged over the ranks; a new jax.Array comes back.
        grads = jax.tree_util.tree_map(
            lambda g: hpcring.allreduce(g, op="mean", algorithm=args.algorithm), grads
        )
        params = jax.tree_util.tree_map(lambda p, g: p - args.lr * g, params, grads)

    flat = np.concatenate([np.asarray(params[k]).reshape(-1) for k in sorted(params)])
    digest = hashlib.sha256(flat.tobytes()).hexdigest()[:16]
    print(f"jax_step: weights {digest} after {args.steps} steps on {comm.size} ranks ({args.algorithm})")
    sys.stdout.flush()
    final = float(loss(params, jnp.asarray(x_all), jnp.asarray(y_all)))
    comm.Barrier()
    if comm.rank == 0:
        print(f"loss: {final:.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
