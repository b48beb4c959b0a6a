"""The payload the agreement's collective carries: its reductions, serially.

A small `mpi` all-reduce rides with the agreement (hpcring/agreement.py), reduced by the
agreement's own MPI op (hpcring/_c/agree.h, and `agreement.combine_payload` on the pure-Python
core). MPI may combine the ranks' payloads in any tree and hand each rank's op its operands in
either order, so each reduction must be bitwise commutative (every rank then gets the same bits),
and the compiled op must give the reference's bits. Edge values (signed zeros, Infs, NaNs with
payloads, subnormals, extremes) and random bit patterns, for every pair a payload may carry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcring import agreement, core, kernels

OPS = {"sum": 0, "max": 1, "min": 2, "prod": 3}
CASES = [
    (name, op)
    for name in ("float32", "float64", "int32", "int64", "complex64", "complex128")
    for op in OPS
    if name.startswith(("float", "int")) or op == "sum"
]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def values(dtype: np.dtype, n: int, seed: int) -> np.ndarray:
    """Edge values and random bit patterns of ``dtype``, mixed."""
    rng = np.random.default_rng(seed)
    if dtype.kind == "c":
        part = np.dtype(np.float32 if dtype.itemsize == 8 else np.float64)
        return values(part, 2 * n, seed).view(dtype)
    edges = kernels._edge_values(dtype, n, seed)
    noise = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype)
    return np.where(rng.random(n) < 0.5, edges, noise)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize // (2 if a.dtype.kind == 'c' else 1)}"))


def combined(code: int, op: int, a: np.ndarray, b: np.ndarray, compiled: bool) -> np.ndarray:
    out = b.copy()
    if compiled:
        core.mpi_core()[0].combine_payload(code, op, a, out)
    else:
        agreement.combine_payload(code, op, a, out)
    return out


@pytest.mark.parametrize(("name", "op"), CASES)
def test_payload_reductions_commute_bitwise(name: str, op: str) -> None:
    dtype = np.dtype(name)
    code = kernels.DTYPE_CODES[dtype]
    a, b = values(dtype, 257, 1), values(dtype, 257, 2)
    b[:64] = a[:64]  # equal operands too (+0 and -0 are equal; NaNs are not)
    b[64:80] = -a[64:80] if dtype.kind != "u" else b[64:80]
    ab = combined(code, OPS[op], a, b, compiled=False)
    ba = combined(code, OPS[op], b, a, compiled=False)
    np.testing.assert_array_equal(bits(ab), bits(ba))


@pytest.mark.parametrize(("name", "op"), CASES)
def test_compiled_payload_reductions_are_the_references(name: str, op: str) -> None:
    if not core.active():
        pytest.skip(f"no compiled core here: {core.describe()[1]}")
    dtype = np.dtype(name)
    code = kernels.DTYPE_CODES[dtype]
    a, b = values(dtype, 1001, 3), values(dtype, 1001, 4)
    b[:100] = a[:100]
    np.testing.assert_array_equal(
        bits(combined(code, OPS[op], a, b, compiled=True)),
        bits(combined(code, OPS[op], a, b, compiled=False)),
    )


@pytest.mark.parametrize("name", ["float32", "float64", "complex64"])
@pytest.mark.parametrize("op", ["sum", "prod"])
def test_compiled_vector_sums_are_the_references(name: str, op: str) -> None:
    """The compiled sums and products run as one vector pass that picks the larger NaN's bits
    lane by lane: the same bits as the reference, places with two NaNs among ordinary ones."""
    if not core.active():
        pytest.skip(f"no compiled core here: {core.describe()[1]}")
    dtype = np.dtype(name)
    if dtype.kind == "c" and op == "prod":
        pytest.skip("complex payloads are sums")
    code = kernels.DTYPE_CODES[dtype]
    rng = np.random.default_rng(9)
    a = (rng.standard_normal(3001) * 10.0 ** rng.integers(-30, 30, 3001)).astype(dtype)
    b = (rng.standard_normal(3001) * 10.0 ** rng.integers(-30, 30, 3001)).astype(dtype)
    a[::7], b[::11] = np.nan, np.inf  # one-sided NaNs and Infs everywhere
    b[5] = -a[5]  # exact cancellation
    a[700], b[700] = values(dtype, 2, 5)[:1].repeat(2)  # edge values and two NaNs among the rest
    a[701], b[701] = np.nan, np.nan
    np.testing.assert_array_equal(
        bits(combined(code, OPS[op], a, b, compiled=True)),
        bits(combined(code, OPS[op], a, b, compiled=False)),
    )


@pytest.mark.parametrize("name", ["float32", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_are_associative_and_let_nan_win(name: str, op: str) -> None:
    dtype = np.dtype(name)
    code = kernels.DTYPE_CODES[dtype]
    a, b, c = values(dtype, 301, 5), values(dtype, 301, 6), values(dtype, 301, 7)
    left = combined(code, OPS[op], combined(code, OPS[op], a, b, False), c, False)
    right = combined(code, OPS[op], a, combined(code, OPS[op], b, c, False), False)
    np.testing.assert_array_equal(bits(left), bits(right))
    nan = np.isnan(a) | np.isnan(b) | np.isnan(c)
    assert np.isnan(left[nan]).all()
    zeros = np.array([0.0, -0.0], dtype)
    got = combined(code, OPS[op], zeros, zeros[::-1].copy(), False)
    want = 0.0 if op == "max" else -0.0
    assert all(np.signbit(v) == np.signbit(want) for v in got)


@pytest.mark.parametrize(
    ("dtype", "ufunc", "count", "rides"),
    [
        ("float64", "add", 1, True),
        ("float32", "maximum", agreement.SLOT // 4, True),
        ("float32", "maximum", agreement.SLOT // 4 + 1, False),  # too large for the slot
        ("int64", "multiply", 3, True),
        ("complex128", "add", 2, True),
        ("complex64", "multiply", 2, False),  # a complex product's NaNs depend on the order
        ("float16", "add", 2, False),  # MPI has no float16: `mpi` refuses it anyway
        ("float64", "add", 0, False),
    ],
)
def test_what_may_ride(dtype: str, ufunc: str, count: int, rides: bool) -> None:
    got = agreement.payload_descriptor(np.dtype(dtype), ufunc, count)
    assert (got != agreement.NO_PAYLOAD) == rides


# ---- the exchange's message: the header's maxima and two flags, the minima rebuilt -------------


def _header(full: list[int]) -> np.ndarray:
    """One rank's whole header (`Agreement._exchange`): its words, their negations, the verdict."""
    return np.array([*full, *[-v for v in full[:-1]], full[-1]], np.int64)


