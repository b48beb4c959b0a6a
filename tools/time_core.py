"""The compiled core measured against what it replaces, same process, same buffers, interleaved.

    python tools/time_core.py kernels [--mib 16] [--runs 7]       # element kernels, one process
    mpiexec -n 2 python tools/time_core.py call [--runs 7]        # the bare call to MPI_Allreduce
    mpiexec -n 2 python tools/time_core.py e2e [--mib 16] [--runs 9]   # whole all-reduces, both cores

``kernels``: for each kernel (the reductions per dtype, the wire conversions, the reproducible
sum's conversions), GB/s of the compiled kernel and of the NumPy path (``hpcring.kernels.using``
switches between them around the very functions hpcring calls), counting the bytes each reads and
writes once; median over runs, the two sides alternating within each run.

``e2e``: whole ``hpcring.allreduce`` calls under each core in turn, in one process per rank, so
both cores see the same machine: the plain ring, ``reproducible=True`` (ring) and
``wire="bfloat16"`` (ring), float32 and float64 (check=False, out of place). Each run times
``--calls`` calls of each variant on every rank (max over ranks); the variants take turns run
by run, and the table gives the median time and the median over runs of each ratio to the plain
ring timed in the same run under the same core.

``call``: per call, mpi4py's ``comm.Allreduce`` and the same MPI_Allreduce through
``hpcring._core.allreduce`` (the MPI-linked extension), at 8 B and 4 KiB; each run times a
batch of each on every rank (max over ranks), median over runs. Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from hpcring import exact, kernels, wire
from hpcring.ops import OPS

BF16 = np.dtype(ml_dtypes.bfloat16)


def timed(call: Callable[[], object], repeat: int) -> float:
    """Seconds per call, over ``repeat`` calls after one warm-up call."""
    call()
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - start) / repeat


def block_scratch(n: int) -> Callable[..., Any]:
    """exact.run's ``block`` (reused temporaries of BLOCK elements) for the NumPy path."""
    made: dict[tuple[str, int | None], np.ndarray] = {}

    def block(name: str, dtype: np.dtype, rows: int | None = None) -> np.ndarray:
        key = (name, rows)
        if key not in made:
            made[key] = np.empty((rows or 1) * min(n, exact.BLOCK), dtype)
        return made[key] if rows is None else made[key].reshape(rows, -1)

    return block


