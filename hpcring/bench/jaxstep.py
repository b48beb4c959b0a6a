"""``--framework jax``: a jitted step holding one all-reduce, hpcring's beside mpi4jax's.

The step is ``y = allreduce(x) * 0.5 + x`` under ``jax.jit``, its result blocked on, on the
float CPU arrays of each size: once with `hpcring.jax.allreduce` (the algorithms of ``-a``,
default auto) and once with ``mpi4jax.allreduce`` (op SUM; float32 and float64, MPI's own types)
where mpi4jax is installed: a yardstick, not a dependency; the header says why where it is
missing. The two are timed
alternately, iteration by iteration, so a slow spell of the machine hits both alike; each time is
the slowest rank's, and a row gives the median, the median over passes with ``--passes``. Every
step's result is checked against its exact value (small integers: exact in any order), and each
of hpcring's rows against `hpcring.allreduce` outside ``jit`` on the same array, bitwise; a wrong
element makes the exit status 1.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from ..units import format_size
from .data import sweep


def run(args: Any, comm: MPI.Intracomm) -> int:
    """Measure and print the table on rank 0; 0, or 1 where a result was wrong."""
    import jax
    import jax.numpy as jnp

    from .. import __version__, collectives, info
    from .. import jax as hj

    jax.config.update("jax_enable_x64", True)
    rank, size = comm.Get_rank(), comm.Get_size()
    mpi4jax, missing = _mpi4jax()
    facts = info()
    sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor, args.dtype.itemsize)
    if rank == 0:
        print(
            f"# hpcring {__version__}, JAX {jax.__version__}, {size} ranks, {args.dtype.name}, "
            f"hpcring.jax: {facts['jax']} ({facts['jax_reason']})\n"
            f"# mpi4jax: {mpi4jax.__version__ if mpi4jax else f'not installed ({missing})'}\n"
            f"# step: y = allreduce(x) * 0.5 + x under jax.jit, blocked on; us per step, the median of "
            f"{args.iters} steps of the slowest rank (after {args.warmup} untimed)"
            + (f", the median of {args.passes} passes" if args.passes > 1 else ""),
            flush=True,
        )
        print("| bytes | algorithm | mpi4jax us | hpcring us | hpcring / mpi4jax |")
        print("| ---: | --- | ---: | ---: | ---: |", flush=True)
    wrong = False
    for nbytes in sizes:
        n = nbytes // args.dtype.itemsize
        x = jnp.asarray(((np.arange(n) + rank) % 4 + 1).astype(args.dtype))
        total = sum(((np.arange(n) + r) % 4 + 1) for r in range(size)).astype(args.dtype)
        want = total * args.dtype.type(0.5) + np.asarray(x)
        for algorithm in args.algorithms:
            steps = {"hpcring": jax.jit(lambda a, alg=algorithm: hj.allreduce(a, algorithm=alg) * 0.5 + a)}
            if mpi4jax is not None and args.dtype.name in ("float32", "float64"):
                steps["mpi4jax"] = jax.jit(lambda a: mpi4jax.allreduce(a, op=MPI.SUM, comm=comm) * 0.5 + a)
            ok = True
            for step in steps.values():
                ok &= bool(np.array_equal(np.asarray(step(x)), want))
            inside = np.asarray(jax.jit(lambda a, alg=algorithm: hj.allreduce(a, algorithm=alg))(x))
            ok &= bool(np.array_equal(inside, collectives.allreduce(np.array(x), algorithm=algorithm)))
            ok = bool(comm.allreduce(ok, op=MPI.LAND))
            wrong |= not ok
            medians = {name: [] for name in steps}
            for _ in range(args.passes):
                for name, us in _timed(steps, x, args, comm).items():
                    medians[name].append(us)
            mine = statistics.median(medians["hpcring"])
            theirs = statistics.median(medians["mpi4jax"]) if "mpi4jax" in medians else None
            if rank == 0:
                their = f"{theirs:.0f}" if theirs is not None else "-"
                ratio = f"{mine / theirs:.2f}x" if theirs else "-"
                mark = "" if ok else " WRONG"
                print(
                    f"| {format_size(nbytes)}B | {algorithm} | {their} | {mine:.0f} | {ratio}{mark} |",
                    flush=True,
                )
    if wrong and rank == 0:
        sys.stderr.write("hpcring.bench: FAILED: a jitted step's result was wrong (see table)\n")
    return 1 if wrong else 0


def _timed(steps: dict[str, Any], x: Any, args: Any, comm: MPI.Intracomm) -> dict[str, float]:
    """us per step of each, the median over iterations of the slowest rank, taken alternately."""
    import jax

    for _ in range(args.warmup):
        for step in steps.values():
            jax.block_until_ready(step(x))
    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for i in range(args.iters):
        for name in order if i % 2 == 0 else reversed(order):
            comm.Barrier()
            start = time.perf_counter()
            jax.block_until_ready(steps[name](x))
            times[name].append(time.perf_counter() - start)
    slowest = np.array([times[name] for name in order])
    comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
    return {name: 1e6 * float(np.median(slowest[k])) for k, name in enumerate(order)}


def _mpi4jax() -> tuple[Any, str]:
    """mpi4jax where it imports, and why not elsewhere (the same on every rank)."""
    try:
        import mpi4jax
    except ImportError as error:
        return None, str(error)
    return mpi4jax, ""


__all__ = ["run"]