def _group(fulls: list[list[int]], sent: bool = False) -> np.ndarray:
    """The whole header of several ranks: the maxima of theirs, as the exchange combines them
    (``sent``: each one after the first as its message carries it, step by step)."""
    group = _header(fulls[0])
    for full in fulls[1:]:
        group = np.maximum(group, _sent(_header(full)) if sent else _header(full))
    return group


def _sent(h: np.ndarray) -> np.ndarray:
    """``h`` as its message carries it, rebuilt as a receiving rank rebuilds it (`_unpack`):
    received where the maxima end one word before the header does."""
    width = agreement.WIDTH
    inbox = np.zeros(2 * width, np.int64)
    inbox[width - 1 : 2 * width - 1] = h[:width]
    inbox[-1] = agreement._uniform(h.tolist())
    agreement._unpack(inbox)
    return inbox


_WORD = st.integers(0, 2)  # few values, so that rows are often one


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.lists(_WORD, min_size=agreement.WIDTH, max_size=agreement.WIDTH), min_size=2, max_size=4
    ),
    split=st.integers(1, 3),
)
def test_the_message_keeps_every_verdict_of_the_whole_header(rows: list[list[int]], split: int) -> None:
    """Two groups of ranks combined from the message (maxima and flags) reach the verdict, the
    payload's riding and the maxima that the whole header gives, whatever the rows are."""
    split = min(split, len(rows) - 1)
    for fulls in (rows, [[rows[0][0], *row[1:]] for row in rows]):  # any rows; one call number
        a, b = _group(fulls[:split]), _group(fulls[split:])
        whole, rebuilt = np.maximum(a, b), np.maximum(a, _sent(b))
        stepped = np.maximum(_group(fulls[:split], True), _sent(_group(fulls[split:], True)))
        for h in (whole, rebuilt, stepped):
            assert agreement._agreed(h.tolist()) == agreement._agreed(whole.tolist())
            assert agreement._carried(h.tolist()) == agreement._carried(whole.tolist())
            assert agreement._riding(h) == agreement._riding(whole)
        assert rebuilt[: agreement.WIDTH].tolist() == whole[: agreement.WIDTH].tolist()
        assert stepped[: agreement.WIDTH].tolist() == whole[: agreement.WIDTH].tolist()
        one = _group(fulls)  # where every column group holds one value, the message is exact
        assert agreement._uniform(one.tolist()) != 3 or np.array_equal(_sent(one), one)


