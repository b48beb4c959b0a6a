"""A recorded step table means what the algorithm does: for every all-reduce algorithm, dtype, size
and placement, the algorithm run directly, its table run row by row in Python (`program.execute`)
and the table run by the compiled core give the same bits, on every rank. A rank that never
arrives inside a compiled program is a StallError on the others within the timeout, as on the
Python path.
"""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np
import pytest
from helpers import WAIT_OUT, everywhere, identical_everywhere
from mpi4py import MPI

import hpcring
from hpcring import algorithms, core, exact, kernels, ops, program
from hpcring.algorithms import ALLREDUCE
from hpcring.arrays import NUMPY
from hpcring.comm import channel_for, state_of
from hpcring.ops import OPS

WORLD = MPI.COMM_WORLD
TIMEOUT = 30.0
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64), np.dtype(ml_dtypes.bfloat16)]
SIZES = [1, 7, 1001]
needs_core = pytest.mark.skipif(not core.active(), reason="the compiled core does not run here")
pytestmark = [pytest.mark.mpi, pytest.mark.filterwarnings("ignore::RuntimeWarning")]


def _algorithms() -> list[str]:
    """The all-reduce algorithms that run on host arrays as they are (auto only chooses one of them)."""
    return list(algorithms.choices(ALLREDUCE))


def _input(dtype: np.dtype, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 7919 + WORLD.rank)
    if dtype.kind in "iu":
        return rng.integers(-1000, 1000, n).astype(dtype)
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dtype)


def _three(name: str, dtype: np.dtype, n: int, in_place: bool, comm: MPI.Intracomm) -> list[np.ndarray] | str:
    """(direct run, Python execute of the table, compiled run of the table), each on fresh arrays;
    or, where any rank cannot record the table, why (then no rank runs anything: a table only the
    root cannot record, its reductions, must not leave the others running it alone)."""
    spec = algorithms.spec(ALLREDUCE, name)
    channel = channel_for(comm, NUMPY)
    channel.timeout = TIMEOUT
    op = OPS["sum"]
    ops.code(dtype)  # as every front door does: bfloat16's kernels known before anything reduces it
    x = _input(dtype, n, n)
    why, recorded = "", None
    try:  # the table names the input and output, not these arrays: both runs of it take fresh ones
        src = x.copy()
        recorded = program.record(
            spec, "reducing", channel, src, src if in_place else np.full_like(src, 3), op
        )
    except program.Unrecordable as error:  # its calls keep the Python path: nothing to compare
        why = f"unrecordable: {error}"
    if not everywhere(WORLD, not why):
        return why or "unrecordable on another rank"
    results = []
    for how in ("direct", "execute", "compiled"):
        src = x.copy()
        dst = src if in_place else np.full_like(src, 3)
        if how == "direct":
            spec.run(channel, src, dst, op)
        elif how == "execute":
            program.execute(recorded, src, dst, TIMEOUT)
        else:
            made, why = core.program(recorded, src, dst)
            assert made is not None, why
            assert made.run(src, dst, TIMEOUT)
        results.append(dst)
    return results


@pytest.mark.timeout(600)
@needs_core
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", _algorithms())
def test_table_is_the_algorithm(
    name: str, dtype: np.dtype, in_place: bool, fresh_world: MPI.Intracomm
) -> None:
    ok, detail = True, ""
    for n in SIZES:
        three = _three(name, dtype, n, in_place, fresh_world)
        if isinstance(three, str):
            detail = three
            continue
        direct, executed, compiled = three
        same = direct.tobytes() == executed.tobytes() == compiled.tobytes()
        ok &= same and identical_everywhere(WORLD, compiled)
        if not same:
            detail = f"n={n}: direct, execute and compiled differ"
    assert everywhere(WORLD, ok), detail


@needs_core
@pytest.mark.timeout(120)
def test_engine_uses_the_compiled_program_and_matches_python(fresh_world: MPI.Intracomm) -> None:
    """From the second call of a kind the engine runs the table in C; the bits stay the Python core's."""
    if WORLD.size == 1:
        pytest.skip("one rank moves no data: no program")
    x = _input(np.dtype(np.float32), 1001, 5)
    with kernels.using("python"):
        expected = hpcring.allreduce(x, out=np.empty_like(x), algorithm="ring", comm=fresh_world)
    got = [hpcring.allreduce(x, out=np.empty_like(x), algorithm="ring", comm=fresh_world) for _ in range(4)]
    compiled = [c.compiled for c in state_of(fresh_world).warm.values() if c.compiled]
    ok = bool(compiled) and all(g.tobytes() == expected.tobytes() for g in got)
    assert everywhere(WORLD, ok)


