"""reduce_scatter, allgather and broadcast against MPI's own on the same buffers, written once for
any rank count: every algorithm, dtype and op, sizes 0, 1, below G and not divisible by G, on
world, split, dup and self communicators, in place and out of place; and a mismatch or a bad
argument on one rank raising on every rank with the buffers untouched.

Inputs are small integers, exact in every dtype and in any order of summation, so the result
of every algorithm must equal the library's bit for bit. MPI has no float16 or bfloat16 for a
reduction: there the reference is NumPy's over every rank's input (gathered as bytes).
"""

from __future__ import annotations

import inspect
import pickle
import time
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from helpers import WAIT_OUT, Verdicts, everywhere, identical_everywhere, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring import algorithms, collectives, core, engine, polling
from hpcring.comm import known_state
from hpcring.flight import AGREEMENT, MASK, MOVING
from hpcring.ops import DTYPES, OPS, kind
from hpcring.partition import segment, segment_bounds

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
NAMES = {collective: algorithms.portable(collective) for collective in algorithms.COLLECTIVES}
MPI_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}


@pytest.fixture(scope="module")
def comms() -> Iterator[dict[str, MPI.Intracomm]]:
    """The communicators every case runs on: made once for the module, freed at its end."""
    made = {
        "world": WORLD,
        "split": WORLD.Split(WORLD.rank % 2, -WORLD.rank),  # reversed order within each half
        "dup": WORLD.Dup(),
        "self": MPI.COMM_SELF,
    }
    yield made
    made["split"].Free()
    made["dup"].Free()


def sizes(comm: MPI.Intracomm) -> list[int]:
    """0, 1, below G, and not divisible by G."""
    g = comm.Get_size()
    return sorted({0, 1, max(g - 1, 0), 2 * g + 1, 101})


def inputs(rank: int, n: int, dtype: np.dtype, op: str) -> np.ndarray:
    """Small integers: any sum or product of a few ranks' is exact in every dtype."""
    i = np.arange(n)
    if op == "prod":
        values = 1 + (i + rank) % 2
    elif op in ("max", "min"):
        values = (7 * i + 3 * rank) % 11
    else:
        values = (i % 5) + rank + 1
    x = values.astype(np.float64).astype(dtype)
    if kind(dtype) == "c":
        x = x + (1j * (values % 3)).astype(dtype)
    return x


def gathered(comm: MPI.Intracomm, x: np.ndarray) -> np.ndarray:
    """Every rank's ``x``, stacked: MPI_Allgather of the raw bytes (any dtype travels)."""
    table = np.empty((comm.Get_size(), x.size), dtype=x.dtype)
    comm.Allgather(x.view(np.uint8), table.view(np.uint8))
    return table


def reduced(comm: MPI.Intracomm, x: np.ndarray, op: str) -> np.ndarray:
    """The reduction of every rank's ``x`` as the library gives it (NumPy's where it has no type)."""
    if x.dtype.name in ("float16", "bfloat16"):
        table = gathered(comm, x)
        result = getattr(np, OPS[op].ufunc).reduce(table, axis=0).astype(x.dtype) if x.size else x.copy()
    else:
        result = np.empty_like(x)
        comm.Allreduce(x, result, MPI_OPS[op])
    if op == "mean":
        np.true_divide(result, comm.Get_size(), out=result)
    return result


def cases() -> Iterator[tuple[np.dtype, str]]:
    for dtype in DTYPES:
        for op in OPS:
            if kind(dtype) in OPS[op].kinds:
                yield dtype, op


@pytest.mark.parametrize("algorithm", NAMES["reduce_scatter"])
def test_reduce_scatter_is_mpi_reduce_scatter(comms: dict[str, MPI.Intracomm], algorithm: str) -> None:
    bad = []
    for label, comm in comms.items():
        g, rank = comm.Get_size(), comm.Get_rank()
        for dtype, op in cases():
            for n in sizes(comm):
                x = inputs(rank, n, dtype, op)
                start, stop = segment(n, g, rank)
                want = reduced(comm, x, op)[start:stop]
                if dtype.name not in ("float16", "bfloat16") and op != "mean":  # MPI's own, too
                    own = np.empty(stop - start, dtype)
                    counts = [b - a for a, b in segment_bounds(n, g)]
                    comm.Reduce_scatter(x, own, counts, MPI_OPS[op])
                    if own.tobytes() != want.tobytes():
                        bad.append(("reference", label, dtype.name, op, n))
                kept = x.copy()
                got = hpcring.reduce_scatter(x, op=op, algorithm=algorithm, comm=comm)
                if (
                    got.tobytes() != want.tobytes()
                    or got.shape != (stop - start,)
                    or x.tobytes() != kept.tobytes()
                ):
                    bad.append(("new", label, dtype.name, op, n))
                out = np.full(stop - start, 99, dtype)
                if hpcring.reduce_scatter(x, op=op, algorithm=algorithm, comm=comm, out=out) is not out:
                    bad.append(("out is returned", label, dtype.name, op, n))
                if out.tobytes() != want.tobytes():
                    bad.append(("out", label, dtype.name, op, n))
                mine = x[start:stop]  # in place: this rank's own part of x
                if hpcring.reduce_scatter(x, op=op, algorithm=algorithm, comm=comm, out=mine) is not mine:
                    bad.append(("in place is returned", label, dtype.name, op, n))
                if mine.tobytes() != want.tobytes():
                    bad.append(("in place", label, dtype.name, op, n))
    assert everywhere(WORLD, not bad), bad[:5]


