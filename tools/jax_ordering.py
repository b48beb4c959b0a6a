"""How hpcring.jax keeps every rank's collectives in one order inside jit, and what each way costs:
the same FFI call (hpcring's handler, one all-reduce) ordered three ways, side by side in one run.

    mpiexec -n 2 python tools/jax_ordering.py [--sizes 1K,1M] [--iters 200] [--repeats 20]

- ``lowering tokens`` (what hpcring.jax does): each call takes the XLA token the previous call of
  its block returned; no JAX effect, so the jitted function keeps JAX's C++ dispatch path;
- ``ordered effect`` (mpi4jax's way): the primitive declares an ordered JAX effect and JAX threads
  its tokens, through control flow and between executions (runtime tokens: Python dispatch);
- ``explicit tokens``: the caller threads a token through every call itself, as mpi4jax < 0.8
  asked (no effect either; the tokens are the user's to carry, into nested jits; JAX 0.10 carries
  no token through scan's carry and ``lax.cond`` takes none, so a body or branch starts its own);
- and for reference the io_callback fallback and mpi4jax where installed.

It prints us per jitted step (``allreduce(x) * 0.5 + x``, blocked on; median of the slowest rank),
then runs each way's deadlock probe: a program with collectives at the top, in a scan body, in a
nested jit and in a cond, their data independent of each other, dispatched ``--repeats`` times
before any result is waited for, under a deadline; it says whether every rank finished with the
right results.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import effects
from jax.extend.core import Primitive
from jax.interpreters import mlir, xla
from mpi4py import MPI

import hpcring
import hpcring.jax as hj
from hpcring import jax_callback, jax_ffi
from hpcring.units import parse_size

WORLD = MPI.COMM_WORLD


class OrderedCollective(effects.Effect):  # JAX's private module: mpi4jax uses it too
    def __hash__(self) -> int:
        return hash("hpcring.tools.jax_ordering")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrderedCollective)


ORDERED = OrderedCollective()
for _kind in ("lowerable", "ordered", "control_flow_allowed", "custom_derivatives_allowed"):
    getattr(effects, f"{_kind}_effects").add_type(OrderedCollective)


def _site(algorithm: str) -> int:
    module, why = jax_ffi.target()
    if module is None:
        sys.exit(f"the FFI target is not there: {why}")
    args = ("allreduce", None, None, "sum", algorithm, None, True, None, 0, False, None)
    return jax_ffi.site(module, "allreduce", args, ("allreduce", "sum", algorithm, "tools", 0, False))


def _call(ctx: Any, x: Any, token: Any, algorithm: str) -> tuple[Any, Any]:
    token_aval = jax_ffi._abstract_token()
    inner = ctx.replace(avals_in=(ctx.avals_in[0], token_aval), avals_out=(ctx.avals_out[0], token_aval))
    rule = jax.ffi.ffi_lowering(jax_ffi.TARGET, has_side_effect=True)
    result, token = rule(inner, x, token, site=np.int64(_site(algorithm)))
    return result, token


# An ordered effect, as mpi4jax declares one: JAX threads its tokens.
effect_p = Primitive("hpcring_tools_effect_allreduce")
effect_p.def_impl(lambda x, **p: xla.apply_primitive(effect_p, x, **p))
effect_p.def_effectful_abstract_eval(lambda x, **_: (jax.core.ShapedArray(x.shape, x.dtype), {ORDERED}))


def _effect_lowering(ctx: Any, x: Any, *, algorithm: str) -> list[Any]:
    result, token = _call(ctx, x, ctx.tokens_in.get(ORDERED), algorithm)
    ctx.set_tokens_out(mlir.TokenSet({ORDERED: token}))
    return [result]


mlir.register_lowering(effect_p, _effect_lowering, platform="cpu")

# Explicit tokens: (x, token) -> (y, token), no effect.
token_p = Primitive("hpcring_tools_token_allreduce")
token_p.multiple_results = True
token_p.def_impl(lambda x, t, **p: xla.apply_primitive(token_p, x, t, **p))
token_p.def_abstract_eval(lambda x, t, **_: (jax.core.ShapedArray(x.shape, x.dtype), t))
mlir.register_lowering(
    token_p,
    lambda ctx, x, t, *, algorithm: list(_call(ctx, x, t, algorithm)),
    platform="cpu",
    cacheable=False,
)


def ways(algorithm: str) -> dict[str, Callable[..., Any]]:
    """Each way's all-reduce as f(x, token) -> (y, token); only explicit tokens use the token."""
    made: dict[str, Callable[..., Any]] = {
        "lowering tokens": lambda x, t: (hj.allreduce(x, algorithm=algorithm), t),
        "ordered effect": lambda x, t: (effect_p.bind(x, algorithm=algorithm), t),
        "explicit tokens": lambda x, t: tuple(token_p.bind(x, t, algorithm=algorithm)),
        "io_callback": lambda x, t: (jax_callback.allreduce(x, algorithm=algorithm), t),
    }
    try:
        import mpi4jax

        made["mpi4jax"] = lambda x, t: (mpi4jax.allreduce(x, op=MPI.SUM, comm=WORLD), t)
    except ImportError:
        pass
    return made