# ---- riding, under MPI (1-4 ranks): the bits MPI gives, and every mismatch raised ---------------

# Counts of float32: in the header's message, apart from it (past PAIR_INLINE), the largest that
# rides on three or four ranks, and one past it (then MPI's own all-reduce moves it after the
# agreement).
# The largest that rides on two ranks out of place (not in place) comes too.
RIDING_COUNTS = [
    1,
    agreement.PAIR_INLINE // 4 + 1,
    agreement.TWO_RANKS // 4,
    agreement.PAIR_SLOT // 4,
    agreement.PAIR_SLOT // 4 + 1,
]


def _rank_values(dtype: np.dtype, count: int, rank: int) -> np.ndarray:
    """This rank's operands: edge values (NaN payloads, Infs, signed zeros, subnormals) and
    random bits, different on every rank; a NaN on every rank at a few places."""
    x = values(dtype, count, 11 + rank)
    if count > 8:
        x[:2] = np.array([np.nan, np.inf], dtype)
        x[2:4] = np.array([-0.0, np.inf if rank % 2 else -np.inf], dtype)
    return x


def _state(comm: Any) -> Any:
    from hpcring import engine

    return engine.known_state(comm)


def _near_mpis(comm: Any, dtype: np.dtype, count: int) -> None:
    """Ordinary values (no NaN, Inf or overflow): the exchange's sum is MPI_Allreduce's within
    the rounding of a sum of ``comm.size`` terms (the two associate differently)."""
    import hpcring
    from tests.helpers import everywhere

    rng = np.random.default_rng(40 + comm.rank)
    x = rng.standard_normal(count).astype(dtype)
    want = np.empty_like(x)
    comm.Allreduce(x, want)
    bound = np.empty_like(x)
    comm.Allreduce(np.abs(x), bound)
    got = hpcring.allreduce(x, algorithm="mpi", out=np.empty_like(x), comm=comm)
    tolerance = comm.size * np.finfo(dtype).eps * bound
    assert everywhere(comm, bool((np.abs(got - want) <= tolerance).all()))