@pytest.mark.parametrize("algorithm", ["mpi", "auto"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_an_out_of_the_call_s_own_kind_is_served_warm(
    fresh_world: MPI.Intracomm, full_path: list[int], collective: str, algorithm: str
) -> None:
    """A new ``out=`` on each call (as an FSDP step passes) runs the warm call, not the full path's
    validation and setup each time, and the result lands in it; so do calls in place (x's own
    part as out, or x a row of out) once one has run. An out of another size is refused."""
    g, rank, n = fresh_world.size, fresh_world.rank, 7
    run = getattr(hpcring, collective)
    x = np.arange(n * g if collective == "reduce_scatter" else n, dtype=np.float64) + rank
    if collective == "reduce_scatter":
        start, stop = segment(x.size, g, rank)
        want = (np.arange(x.size, dtype=np.float64) * g + g * (g - 1) / 2)[start:stop]
        shape: tuple[int, ...] = (stop - start,)
    else:
        want = np.arange(n, dtype=np.float64) + np.arange(g, dtype=np.float64)[:, None]
        shape = (g, n)
    ok = True
    for _ in range(3):
        out = np.full(shape, -1.0)
        got = run(x, comm=fresh_world, algorithm=algorithm, out=out)
        ok = ok and got is out and np.array_equal(out, want)
    assert everywhere(fresh_world, bool(ok) and len(full_path) == 1)  # the first call's, then warm
    wrong = np.empty(shape[-1] + 1)
    raises_everywhere(ValueError, "out must have", lambda: run(x, comm=fresh_world, out=wrong))
    full_path.clear()
    for _ in range(3):  # in place: the first call takes the full path, the next ones the warm call
        if collective == "reduce_scatter":  # out= x's own part
            ours = x.copy()
            out = ours[start:stop]
        else:  # x is this rank's row of out
            out = np.full(shape, -1.0)
            ours = out[rank]
            ours[...] = x
        got = run(ours, comm=fresh_world, algorithm=algorithm, out=out)
        ok = ok and got is out and np.array_equal(out, want)
    assert everywhere(fresh_world, bool(ok) and len(full_path) == 1)


@pytest.mark.parametrize("algorithm", NAMES["allgather"])
def test_allgather_is_mpi_allgather(comms: dict[str, MPI.Intracomm], algorithm: str) -> None:
    bad = []
    for label, comm in comms.items():
        g, rank = comm.Get_size(), comm.Get_rank()
        for dtype in DTYPES:
            for n in sizes(comm):
                x = inputs(rank, n, dtype, "sum").reshape(n, 1) if n % 2 else inputs(rank, n, dtype, "sum")
                want = gathered(comm, x.reshape(-1)).reshape(g, *x.shape)
                got = hpcring.allgather(x, algorithm=algorithm, comm=comm)
                if got.shape != (g, *x.shape) or got.tobytes() != want.tobytes():
                    bad.append(("new", label, dtype.name, n))
                out = np.zeros((g, *x.shape), dtype)
                if hpcring.allgather(x, algorithm=algorithm, comm=comm, out=out) is not out:
                    bad.append(("out is returned", label, dtype.name, n))
                if out.tobytes() != want.tobytes() or not identical_everywhere(comm, out):
                    bad.append(("out", label, dtype.name, n))
                out = np.zeros((g, *x.shape), dtype)
                out[rank] = x  # in place: x is this rank's row of out
                hpcring.allgather(out[rank], algorithm=algorithm, comm=comm, out=out)
                if out.tobytes() != want.tobytes():
                    bad.append(("in place", label, dtype.name, n))
    assert everywhere(WORLD, not bad), bad[:5]


@pytest.mark.parametrize("algorithm", NAMES["broadcast"])
def test_broadcast_is_mpi_bcast(comms: dict[str, MPI.Intracomm], algorithm: str) -> None:
    bad = []
    for label, comm in comms.items():
        rank = comm.Get_rank()
        for dtype in DTYPES:
            for n in sizes(comm):
                for root in range(comm.Get_size()):
                    want = inputs(root, n, dtype, "sum")
                    x = inputs(rank, n, dtype, "sum")
                    reference = x.copy()
                    comm.Bcast(reference.view(np.uint8), root)  # MPI's own, on the bytes
                    if hpcring.broadcast(x, root=root, algorithm=algorithm, comm=comm) is not x:
                        bad.append(("x is returned", label, dtype.name, n, root))
                    if x.tobytes() != want.tobytes() or x.tobytes() != reference.tobytes():
                        bad.append(("value", label, dtype.name, n, root))
    assert everywhere(WORLD, not bad), bad[:5]


def test_large_buffers_stream_through_every_algorithm(comms: dict[str, MPI.Intracomm]) -> None:
    """Sizes past the broadcast chain's chunk and with segments of several chunks."""
    comm, n = comms["world"], (1 << 18) + 3
    x = inputs(comm.Get_rank(), n, np.dtype(np.float32), "sum")
    ok = True
    for algorithm in NAMES["broadcast"]:
        y = x.copy()
        hpcring.broadcast(y, root=comm.Get_size() - 1, algorithm=algorithm, comm=comm)
        ok &= y.tobytes() == inputs(comm.Get_size() - 1, n, x.dtype, "sum").tobytes()
    want = reduced(comm, x, "sum")
    start, stop = segment(n, comm.Get_size(), comm.Get_rank())
    for algorithm in NAMES["reduce_scatter"]:
        ok &= (
            hpcring.reduce_scatter(x, algorithm=algorithm, comm=comm).tobytes() == want[start:stop].tobytes()
        )
    for algorithm in NAMES["allgather"]:
        ok &= hpcring.allgather(x, algorithm=algorithm, comm=comm).tobytes() == gathered(comm, x).tobytes()
    assert everywhere(WORLD, ok)


def test_non_blocking_forms_give_the_blocking_results(comms: dict[str, MPI.Intracomm]) -> None:
    comm = comms["dup"]
    g, rank = comm.Get_size(), comm.Get_rank()
    x = inputs(rank, 37, np.dtype(np.float64), "sum")
    parts = hpcring.ireduce_scatter(x, comm=comm)
    rows = hpcring.iallgather(x, comm=comm)
    y = x.copy()
    sent = hpcring.ibroadcast(y, root=g - 1, comm=comm)
    start, stop = segment(37, g, rank)
    ok = parts.wait().tobytes() == reduced(comm, x, "sum")[start:stop].tobytes()
    ok &= rows.wait().tobytes() == gathered(comm, x).tobytes()
    ok &= sent.wait() is y and y.tobytes() == inputs(g - 1, 37, x.dtype, "sum").tobytes()
    assert everywhere(WORLD, ok)


# ---- disagreements and bad arguments raise on every rank, buffers untouched ----------------------


def test_mismatches_raise_on_every_rank() -> None:
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    last = WORLD.rank == WORLD.size - 1
    x = np.ones(12)
    kept = x.copy()
    raises_everywhere(
        ValueError,
        "hpcring.reduce_scatter: ranks disagree on count",
        lambda: hpcring.reduce_scatter(x[: 11 if last else 12]),
    )
    raises_everywhere(
        ValueError, "ranks disagree on dtype", lambda: hpcring.allgather(x.astype(np.float32) if last else x)
    )
    raises_everywhere(
        ValueError, "ranks disagree on op", lambda: hpcring.reduce_scatter(x, op="max" if last else "sum")
    )
    raises_everywhere(
        ValueError, "ranks disagree on root", lambda: hpcring.broadcast(x, root=1 if last else 0)
    )
    raises_everywhere(
        ValueError,
        "ranks disagree on algorithm",
        lambda: hpcring.allgather(x, algorithm="naive" if last else "ring"),
    )
    assert everywhere(WORLD, x.tobytes() == kept.tobytes())


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda x, bad: hpcring.broadcast(x, root=WORLD.size if bad else 0), "root must be a rank"),
        (lambda x, bad: hpcring.reduce_scatter(x[::2] if bad else x[:6]), "C-contiguous"),
        (lambda x, bad: hpcring.reduce_scatter(x, op="mean" if not bad else "and"), "unknown op"),
        (lambda x, bad: hpcring.allgather(x, out=np.empty(3) if bad else None), "out must have shape"),
        (
            lambda x, bad: hpcring.broadcast(x, algorithm="tree" if bad else "ring"),
            "unknown algorithm 'tree'",
        ),
    ],
    ids=["root", "contiguity", "op", "out", "algorithm"],
)
def test_a_bad_argument_on_one_rank_raises_on_every_rank(call: Any, match: str) -> None:
    bad = WORLD.rank == WORLD.size - 1
    x = np.arange(12, dtype=np.float64)
    kept = x.copy()
    raises_everywhere(ValueError, match, lambda: call(x, bad))
    assert everywhere(WORLD, x.tobytes() == kept.tobytes())


