"""hpcring.plan: validated and agreed once, then run again and again on the same buffers."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import WAIT_OUT, everywhere, identical_everywhere, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring import config, core, polling
from hpcring.persistent import PAIR_WHOLE_IN_PLACE, SHARED_BYTES, SHARED_RANKS

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
G = WORLD.size


@pytest.mark.parametrize("placement", ["in place", "out=x", "out="])
@pytest.mark.parametrize("algorithm", [*hpcring.ALGORITHMS])
def test_repeated_runs_give_the_closed_form(
    fresh_world: MPI.Intracomm, algorithm: str, placement: str
) -> None:
    """Each run reads what the buffers hold then: rank r holds r + k on run k, so the sum is
    G(G-1)/2 + G k, exactly, and the same bits on every rank. ``out=x`` is in place, as
    `hpcring.allreduce` takes it."""
    x = np.zeros(1001, dtype=np.float64)
    out = {"in place": None, "out=x": x}.get(placement, np.empty_like(x))
    p = hpcring.plan(x, algorithm=algorithm, comm=fresh_world, out=out)
    ok = True
    for k in range(4):
        x[:] = fresh_world.rank + k
        result = p() if k % 2 else (p.start(), p.wait())[1]
        ok &= result is (x if out is None else out)
        ok &= bool((result == G * (G - 1) / 2 + G * k).all()) and identical_everywhere(fresh_world, result)
    assert everywhere(fresh_world, ok)
    assert everywhere(fresh_world, p.algorithm in hpcring.ALGORITHMS and p.algorithm != "auto")
    p.free()


@pytest.mark.parametrize("op", ["sum", "max", "mean"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_a_large_plan_in_place_exchanges_halves(
    fresh_world: MPI.Intracomm, dtype: str, op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In place above PAIR_WHOLE_IN_PLACE bytes, two ranks swap halves, then results: runs in C
    and through start and wait give the closed form on a count that does not halve evenly, and the
    same bits on every rank. (On one node such a plan takes shared memory: off here, as across
    nodes.)"""
    if op == "mean" and dtype == "int32":
        pytest.skip("an integer mean is refused")
    monkeypatch.setenv("HPCRING_SHARED_MEMORY", "0")
    config.reload()
    count = PAIR_WHOLE_IN_PLACE // np.dtype(dtype).itemsize + 3
    x = np.zeros(count, dtype=dtype)
    p = hpcring.plan(x, op=op, algorithm="mpi", comm=fresh_world)
    ok = G != 2 or p._request.halves
    base = np.arange(count) % 7
    for k in range(4):
        x[:] = base + fresh_world.rank + k
        result = p() if k % 2 else (p.start(), p.wait())[1]
        if op == "max":
            want = base + (G - 1) + k
        else:
            want = G * (base + k) + G * (G - 1) // 2
            want = want / G if op == "mean" else want
        ok &= result is x and bool((result == want).all()) and identical_everywhere(fresh_world, result)
    assert everywhere(fresh_world, ok)
    p.free()


def _transport(p: hpcring.persistent.Plan) -> str:
    return type(p._request).__name__