def step_time(reduce: Callable[..., Any], n: int, iters: int) -> float:
    @jax.jit
    def step(x: jax.Array) -> jax.Array:
        y, _ = reduce(x, jax.lax.create_token())
        return y * 0.5 + x

    x = jnp.ones(n, jnp.float32) * (WORLD.rank + 1)
    want = np.full(n, WORLD.size * (WORLD.size + 1) / 4, np.float32) + np.asarray(x)
    assert np.array_equal(np.asarray(step(x)), want)
    for _ in range(10):
        jax.block_until_ready(step(x))
    times = []
    for _ in range(iters):
        WORLD.Barrier()
        start = time.perf_counter()
        jax.block_until_ready(step(x))
        times.append(time.perf_counter() - start)
    slowest = np.array(times)
    WORLD.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
    return 1e6 * statistics.median(slowest)


def probe(reduce: Callable[..., Any], repeats: int) -> bool:
    """Collectives in four scopes, independent data, queued ``repeats`` times: right everywhere."""
    inner = jax.jit(lambda a, t: reduce(a * 3, t))

    @jax.jit
    def program(a: jax.Array, b: jax.Array) -> tuple[jax.Array, ...]:
        t = jax.lax.create_token()
        top, t = reduce(a, t)
        nested, t = inner(b, t)

        # JAX 0.10 carries no token through scan's carry, and lax.cond takes no token operand:
        # a body and a branch start from a token of their own
        fresh = jax.lax.create_token

        def body(carry: jax.Array, _: None) -> tuple[jax.Array, None]:
            return reduce(carry, fresh())[0], None

        looped, _ = jax.lax.scan(body, b * 2, None, length=2)
        chosen = jax.lax.cond(a[0] > -1, lambda v: reduce(v * 5, fresh())[0], lambda v: v, b)
        return top, nested, looped, chosen

    a = jnp.arange(64.0) + WORLD.rank
    b = jnp.arange(8.0) * (WORLD.rank + 1)
    results = [program(a, b) for _ in range(repeats)]
    g, ranks = WORLD.size, sum(range(WORLD.size))
    everyone_a = g * np.arange(64.0) + ranks
    everyone_b = np.arange(8.0) * (g * (g + 1) // 2)
    want = (everyone_a, 3 * everyone_b, 2 * everyone_b * g, 5 * everyone_b)
    return all(np.array_equal(np.asarray(r), w) for one in results for r, w in zip(one, want, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1K,1M", help="bytes per rank (float32)")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--algorithm", default="auto")
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    made = ways(args.algorithm)
    if WORLD.rank == 0:
        print(
            f"# {WORLD.size} ranks, hpcring.jax: {hpcring.info()['jax']}, JAX {jax.__version__}, "
            f"algorithm {args.algorithm}"
        )
        print("| way | " + " | ".join(f"{s} us" for s in args.sizes.split(",")) + " | deadlock probe |")
        print("| --- |" + " ---: |" * len(args.sizes.split(",")) + " --- |", flush=True)
    for name, reduce in made.items():
        figures = [step_time(reduce, parse_size(s) // 4, args.iters) for s in args.sizes.split(",")]
        right = WORLD.allreduce(probe(reduce, args.repeats), op=MPI.LAND)
        if WORLD.rank == 0:
            cells = " | ".join(f"{f:.0f}" for f in figures)
            print(f"| {name} | {cells} | {'finished, right' if right else 'WRONG'} |", flush=True)


if __name__ == "__main__":
    main()