def test_first_calls_on_a_fresh_communicator() -> None:
    """Each collective as the first hpcring call on a communicator (its duplicate made then)."""
    ok = True
    for collective in ("reduce_scatter", "allgather", "broadcast"):
        comm = WORLD.Dup()
        x = np.full(5, WORLD.rank + 1.0)
        result = getattr(hpcring, collective)(x, comm=comm)
        if collective == "reduce_scatter":
            start, stop = segment(5, WORLD.size, WORLD.rank)
            ok &= bool((result == WORLD.size * (WORLD.size + 1) / 2).all()) and result.size == stop - start
        elif collective == "allgather":
            ok &= bool((result[:, 0] == np.arange(1, WORLD.size + 1)).all())
        else:
            ok &= bool((result == 1.0).all())
        comm.Free()
    assert everywhere(WORLD, ok)


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "broadcast"])
@pytest.mark.waits_out
def test_a_rank_that_never_arrives_is_named(collective: str) -> None:
    """The last rank skips a call on a communicator hpcring has used: the others raise StallError
    naming it within the timeout (plus the second they listen for the others' notices)."""
    if WORLD.size == 1:
        pytest.skip("needs a rank to miss")
    missing, timeout = WORLD.size - 1, WAIT_OUT
    comm = WORLD.Dup()
    hpcring.allreduce(np.ones(1), comm=comm)  # every rank: hpcring's own communicator exists now
    ok = True
    if WORLD.rank != missing:
        start = time.monotonic()
        try:
            getattr(hpcring, collective)(np.ones(100), comm=comm, timeout=timeout)
            ok = False
        except hpcring.StallError as error:
            elapsed = time.monotonic() - start
            ok = error.missing == [missing] and timeout - 0.1 <= elapsed <= timeout + 2.0
    assert everywhere(WORLD, ok)
    comm.Free()