@needs_core
@pytest.mark.parametrize("collective", ["allreduce", "broadcast"])
def test_warm_numpy_calls_run_in_the_compiled_front_door(
    python_runs: list[int], fresh_world: MPI.Intracomm, collective: str
) -> None:
    """Once warm, a front end's NumPy all-reduce or broadcast runs whole in C: the engine's Python
    call is not entered (a broadcast that passed fewer arguments than the front door takes ran
    its agreement in Python on every call, several times the cost)."""
    if WORLD.size == 1:
        pytest.skip("one rank moves no data: no program")
    function = getattr(hpcring, collective)
    x = np.arange(100, dtype=np.float64) * (WORLD.rank + 1)
    for _ in range(3):  # seen, recorded, compiled
        function(x.copy(), algorithm="ring", comm=fresh_world)
    python_runs.clear()  # the warm-up's calls entered it: count from here
    got = function(x.copy(), algorithm="ring", comm=fresh_world)
    want = np.arange(100.0) * (WORLD.size * (WORLD.size + 1) // 2 if collective == "allreduce" else 1)
    assert everywhere(WORLD, not python_runs and np.array_equal(got, want))


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", ["ring", "ps"])
@pytest.mark.waits_out
def test_stall_inside_a_compiled_program(algorithm: str) -> None:
    """A rank that skips a warm (compiled) call: the others raise StallError naming it, in time."""
    if WORLD.size == 1:
        pytest.skip("needs a rank to miss")
    timeout, missing = WAIT_OUT, WORLD.size - 1  # only the stalled call has it
    comm = WORLD.Dup()
    for _ in range(3):  # seen, recorded, run compiled: the next call's data movement is C's
        hpcring.allreduce(np.ones(1000), comm=comm, algorithm=algorithm)
    ok = any(c.compiled for c in state_of(comm).warm.values())
    if WORLD.rank != missing:
        start = time.monotonic()
        try:
            hpcring.allreduce(np.ones(1000), comm=comm, algorithm=algorithm, timeout=timeout)
            ok = False
        except hpcring.StallError as error:
            elapsed = time.monotonic() - start
            ok &= missing in error.missing and timeout - 0.1 <= elapsed <= timeout + 2.0
    assert everywhere(WORLD, ok)
    comm.Free()


def _through_engine(
    collective: str, kwargs: dict, x: np.ndarray, in_place: bool, comm: MPI.Intracomm
) -> list:
    """Four calls of one kind on ``comm`` (seen, recorded, then the warm call in C): their results."""
    function = getattr(hpcring, collective)
    got = []
    for _ in range(4):
        a = x.copy()
        if collective == "allreduce":  # out=x: in place; else a fresh out
            got.append(function(a, out=a if in_place else np.empty_like(a), comm=comm, **kwargs).copy())
        else:  # broadcast in place; reduce-scatter and all-gather make their out
            got.append(function(a, comm=comm, **kwargs).copy())
    return got


VARIANTS = {
    "sum": {},
    "max": {"op": "max"},
    "mean": {"op": "mean"},
    "wire": {"wire": "bfloat16"},
    "reproducible": {"reproducible": True},
}


@needs_core
@pytest.mark.timeout(600)
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", _algorithms())
def test_engine_allreduce_compiled_is_python(name: str, variant: str, in_place: bool) -> None:
    """Whole all-reduces (wire=, reproducible=, mean included) through the engine: every call of a
    kind under the compiled core gives the Python core's bits, on every rank."""
    if variant == "wire" and algorithms.spec(ALLREDUCE, name).narrowings is None:
        pytest.skip(f"{name} refuses wire=")
    ok, detail = True, ""
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        for n in (7, 1001):
            x = _input(dtype, n, n + 1)
            results = {}
            for which in ("python", "c"):
                comm = WORLD.Dup()
                with kernels.using(which):
                    results[which] = _through_engine(
                        "allreduce", {"algorithm": name, **VARIANTS[variant]}, x, in_place, comm
                    )
                comm.Free()
            expected = results["python"][0].tobytes()
            same = all(r.tobytes() == expected for rs in results.values() for r in rs)
            if not same:
                detail = f"{dtype} n={n}: the compiled core's bits differ"
            ok &= same and identical_everywhere(WORLD, results["c"][-1])
    assert everywhere(WORLD, ok), detail


@needs_core
@pytest.mark.timeout(600)
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "broadcast"])
@pytest.mark.parametrize("name", _algorithms())
def test_engine_other_collectives_compiled_is_python(collective: str, name: str) -> None:
    """Reduce-scatter, all-gather and broadcast through the engine: the compiled core's bits are the
    Python core's, every call of a kind."""
    if name not in algorithms.table(collective):
        pytest.skip(f"{name} has no {collective}")
    kwargs = {"algorithm": name, **({"root": WORLD.size - 1} if collective == "broadcast" else {})}
    ok = True
    for n in (WORLD.size * 3, 1001 * WORLD.size):
        x = _input(np.dtype(np.float32), n, n)
        results = {}
        for which in ("python", "c"):
            comm = WORLD.Dup()
            with kernels.using(which):
                results[which] = _through_engine(collective, kwargs, x, True, comm)
            comm.Free()
        expected = results["python"][0].tobytes()
        ok &= all(r.tobytes() == expected for rs in results.values() for r in rs)
    assert everywhere(WORLD, ok)