@pytest.mark.parametrize("placement", ["in place", "out="])
@pytest.mark.parametrize(
    ("dtype", "op"), [("float32", "sum"), ("float64", "max"), ("int64", "prod"), ("float64", "mean")]
)
def test_a_plan_on_one_node_runs_through_shared_memory(
    fresh_world: MPI.Intracomm, dtype: str, op: str, placement: str, request: pytest.FixtureRequest
) -> None:
    """On one node, where the compiled core runs, a small plan's runs are memory written and read
    (hpcring/_c/shared.h), no message: every rank ends with MPI_Allreduce's result (bitwise, on
    values whose sum is exact), the same bits everywhere, run after run, through p() and through
    start and wait; the largest such plan (SHARED_BYTES) too, and one byte more takes messages."""
    if G == 1:
        pytest.skip("one rank has nothing to share")
    expected = "Shared" if core.active() and G <= SHARED_RANKS else None
    # where ranks outnumber cores (3 and 4 ranks here) plans take messages (`shared_plan`):
    # spinning waits here, so that shared memory is tested at every rank count
    polling.share(False)
    request.addfinalizer(polling.share)
    mpi_op = {"sum": MPI.SUM, "max": MPI.MAX, "prod": MPI.PROD, "mean": MPI.SUM}[op]
    ok = True
    for count in (1, 1000, SHARED_BYTES // np.dtype(dtype).itemsize):
        x = np.zeros(count, dtype=dtype)
        out = None if placement == "in place" else np.empty_like(x)
        p = hpcring.plan(x, op=op, algorithm="mpi", comm=fresh_world, out=out)
        ok &= expected is None or _transport(p) == expected
        for k in range(5):
            x[:] = (np.arange(count) % 3 + fresh_world.rank + k) % 5 + 1
            want = np.empty_like(x)
            fresh_world.Allreduce(x, want, op=mpi_op)
            if op == "mean":
                want = want / G
            result = p() if k % 2 else (p.start(), p.wait())[1]
            ok &= result is (x if out is None else out)
            ok &= bool(np.array_equal(result, want)) and identical_everywhere(fresh_world, result)
        p.free()
    above = hpcring.plan(np.ones(SHARED_BYTES // 4 + 1, np.float32), algorithm="mpi", comm=fresh_world)
    ok &= _transport(above) != "Shared"
    above.free()
    assert everywhere(fresh_world, ok)


def test_shared_memory_can_be_turned_off(fresh_world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch) -> None:
    """HPCRING_SHARED_MEMORY=0: the plan takes messages (two ranks: `Pair`), with the same result."""
    monkeypatch.setenv("HPCRING_SHARED_MEMORY", "0")
    config.reload()
    x = np.full(16, fresh_world.rank + 1.0)
    p = hpcring.plan(x, algorithm="mpi", comm=fresh_world)
    p()
    assert everywhere(fresh_world, _transport(p) != "Shared" and bool((x == G * (G + 1) / 2).all()))
    p.free()


def test_where_ranks_outnumber_cores_a_plan_takes_messages(
    fresh_world: MPI.Intracomm, request: pytest.FixtureRequest
) -> None:
    """Where waits give their core away (ranks outnumber cores, `hpcring.polling.shared`), a plan
    takes messages, with the same result; the rank count decides alike on every rank."""
    polling.share(True)
    request.addfinalizer(polling.share)
    x = np.full(16, fresh_world.rank + 1.0)
    p = hpcring.plan(x, algorithm="mpi", comm=fresh_world)
    p()
    assert everywhere(fresh_world, _transport(p) != "Shared" and bool((x == G * (G + 1) / 2).all()))
    p.free()


@pytest.mark.parametrize("placement", ["in place", "out="])
@pytest.mark.parametrize(
    ("dtype", "op"),
    [("float32", "sum"), ("float64", "max"), ("int64", "prod"), ("float32", "min"), ("float64", "mean")],
)
def test_a_small_plan_that_takes_messages_gives_the_checked_calls_bits(
    fresh_world: MPI.Intracomm, request: pytest.FixtureRequest, placement: str, dtype: str, op: str
) -> None:
    """Where a plan takes messages (waits give their core away), a small one runs the agreement's
    exchange without its header: two ranks one message each way (`Pair`), three or four its
    steps (`Steps`), past STEPS_BYTES MPI's persistent all-reduce. Every run gives the bits the
    checked call gives, NaNs and signed zeros included, the same on every rank."""
    from hpcring.persistent import STEPS_BYTES

    polling.share(True)
    request.addfinalizer(polling.share)
    itemsize = np.dtype(dtype).itemsize
    for count in (1, 7, STEPS_BYTES // itemsize, STEPS_BYTES // itemsize + 1):
        x = np.empty(count, dtype)
        out = None if placement == "in place" else np.empty_like(x)
        p = hpcring.plan(x, op=op, algorithm="mpi", comm=fresh_world, out=out)
        expected = "Pair" if G == 2 else "Steps" if count * itemsize <= STEPS_BYTES else "Prequest"
        ok = G == 1 or _transport(p) == expected
        for k in range(3):
            x[...] = (np.arange(count) % 5 + fresh_world.rank + k).astype(dtype)
            if dtype.startswith("float") and count > 4:
                x[:3] = [np.nan, -0.0, np.inf if fresh_world.rank % 2 else -np.inf]
            want = hpcring.allreduce(x.copy(), op=op, algorithm="mpi", comm=fresh_world)
            got = p()
            ok &= got.tobytes() == want.tobytes()
            assert identical_everywhere(fresh_world, got)
        assert everywhere(fresh_world, ok)
        p.free()


def test_mean_and_the_mpi_persistent_request(fresh_world: MPI.Intracomm) -> None:
    """`mpi` holds MPI-4's persistent all-reduce; mean divides after each run."""
    x = np.empty(64, dtype=np.float32)
    p = hpcring.plan(x, op="mean", algorithm="mpi", comm=fresh_world)
    ok = True
    for k in range(3):
        x[:] = 2 * fresh_world.rank + k
        p()
        ok &= bool((x == (G - 1) + k).all())
    assert everywhere(fresh_world, ok and (G == 1 or p._request is not None))
    p.free()


@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
def test_freed_plan_and_misuse_are_refused(fresh_world: MPI.Intracomm, algorithm: str) -> None:
    """p() runs straight where nothing needs checking; a started or freed plan still refuses it."""
    x = np.ones(8)
    p = hpcring.plan(x, algorithm=algorithm, comm=fresh_world)
    raises_everywhere(RuntimeError, "wait without a start", p.wait)
    p()
    p.start()
    raises_everywhere(RuntimeError, "started twice", p)
    p.wait()
    p()
    ok = bool((x == G**3).all())  # three runs, each a sum over G ranks
    p.free()
    raises_everywhere(RuntimeError, "was freed", p)
    assert everywhere(fresh_world, ok)


def test_mismatch_at_creation_raises_on_every_rank(fresh_world: MPI.Intracomm) -> None:
    if G == 1:
        pytest.skip("one rank cannot disagree with itself")
    x = np.ones(10 + (fresh_world.rank == G - 1))
    raises_everywhere(ValueError, "disagree on count", lambda: hpcring.plan(x, comm=fresh_world))
    y = np.ones(4)
    y.flags.writeable = fresh_world.rank != 0
    raises_everywhere(ValueError, "read-only", lambda: hpcring.plan(y, comm=fresh_world))
    assert everywhere(fresh_world, (x == 1).all())


@pytest.mark.waits_out
@pytest.mark.parametrize(("run", "sharing"), [("p()", False), ("start, wait", False), ("p()", True)])
def test_a_rank_that_never_starts_is_named(
    fresh_world: MPI.Intracomm, request: pytest.FixtureRequest, run: str, sharing: bool
) -> None:
    """A stall during a started plan is detected within the timeout, naming the rank (on one
    node through shared memory, which no MPI wait sees: the compiled wait, then Python's; where
    waits give their core away, by messages: `Pair`, `Steps`)."""
    if G == 1:
        pytest.skip("needs a rank to miss")
    if sharing:
        polling.share(True)
        request.addfinalizer(polling.share)
    timeout, missing = WAIT_OUT, G - 1
    p = hpcring.plan(np.ones(100), algorithm="mpi", comm=fresh_world, timeout=timeout)
    ok = not core.active() or G > SHARED_RANKS or polling.shared() or _transport(p) == "Shared"
    if fresh_world.rank != missing:
        start = time.monotonic()
        try:
            if run == "p()":
                p()
            else:
                p.start()
                p.wait()
            ok = False
        except hpcring.StallError as error:
            ok = error.missing == [missing] and timeout - 0.1 <= time.monotonic() - start <= timeout + 2.0
    assert everywhere(WORLD, ok)


def test_a_plan_on_changed_buffers_is_refused(fresh_world: MPI.Intracomm) -> None:
    """A torch tensor's storage can move under a plan (set_, resize_): the plan refuses to run
    on memory it was not made for, on every rank, instead of reducing stale memory."""
    torch = pytest.importorskip("torch")
    t = torch.ones(16, dtype=torch.float64)
    p = hpcring.plan(t, algorithm="ring", comm=fresh_world)
    p()
    ok = bool((t == G).all())
    t.set_(torch.ones(16, dtype=torch.float64))  # the same shape, other memory
    raises_everywhere(ValueError, "buffers changed", p)
    assert everywhere(fresh_world, ok and bool((t == 1).all()))