def test_a_communicator_given_up_on_keeps_its_messages_to_itself() -> None:
    """What a rank that gave up sent and no rank received (its stall notice, its data for the
    skipped call) reaches no later communicator. MPICH gives a freed communicator's context id
    to the next one it makes, and a message still queued under the id is received there: a
    stale notice raised StallError in a healthy call, and data would be taken as data. The rank
    that gave up keeps the communicator (`polling.free`)."""
    if WORLD.size == 1:
        pytest.skip("needs a rank to send to")
    comm = WORLD.Dup()  # as hpcring's own duplicate of a user's communicator
    sent = np.full(2, 7.0)
    if WORLD.rank == 0:
        request = comm.Isend(sent, 1, 0)  # the skipped call's data: eager, never received
        polling.Waiter(comm).notify_all(call=7)  # and the notice of a rank that gives up
        request.Wait()
    WORLD.Barrier()
    polling.free(comm)
    ok, status = True, MPI.Status()
    for _ in range(3):
        fresh = WORLD.Dup()
        waiter = polling.Waiter(fresh)
        heard = waiter.listen(0.2, {fresh.rank}, fresh.size, 0.2)
        ok &= heard == {fresh.rank} and not waiter.heard
        ok &= not fresh.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        waiter.close()
        WORLD.Barrier()
        ok &= polling.free(fresh)  # nothing given up on: freed
    assert everywhere(WORLD, ok)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather", "broadcast"])
@pytest.mark.waits_out
def test_a_rank_that_skips_the_first_call(collective: str) -> None:
    """The last rank skips the first call on a fresh communicator: the others raise StallError at
    their deadline, saying that a rank did not arrive, not which (hpcring sends nothing on the
    user's communicator, and its own is what the first call makes)."""
    if WORLD.size == 1:
        pytest.skip("needs a rank to miss")
    missing, timeout = WORLD.size - 1, WAIT_OUT
    comm = WORLD.Dup()
    ok = True
    if WORLD.rank != missing:
        start = time.monotonic()
        try:
            getattr(hpcring, collective)(np.ones(100), comm=comm, timeout=timeout)
            ok = False
        except hpcring.StallError as error:
            elapsed = time.monotonic() - start
            ok = error.missing == [] and timeout - 0.1 <= elapsed <= timeout + 1.0
            ok &= str(error).startswith("hpcring: a rank did not arrive at the first hpcring call")
            ok &= "which rank cannot be known" in str(error)
    assert everywhere(WORLD, ok)
    comm.Free()