def _exact_three(name: str, dtype: np.dtype, n: int, in_place: bool, op: str, comm: MPI.Intracomm) -> list:
    """A reproducible all-reduce inside the algorithm's phases (`exact.fused`) run directly, its
    table run in Python and compiled; and `exact.run`'s whole-array conversions, the reference."""
    spec = algorithms.spec(ALLREDUCE, name)
    channel = channel_for(comm, NUMPY)
    channel.timeout = TIMEOUT
    x = _input(dtype, n, n)
    if n > 3:
        x[:3] = [np.inf if comm.rank == 0 else 1.0, -0.0, np.nan if comm.rank == comm.size - 1 else 2.0]
    results = []
    for how in ("direct", "execute", "compiled", "whole"):
        src = x.copy()
        dst = src if in_place else np.full_like(src, 3)
        if how == "direct":
            exact.fused(channel, spec.split(channel, n), [src], dst, op)
        elif how == "whole":
            exact.run(channel, lambda buf, what: spec.run(channel, buf, buf, OPS[what]), [src], dst, op)
        else:
            recorded = program.record_exact(spec, channel, src, dst, op)
            if how == "execute":
                program.execute(recorded, src, dst, TIMEOUT)
            else:
                made, why = core.program(recorded, src, dst)
                assert made is not None, why
                assert made.run(src, dst, TIMEOUT)
        results.append(dst)
    return results


@pytest.mark.timeout(300)
@needs_core
@pytest.mark.parametrize("gathered", [True, False], ids=["gathered", "in-steps"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("name", ["ring", "rabenseifner"])
def test_reproducible_sum_inside_the_steps_is_the_whole_array_sum(
    name: str, in_place: bool, gathered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reproducible sum converted inside the ring's and Rabenseifner's own steps (on one node,
    by each segment's owner once it has gathered the contributions; across nodes, codes as the
    MAX reduces, words as they are sent and added, rounded on the last hop): run directly, its table
    in Python and compiled, all give `exact.run`'s bits (codes, words, rounding of the whole
    arrays), with Inf, NaN and -0 among the values; and the table converts in its own rows."""
    if WORLD.size == 1:
        pytest.skip("one rank: no steps to convert in")
    if not gathered:  # the path across nodes, on this one
        monkeypatch.setattr(exact, "gathers", lambda size, nodes: False)
    ok, detail = True, ""
    for dtype in (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)):
        for n in (1, 7, 1001):
            for op in ("sum", "mean"):
                direct, executed, compiled, whole = _exact_three(name, dtype, n, in_place, op, WORLD)
                same = direct.tobytes() == executed.tobytes() == compiled.tobytes() == whole.tobytes()
                ok &= same and identical_everywhere(WORLD, compiled)
                if not same:
                    detail = f"{dtype} n={n} {op}: direct, execute, compiled and whole-array differ"
    channel = channel_for(WORLD, NUMPY)
    x = np.ones(1001, np.float32)
    spec = algorithms.spec(ALLREDUCE, name)
    kinds = {row.split()[0] for row in program.record_exact(spec, channel, x, x, "sum").describe()}
    owned = spec.split(channel, x.size).owned
    if exact.gathers(WORLD.size, channel.topology().nodes):
        # an owner sums what it gathered in one row (a folded rank owns nothing)
        ok &= ("gather" in kinds) == (owned.stop > owned.start) and "encode" not in kinds
    else:  # every rank converts as it sends; an owner rounds as it adds
        ok &= {"codes", "encode"} <= kinds and WORLD.allreduce(int("decode" in kinds)) >= 1
    assert everywhere(WORLD, ok), detail


@needs_core
@pytest.mark.timeout(120)
def test_wire_rows_widen_as_they_add_and_forward_what_they_received(fresh_world: MPI.Intracomm) -> None:
    """wire=: a received chunk is widened as it is added (one WIDEN_ADD row, no WIDEN then COMBINE),
    the owner rounds as it makes its last sum, and the all-gather sends on the narrowed values it
    received or rounded (no NARROW there): the ring then narrows only its first send."""
    if WORLD.size == 1:
        pytest.skip("one rank: nothing travels")
    channel = channel_for(fresh_world, NUMPY)
    wire = hpcring.wire.wire_dtype("bfloat16")
    spec = algorithms.spec(ALLREDUCE, "ring")
    x = _input(np.dtype(np.float32), 1001, 3)
    recorded = program.record(spec, "reducing", channel, x, np.empty_like(x), OPS["sum"], wire=wire)
    kinds = [row.split()[0] for row in recorded.describe()]
    ok = kinds.count("narrow") == 1 and "combine" not in kinds and "round" not in kinds
    ok &= kinds.count("widen_add") == WORLD.size - 1 and kinds.count("widen") == WORLD.size - 1
    assert everywhere(WORLD, ok), kinds