def kernel_cases(n_bytes: int) -> list[tuple[str, int, Callable[[], object]]]:
    """(name, bytes moved per call, the call) for each kernel, on arrays of ``n_bytes`` input."""
    rng = np.random.default_rng(0)
    cases: list[tuple[str, int, Callable[[], object]]] = []
    for dtype in (np.dtype(np.float32), np.dtype(np.float64), BF16, np.dtype(np.float16), np.dtype(np.int32)):
        n = n_bytes // dtype.itemsize
        acc = rng.standard_normal(n).astype(dtype) if dtype.kind != "i" else rng.integers(-9, 9, n, dtype)
        other = acc.copy()
        cases.append(
            (
                f"reduce sum {dtype.name}",
                3 * n * dtype.itemsize,
                lambda a=acc, b=other: OPS["sum"].reduce(np, a, b),
            )
        )
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        n = n_bytes // dtype.itemsize
        x = rng.standard_normal(n).astype(dtype)
        for to in (BF16, np.dtype(np.float16)):
            w = np.empty(n, to)
            moved = n * (dtype.itemsize + 2)
            cases.append((f"narrow {dtype.name}->{to.name}", moved, lambda x=x, w=w: wire.narrow(x, w)))
            cases.append((f"widen {to.name}->{dtype.name}", moved, lambda x=x, w=w: wire.widen(w, x)))
            y = x.copy()
            cases.append(
                (
                    f"round_trip {dtype.name} via {to.name}",
                    2 * n * dtype.itemsize,
                    lambda y=y, w=w: wire.round_trip(y, w),
                )
            )
        for to in (BF16,):  # a wire= receive: widened as it is added (one WIDEN_ADD row)
            w = wire.narrow(x, np.empty(n, to))
            y, t = x.copy(), np.empty_like(x)

            def widen_add(w: np.ndarray = w, y: np.ndarray = y, t: np.ndarray = t) -> None:
                if not kernels.widen_add(w, y, y, False):  # NumPy's path: the widening, then the sum
                    OPS["sum"].combine(np, y, wire.widen(w, t), y)

            moved = n * (2 * dtype.itemsize + to.itemsize)
            cases.append((f"widen_add {to.name}->{dtype.name}", moved, widen_add))
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        fmt = exact.FORMATS[dtype]
        n = n_bytes // dtype.itemsize
        x = rng.standard_normal(n).astype(dtype)
        code = np.empty(n, fmt.code)
        words = np.empty((n, fmt.words), np.int64)
        out = np.empty(n, dtype)
        block = block_scratch(n)
        exact.codes(fmt, x, np, code, block)
        wbytes = words.nbytes
        cases.append(
            (
                f"exact codes {dtype.name}",
                x.nbytes + code.nbytes,
                lambda f=fmt, x=x, c=code, b=block: exact.codes(f, x, np, c, b),
            )
        )
        cases.append(
            (
                f"exact encode {dtype.name}",
                x.nbytes + code.nbytes + wbytes,
                lambda f=fmt, x=x, c=code, w=words, b=block: exact.encode(f, x, c, w, np, b, None, True),
            )
        )
        exact.encode(fmt, x, code, words, np, block, None, True)
        theirs = words.copy()
        cases.append(
            (
                f"exact encode+add {dtype.name}",  # a reduction step: x converted as it is added
                x.nbytes + code.nbytes + 2 * wbytes,
                lambda f=fmt, x=x, c=code, w=words, t=theirs, b=block: exact.encode(
                    f, x, c, w, np, b, t, floats=True
                ),
            )
        )
        saved = words.copy()

        def decode(
            f: Any = fmt,
            w: np.ndarray = words,
            s: np.ndarray = saved,
            c: np.ndarray = code,
            o: np.ndarray = out,
            b: Any = block,
            mine: np.ndarray | None = None,
        ) -> None:
            np.copyto(w, s)  # the NumPy path overwrites the words (in cache: a small part of the time)
            exact.decode(f, w, c, o, 1, np, b, 2, True, mine)

        cases.append((f"exact decode {dtype.name}", wbytes + code.nbytes + out.nbytes, decode))
        cases.append(
            (
                f"exact encode+decode {dtype.name}",  # the last step: x added as the sum is rounded
                x.nbytes + wbytes + code.nbytes + out.nbytes,
                lambda d=decode, x=x: d(mine=x),
            )
        )
    x = rng.standard_normal(n_bytes // 4).astype(np.float32)
    y = np.empty_like(x)
    cases.append(("np.copyto (the bandwidth to compare)", 2 * x.nbytes, lambda x=x, y=y: np.copyto(y, x)))
    return cases


def run_kernels(args: argparse.Namespace) -> None:
    if kernels.COMPILED is None:  # nothing to compare (the docs' commands run everywhere)
        print(f"# no compiled kernels here: {kernels.REASON}")
        return
    cases = kernel_cases(args.mib << 20)
    repeat = 5
    print(f"# element kernels, {args.mib} MiB of input, GB/s (bytes read + written once), {args.runs} runs")
    print(f"# {kernels.REASON}")
    print(f"# {'kernel':34s} {'numpy':>8s} {'C':>8s} {'C/numpy':>8s}")
    for name, moved, call in cases:
        rates: dict[str, list[float]] = {"python": [], "c": []}
        for _ in range(args.runs):
            for core in ("python", "c"):
                with kernels.using(core):
                    rates[core].append(moved / timed(call, repeat) / 1e9)
        py, c = statistics.median(rates["python"]), statistics.median(rates["c"])
        print(f"  {name:34s} {py:8.2f} {c:8.2f} {c / py:8.2f}")


def run_call(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    from hpcring.core import mpi_core

    comm = MPI.COMM_WORLD
    core, why = mpi_core()
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    if core is None:
        say(f"# no MPI-linked core here: {why}")
        return
    f32, add = kernels.DTYPE_CODES[np.dtype(np.float32)], kernels.OP_CODES["add"]
    say(f"# {comm.size} ranks, per call (us), median of {args.runs} runs x {args.calls} calls; {why}")
    say(f"# {'size':>6s} {'comm.Allreduce':>15s} {'_core.allreduce':>16s} {'ratio':>6s}")
    for nbytes in (8, 4096):
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        calls = {
            "mpi4py": lambda x=x, y=y: comm.Allreduce(x, y, op=MPI.SUM),
            "core": lambda x=x, y=y: core.allreduce(comm, x, y, f32, add),
        }
        got = core.allreduce(comm, x, y, f32, add)
        assert got == 0 and (y == comm.size).all(), (got, y)
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.runs):
            for name, call in calls.items():
                comm.Barrier()
                times[name].append(comm.allreduce(timed(call, args.calls), op=MPI.MAX) * 1e6)
        a, b = statistics.median(times["mpi4py"]), statistics.median(times["core"])
        say(f"  {nbytes:6d} {a:15.3f} {b:16.3f} {b / a:6.2f}")


def run_e2e(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    import hpcring

    comm = MPI.COMM_WORLD
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    cores = ["python", "c"] if kernels.COMPILED is not None else ["python"]
    say(f"# {comm.size} ranks, {args.mib} MiB, ring, check=False, out of place; ms per call, median of")
    say(f"# {args.runs} runs; ratio: median over runs of time / the plain ring's (same run, same core)")
    say(f"# {kernels.REASON}")
    say(f"# {'dtype':8s} {'variant':14s} " + " ".join(f"{c + ' ms':>9s} {c + ' ratio':>9s}" for c in cores))
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        n = (args.mib << 20) // dtype.itemsize
        x = np.random.default_rng(comm.rank).standard_normal(n).astype(dtype)
        out = np.empty_like(x)
        variants = {
            "plain": {},
            "reproducible": {"reproducible": True},
            "wire bfloat16": {"wire": "bfloat16"},
        }
        times = {(core, name): [] for core in cores for name in variants}
        for _ in range(args.runs):
            for core in cores:
                with kernels.using(core):
                    for name, extra in variants.items():

                        def call(
                            x: np.ndarray = x, out: np.ndarray = out, extra: dict[str, Any] = extra
                        ) -> None:
                            hpcring.allreduce(x, out=out, algorithm="ring", check=False, **extra)

                        comm.Barrier()
                        times[core, name].append(comm.allreduce(timed(call, args.calls), op=MPI.MAX) * 1e3)
        for name in variants:
            cells = []
            for core in cores:
                ratios = [t / p for t, p in zip(times[core, name], times[core, "plain"], strict=True)]
                cells.append(f"{statistics.median(times[core, name]):9.2f} {statistics.median(ratios):9.2f}")
            say(f"  {dtype.name:8s} {name:14s} " + " ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("kernels", "call", "e2e"))
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--mib", type=int, default=16, help="kernels, e2e: MiB of input per array")
    parser.add_argument("--calls", type=int, help="calls per timed batch (call: 20000, e2e: 3)")
    args = parser.parse_args()
    if args.calls is None:
        args.calls = 3 if args.what == "e2e" else 20000
    {"kernels": run_kernels, "call": run_call, "e2e": run_e2e}[args.what](args)


if __name__ == "__main__":
    main()