def test_tensors_and_jax_arrays_go_through_every_collective() -> None:
    """Every array kind the all-reduce takes: the output is of the input's kind."""
    g, rank = WORLD.size, WORLD.rank
    ok = True
    if _importable("torch"):
        import torch

        t = torch.full((6,), float(rank + 1))
        part = hpcring.reduce_scatter(t)
        rows = hpcring.allgather(t)
        sent = hpcring.broadcast(t.clone(), root=g - 1)
        ok &= isinstance(part, torch.Tensor) and bool((part == g * (g + 1) / 2).all())
        ok &= (
            isinstance(rows, torch.Tensor)
            and tuple(rows.shape) == (g, 6)
            and bool((rows[:, 0] == torch.arange(1, g + 1)).all())
        )
        ok &= bool((sent == g).all())
    if _importable("jax"):
        import jax.numpy as jnp

        a = jnp.full((6,), float(rank + 1))
        part = hpcring.reduce_scatter(a)
        rows = hpcring.allgather(a)
        sent = hpcring.broadcast(a, root=g - 1)
        start, stop = segment(6, g, rank)
        ok &= part.shape == (stop - start,)
        ok &= bool((part == g * (g + 1) / 2).all()) and rows.shape == (g, 6) and bool((sent == g).all())
        ok &= bool((a == rank + 1).all())  # a JAX array is never written
    assert everywhere(WORLD, ok)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# ---- the warm call in C: the Python path's guarantees, kept ------------------------------------

# Whether the compiled core serves warm calls here (not under HPCRING_CORE=python): then a warm
# NumPy reduce_scatter or allgather runs from its third call on without entering the engine's
# Python Call (its first call is the full path's, its second records the program), on one rank too.
IN_C = core.active() and not isinstance(engine.call, types.FunctionType)


def warm_table(comm: MPI.Intracomm) -> int:
    """The warm calls the compiled core lists for ``comm``."""
    state = known_state(comm)
    table = None if state is None else state.made.get("compiled-warm-calls")
    return 0 if table is None else table.count()


def last_slot(comm: MPI.Intracomm) -> Any:
    """The flight record's slot of the last call on ``comm``."""
    flight = known_state(comm).flight
    return flight.slots[flight.seq & MASK]