@pytest.mark.mpi
@pytest.mark.parametrize("compiled", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("name", ["float32", "float64"])
@pytest.mark.parametrize("count", RIDING_COUNTS)
def test_float_sums_ride_with_mpis_bits(fresh_world: Any, compiled: bool, name: str, count: int) -> None:
    """A float sum rides with the agreement (up to PAIR_SLOT bytes where the ranks exchange
    messages; fewer on two ranks, `slot_bytes`): every rank gets the same bits, on the
    compiled core and the Python reference alike, warm and cold, in place and not; and so does a
    plan. On two ranks (and in the
    collective) those are MPI's own MPI_Allreduce's wherever at most one rank holds a NaN (of
    two NaNs the payload keeps the larger bits, where MPI's order decides); past two ranks the
    exchange's tree decides, and the bits are that tree's, computed here from every rank's
    operands (and within rounding of MPI's on ordinary values)."""
    import hpcring
    from tests.helpers import everywhere, exchange_grouping, identical_everywhere

    if compiled and not core.active():
        pytest.skip(f"no compiled core here: {core.describe()[1]}")
    kernels.select(None if compiled else "python")
    try:
        dtype = np.dtype(name)
        x = _rank_values(dtype, count, fresh_world.rank)
        want = np.empty_like(x)
        fresh_world.Allreduce(x, want)
        nans = np.empty(count, np.int32)
        fresh_world.Allreduce(np.isnan(x).astype(np.int32), nans)
        exact = nans < 2
        exchanged = fresh_world.size > 2 and agreement.exchanges(fresh_world.size)
        rides = count * dtype.itemsize <= agreement.slot_bytes(fresh_world.size)
        if exchanged and rides:  # the exchange's tree, not MPI's: its own bits, NaN pairs included
            want = exchange_grouping(fresh_world, x, "sum")
            exact = np.ones(count, bool)
        for _ in range(3):  # cold, then the warm call (in C where it runs)
            got = hpcring.allreduce(x, out=np.empty_like(x), algorithm="mpi", comm=fresh_world)
            inplace = hpcring.allreduce(x.copy(), algorithm="mpi", comm=fresh_world)
            for made in (got, inplace):
                assert identical_everywhere(fresh_world, made)
                assert everywhere(fresh_world, bool((bits(made)[exact] == bits(want)[exact]).all()))
                assert everywhere(fresh_world, bool(np.isnan(made[~exact]).all()))
        if exchanged and rides:
            _near_mpis(fresh_world, dtype, count)
        # a plan (on two ranks up to PAIR_SLOT bytes: a message each way and the same op): the same
        # bits; on more ranks MPI's persistent all-reduce, whose tree may differ from MPI_Allreduce's
        # (Open MPI 5 at 3 ranks, 64 KiB): the same bits on every rank
        exact_plan = exact if fresh_world.size <= 2 else np.zeros(count, bool)
        planned = hpcring.plan(x, algorithm="mpi", out=np.empty_like(x), comm=fresh_world)
        y = x.copy()
        in_place = hpcring.plan(y, algorithm="mpi", comm=fresh_world)
        for run in range(2):
            made = planned() if run else (planned.start(), planned.wait())[1]
            y[...] = x
            for result in (made, in_place()):
                assert identical_everywhere(fresh_world, result)
                same = bits(result)[exact_plan] == bits(want)[exact_plan]
                assert everywhere(fresh_world, bool(same.all()))
                assert everywhere(fresh_world, bool(np.isnan(result[nans > 0]).all()))
        mean = hpcring.allreduce(x, op="mean", algorithm="mpi", out=np.empty_like(x), comm=fresh_world)
        assert identical_everywhere(fresh_world, mean)
        state = _state(fresh_world)
        size, nbytes = fresh_world.size, count * dtype.itemsize
        # (rides or not, whether it should): on two ranks up to TWO_RANKS, in place TWO_RANKS_IN_PLACE
        fused = [
            (c.fuse != agreement.NO_PAYLOAD, nbytes <= agreement.slot_bytes(size, in_place=bool(c.in_place)))
            for c in state.warm.values()
            if c.options.op == "sum"
        ]
        if size > 1:  # one rank: nothing travels
            assert everywhere(fresh_world, all(got == want for got, want in fused))
            if size == 2 and agreement.TWO_RANKS_IN_PLACE < nbytes <= agreement.TWO_RANKS:
                assert everywhere(fresh_world, {want for _, want in fused} == {True, False})
    finally:
        kernels.select()


@pytest.mark.mpi
@pytest.mark.parametrize("compiled", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("count", [2, agreement.PAIR_INLINE // 4 + 1, agreement.PAIR_SLOT // 4])
def test_a_mismatch_while_riding_raises_everywhere_and_leaves_the_buffer(
    fresh_world: Any, compiled: bool, count: int
) -> None:
    """Ranks that carry different payloads (count, dtype, op), a different row, or a bad
    argument on one rank: every rank raises the mismatch, nobody's buffer changes, and the next
    call agrees again (nothing left over on the wire)."""
    import hpcring
    from tests.helpers import everywhere, raises_everywhere

    if fresh_world.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    if compiled and not core.active():
        pytest.skip(f"no compiled core here: {core.describe()[1]}")
    kernels.select(None if compiled else "python")
    try:
        last = fresh_world.rank == fresh_world.size - 1
        x = np.full(count, 1.5 + fresh_world.rank, np.float32)
        before = x.copy()

        def call(y: np.ndarray, **kw: Any) -> Any:
            return lambda: hpcring.allreduce(y, algorithm="mpi", comm=fresh_world, **kw)

        for _ in range(2):  # cold and warm: each rank's call is the same kind as the time before
            hpcring.allreduce(x.copy(), algorithm="mpi", comm=fresh_world)
            raises_everywhere(ValueError, "disagree on count", call(x[: count - 1] if last else x))
            raises_everywhere(ValueError, "disagree on dtype", call(x.astype(np.float64) if last else x))
            raises_everywhere(ValueError, "disagree on op", call(x, op="max" if last else "sum"))
            raises_everywhere(
                ValueError, "disagree on placement", call(x, out=None if last else np.empty_like(x))
            )
            raises_everywhere(
                TypeError,
                "rejected its input" if not last else "not supported",
                call(x.astype(np.int8) if last else x),
            )
            assert everywhere(fresh_world, bool((x == before).all()))
        total = hpcring.allreduce(x, algorithm="mpi", comm=fresh_world, out=np.empty_like(x))
        assert everywhere(fresh_world, bool((total == sum(1.5 + r for r in range(fresh_world.size))).all()))
    finally:
        kernels.select()


SENDS = (agreement.GIVE, agreement.SWAP)


@pytest.mark.parametrize("size", range(2, 18))
def test_exchange_steps_pair_up(size: int) -> None:
    """Every message of an exchange's steps has its receive on the other side, step for step,
    and every rank's result depends on every rank's contribution (recursive doubling)."""
    plans = {rank: list(agreement.steps(rank, size)) for rank in range(size)}
    sent = [(rank, peer) for rank, plan in plans.items() for kind, peer in plan if kind in SENDS]
    received = [(peer, rank) for rank, plan in plans.items() for kind, peer in plan if kind != agreement.GIVE]
    assert sorted(sent) == sorted(received) and len(set(sent)) == len(sent)
    known = {rank: {rank} for rank in range(size)}  # whose contributions each rank holds
    pending = {rank: 0 for rank in range(size)}
    while any(pending[r] < len(plans[r]) for r in range(size)):
        moved = False
        for rank in range(size):
            if pending[rank] == len(plans[rank]):
                continue
            kind, peer = plans[rank][pending[rank]]
            back = plans[peer][pending[peer]] if pending[peer] < len(plans[peer]) else None
            if kind == agreement.SWAP and back == (agreement.SWAP, rank):
                known[rank] = known[peer] = known[rank] | known[peer]
                pending[rank] += 1
                pending[peer] += 1
                moved = True
            elif (
                kind == agreement.GIVE
                and back is not None
                and back[1] == rank
                and back[0]
                in (
                    agreement.TAKE,
                    agreement.RESULT,
                )
            ):
                known[peer] = known[peer] | known[rank] if back[0] == agreement.TAKE else set(known[rank])
                pending[rank] += 1
                pending[peer] += 1
                moved = True
        assert moved, f"the steps deadlock at {size} ranks: {pending}"
    assert all(held == set(range(size)) for held in known.values())