def placed(collective: str, variant: str, x: np.ndarray, g: int, rank: int) -> tuple[np.ndarray, Any]:
    """(x, out) for one call: ``variant`` "new" (no out=), "out" (out= apart from x) or "in place"
    (out= x's own part; x this rank's row of out); x copied, out filled with a sentinel."""
    if collective == "reduce_scatter":
        start, stop = segment(x.size, g, rank)
        ours = x.copy()
        if variant == "in place":
            return ours, ours[start:stop]
        return ours, None if variant == "new" else np.full(stop - start, -7, x.dtype)
    out = np.full((g, *x.shape), -7, x.dtype)
    if variant == "in place":
        out[rank] = x
        return out[rank], out
    return x.copy(), None if variant == "new" else out


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "auto"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_a_warm_call_runs_in_c_with_the_python_path_s_bits(
    fresh_world: MPI.Intracomm, full_path: list[int], python_runs: list[int], collective: str, algorithm: str
) -> None:
    """Each placement, run six times: the full path once, the Python warm call once (it records
    the program), then the compiled core's warm call, listed in its table; every call gives the
    first call's bits (Python's algorithm), and, under mpi, MPI_Reduce_scatter's or
    MPI_Allgather's on the same inputs. Inputs are random floats: the order of a sum shows."""
    g, rank = fresh_world.size, fresh_world.rank
    verdicts = Verdicts(fresh_world)
    run = getattr(hpcring, collective)
    for n in (1, 2 * g + 1, 3000):
        x = np.random.default_rng(rank * 7919 + n).standard_normal(n).astype(np.float32)
        if collective == "reduce_scatter":
            start, stop = segment(n, g, rank)
            want = np.empty(stop - start, np.float32)
            fresh_world.Reduce_scatter(x, want, [b - a for a, b in segment_bounds(n, g)], MPI.SUM)
        else:
            want = np.empty((g, n), np.float32)
            fresh_world.Allgather(x, want)
        for variant in ("new", "out", "in place"):
            full_path.clear()
            python_runs.clear()
            before = warm_table(fresh_world)
            results = []
            for _ in range(6):
                ours, out = placed(collective, variant, x, g, rank)
                got = run(ours, algorithm=algorithm, comm=fresh_world, out=out)
                results.append(got.tobytes())
                where = f"{variant} n={n}"
                verdicts.check(where, returned_out=out is None or got is out)
            verdicts.check(where, same_bits_every_call=len(set(results)) == 1)
            if algorithm == "mpi":
                verdicts.check(where, mpi_s_bits=results[-1] == want.tobytes())
            if variant == "in place" and collective == "reduce_scatter" and not want.size:
                continue  # an empty own part shares no memory with x: out of place, the call before
            verdicts.check(where, full_path_once=len(full_path) == 1)
            if IN_C:
                verdicts.check(where, python_twice=len(python_runs) == 2)
                verdicts.check(where, listed=warm_table(fresh_world) == before + 1)
            slot = last_slot(fresh_world)  # the flight record of the last call: done, agreed on
            verdicts.check(where, recorded=slot.call.options.collective == collective)
            verdicts.check(where, done=slot.phase == MOVING and slot.end >= slot.start)  # its end stored
            verdicts.check(where, numbered=slot.number == (known_state(fresh_world).calls if g > 1 else 0))
    verdicts.settle()


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_a_call_on_one_rank_goes_warm_in_c_with_the_input_s_bits(python_runs: list[int], op: str) -> None:
    """One rank has nothing to exchange or agree on: an all-reduce (in place, out=) and a
    broadcast are served whole by the compiled core from their third call on, as on more ranks,
    and give back the input's bits (a mean of one is the value itself)."""
    comm = MPI.COMM_SELF.Dup()
    x0 = np.random.default_rng(5).standard_normal(7)
    bad = []
    for variant in ("in place", "out", "broadcast"):
        python_runs.clear()
        for _ in range(5):
            x, out = x0.copy(), None if variant != "out" else np.full(7, -7.0)
            if variant == "broadcast":
                got = hpcring.broadcast(x, algorithm="auto", comm=comm)
            else:
                got = hpcring.allreduce(x, op=op, algorithm="auto", comm=comm, out=out)
            if got is not (x if out is None else out) or got.tobytes() != x0.tobytes():
                bad.append((variant, "result"))
        if IN_C and len(python_runs) != 2:
            bad.append((variant, f"{len(python_runs)} calls in Python"))
        slot = last_slot(comm)
        if slot.number != 0 or slot.phase != MOVING or slot.end < slot.start:
            bad.append((variant, "flight record"))
    comm.Free()
    assert everywhere(WORLD, not bad), bad


@pytest.mark.parametrize("name", sorted(collectives.FRONTS))
def test_the_front_door_hands_the_engine_what_the_function_does(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """``hpcring.<name>``, behind the compiled core's front door where it runs, hands the engine's
    call exactly what the Python function does: x alone, and each keyword the function takes (an
    object of its own each time, so a keyword put in the wrong place shows)."""
    public, function = getattr(hpcring, name), getattr(collectives, name)
    if public is function:
        pytest.skip(f"no compiled core here: hpcring.{name} is the function itself")
    seen: list[tuple[Any, ...]] = []

    def record(*args: Any) -> None:
        seen.append(args)

    monkeypatch.setattr(collectives, "call", record)
    module = core.mpi_core()[0]
    module.set_fallback(record)  # a list is no warm call: the front door hands it on at once
    try:
        x = [1.0, 2.0]
        for keywords in [{}, *({keyword: object()} for keyword in function.__kwdefaults__)]:
            seen.clear()
            function(x, **keywords)
            public(x, **keywords)
            assert len(seen) == 2 and seen[0] == seen[1], (keywords, seen)
    finally:
        module.set_fallback(engine.python_call)
    assert public.__doc__ == function.__doc__ and public.__wrapped__ is function
    assert inspect.signature(public) == inspect.signature(function)
    assert pickle.loads(pickle.dumps(public)) is public  # by name, as a function is


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_a_mismatch_on_one_rank_after_the_call_went_warm_in_c_raises_everywhere(
    fresh_world: MPI.Intracomm, python_runs: list[int], collective: str
) -> None:
    """A call warm in C on every rank but the last, which differs (count, dtype, op, algorithm):
    the same ValueError on every rank, raised by the compiled core's own agreement on the others
    (the engine's Python Call never entered there), x and out untouched everywhere; the warm call
    then runs on as before."""
    g, rank = fresh_world.size, fresh_world.rank
    if g == 1:
        pytest.skip("one rank cannot disagree with itself")
    last = rank == g - 1
    run = getattr(hpcring, collective)
    x = np.arange(12, dtype=np.float64) + rank

    def good() -> bool:
        ours, out = placed(collective, "out", x, g, rank)
        got = run(ours, algorithm="ring", comm=fresh_world, out=out)
        return bool(np.array_equal(got, run(x, algorithm="ring", comm=fresh_world)))

    ok = all([good() for _ in range(3)])
    cases: list[tuple[str, np.ndarray, dict[str, Any]]] = [
        ("count", x[:11] if last else x, {}),
        ("dtype", x.astype(np.float32) if last else x, {}),
        ("algorithm", x, {"algorithm": "naive" if last else "ring"}),
    ]
    if collective == "reduce_scatter":
        cases.append(("op", x, {"op": "max" if last else "sum"}))
    for what, mine, kwargs in cases:
        ours, out = placed(collective, "out", mine, g, rank)
        kept, kept_out = ours.copy(), out.copy()
        python_runs.clear()
        kwargs = {"algorithm": "ring", **kwargs}
        raises_everywhere(
            ValueError,
            f"hpcring.{collective}: ranks disagree on {what}",
            lambda: run(ours, comm=fresh_world, out=out, **kwargs),  # noqa: B023
        )
        ok &= ours.tobytes() == kept.tobytes() and out.tobytes() == kept_out.tobytes()
        slot = last_slot(fresh_world)  # recorded as failed in the agreement, saying why
        ok &= slot.phase == -AGREEMENT and f"disagree on {what}" in slot.error
        if IN_C and not last:
            ok &= not python_runs
    ok &= good()
    assert everywhere(fresh_world, ok)


def misused(collective: str, what: str, x: np.ndarray, g: int, rank: int) -> tuple[np.ndarray, Any, str]:
    """(x, a bad out, what the full path says of it) on a warm call's path."""
    part = segment(x.size, g, rank) if collective == "reduce_scatter" else None
    shape = (part[1] - part[0],) if part else (g, *x.shape)
    if what == "size":
        return x, np.empty(shape[-1] + 1), "out must have"
    if what == "dtype":
        return x, np.empty(shape, np.float32), "out must have"
    if what == "read-only":
        out = np.empty(shape)
        out.flags.writeable = False
        return x, out, "out is read-only"
    if what == "strided":
        return x, np.empty((*shape[:-1], 2 * shape[-1]))[..., ::2], "out must be C-contiguous"
    # overlapping x other than as in place: part of x but not its own (reduce-scatter), x a row
    # of out but not its own (all-gather)
    if part:
        m, start = shape[0], 0 if part[0] else 1
        return x, x[start : start + m], "out overlaps x other than as x's own part"
    out = np.zeros((g, *x.shape))
    other = out[(rank + 1) % g]
    other[...] = x
    return other, out, "out overlaps x other than as x's row of out"


@pytest.mark.parametrize("what", ["size", "dtype", "read-only", "strided", "overlap"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_a_bad_out_on_one_rank_on_the_warm_path_raises_everywhere(
    fresh_world: MPI.Intracomm, python_runs: list[int], collective: str, what: str
) -> None:
    """out= misused on the last rank of a call warm in C (the compiled core's check refuses it,
    the full path says why): the same ValueError on every rank, raised on the others by the
    compiled core's agreement, x and every out untouched."""
    g, rank = fresh_world.size, fresh_world.rank
    if g == 1:
        pytest.skip("one rank cannot disagree with itself")
    last = rank == g - 1
    run = getattr(hpcring, collective)
    x = np.arange(4 * g, dtype=np.float64) + rank
    for _ in range(3):
        ours, out = placed(collective, "out", x, g, rank)
        run(ours, comm=fresh_world, out=out)
    ours, out = placed(collective, "out", x, g, rank)
    bad_x, bad_out, match = misused(collective, what, ours, g, rank)  # every rank raises what it says
    if last:
        ours, out = bad_x, bad_out
    kept, kept_out = ours.copy(), out.copy()
    python_runs.clear()
    raises_everywhere(ValueError, match, lambda: run(ours, comm=fresh_world, out=out))
    ok = ours.tobytes() == kept.tobytes() and out.tobytes() == kept_out.tobytes()
    if IN_C and not last:
        ok &= not python_runs
    assert everywhere(fresh_world, ok)


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_auto_s_warm_call_in_c_serves_only_the_choice_the_channel_holds(
    fresh_world: MPI.Intracomm, full_path: list[int], python_runs: list[int], collective: str
) -> None:
    """auto warm in C: each call is a use of its choice among the channel's schedules (as the
    Python path's look-up makes it: the least recently used go first); a choice the channel
    then holds otherwise, or no longer, takes the full path, which runs what the channel says
    or chooses again, never the choice the warm call was made with."""
    g, rank = fresh_world.size, fresh_world.rank
    if g == 1:
        pytest.skip("auto chooses nothing on one rank: its one rank copies x")
    run = getattr(hpcring, collective)
    x = np.arange(6 * g, dtype=np.float64) + rank
    want = run(x, comm=fresh_world, algorithm="mpi")
    ok = all(np.array_equal(run(x, algorithm="auto", comm=fresh_world), want) for _ in range(4))
    state = known_state(fresh_world)
    made = next(call for key, call in state.warm.items() if key[0] == collective and key[5] == "auto")
    schedules = made.channel.schedules()
    key = ("auto", collective, x.nbytes, False)
    ok &= schedules.get(key) == made.ran and len(full_path) == 2  # mpi's first call, auto's
    schedules.move_to_end(key, last=False)  # the least recently used
    python_runs.clear()
    ok &= np.array_equal(run(x, algorithm="auto", comm=fresh_world), want)
    ok &= next(reversed(schedules)) == key  # the warm call used it
    if IN_C:
        ok &= not python_runs
    other = "ring" if made.ran != "ring" else "mpi"
    schedules[key] = other  # the channel's choice is now another
    ok &= np.array_equal(run(x, algorithm="auto", comm=fresh_world), want)
    ok &= len(full_path) == 3
    now = next(call for k, call in state.warm.items() if k[0] == collective and k[5] == "auto")
    ok &= now.ran == other
    del schedules[key]  # dropped: chosen again (every rank is in the call)
    ok &= np.array_equal(run(x, algorithm="auto", comm=fresh_world), want)
    ok &= len(full_path) == 4 and key in schedules
    assert everywhere(fresh_world, bool(ok))


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
@pytest.mark.waits_out
def test_a_rank_that_misses_a_call_warm_in_c_is_named(python_runs: list[int], collective: str) -> None:
    """The last rank skips a call the others run warm in C: they raise StallError naming it
    within the timeout, from the compiled core's agreement (the Python Call never entered)."""
    if WORLD.size == 1:
        pytest.skip("needs a rank to miss")
    missing, timeout = WORLD.size - 1, WAIT_OUT
    comm = WORLD.Dup()
    run = getattr(hpcring, collective)
    x = np.ones(100)
    for _ in range(3):
        run(x, comm=comm, out=placed(collective, "out", x, WORLD.size, WORLD.rank)[1])
    ok = True
    if WORLD.rank != missing:
        python_runs.clear()
        start = time.monotonic()
        try:
            run(x, comm=comm, timeout=timeout, out=placed(collective, "out", x, WORLD.size, WORLD.rank)[1])
            ok = False
        except hpcring.StallError as error:
            elapsed = time.monotonic() - start
            ok = error.missing == [missing] and timeout - 0.1 <= elapsed <= timeout + 2.0
        if IN_C:
            ok &= not python_runs
    assert everywhere(WORLD, ok)
    comm.Free()


@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
def test_every_dtype_and_op_warm_in_c_gives_the_reference(
    comms: dict[str, MPI.Intracomm], python_runs: list[int], algorithm: str
) -> None:
    """Each dtype and op (mean's division included), five calls of one kind: the first two in
    Python, the rest in C where the compiled core runs; every one the library's result (NumPy's
    where it has no type), on every communicator."""
    bad = []
    for label, comm in comms.items():
        g, rank = comm.Get_size(), comm.Get_rank()
        n = 3 * g + 2
        in_c = IN_C
        for dtype, op in cases():
            x = inputs(rank, n, dtype, op)
            start, stop = segment(n, g, rank)
            want = reduced(comm, x, op)[start:stop].tobytes()
            python_runs.clear()
            for _ in range(5):
                out = np.full(stop - start, 99, dtype)
                hpcring.reduce_scatter(x, op=op, algorithm=algorithm, comm=comm, out=out)
                if out.tobytes() != want:
                    bad.append(("reduce_scatter", label, dtype.name, op))
            # left to Python: a mean the compiled core does not divide (but float32's and float64's),
            # and MPI_Reduce_scatter on a type MPI lacks (a user-defined op: no step table)
            divides = op != "mean" or dtype in (np.float32, np.float64)
            recorded = algorithm != "mpi" or dtype.name not in ("float16", "bfloat16")
            if in_c and divides and recorded and len(python_runs) > 2:
                bad.append(("reduce_scatter not in C", label, dtype.name, op))
            if op != "sum":
                continue
            rows = gathered(comm, x).tobytes()
            python_runs.clear()
            for _ in range(5):
                if hpcring.allgather(x, algorithm=algorithm, comm=comm).tobytes() != rows:
                    bad.append(("allgather", label, dtype.name))
            if in_c and len(python_runs) > 2:
                bad.append(("allgather not in C", label, dtype.name))
    assert everywhere(WORLD, not bad), bad[:5]
