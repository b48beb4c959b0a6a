"""hpcring.alltoall against MPI's own MPI_Alltoall and MPI_Alltoallv on the same inputs, written
for any rank count: every algorithm, dtypes MPI has no type for, blocks of zero, one and many
rows, rows of several elements, world, split and self communicators, the compiled core's
repeated calls; uneven blocks with and without recv_splits= and out=; the array kinds; the
non-blocking form; and every mismatch or bad argument raising on every rank, before any data
moves, with the arrays untouched, and a missing rank named by StallError.

Each element encodes (sender, receiver, position), so a block in the wrong place cannot pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from helpers import BACKENDS, WAIT_OUT, everywhere, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring import algorithms

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
EVERY = algorithms.portable("alltoall")
UNEVEN = (*algorithms.uneven("alltoall"), "auto")


@pytest.fixture(scope="module")
def comms() -> Iterator[dict[str, MPI.Intracomm]]:
    made = {"world": WORLD, "split": WORLD.Split(WORLD.rank % 2, -WORLD.rank), "self": MPI.COMM_SELF}
    yield made
    made["split"].Free()


def blocks(rank: int, counts: list[int], row: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Rank ``rank``'s input: ``counts[i]`` rows for rank i, each element 1000·sender + 100·receiver
    + its position in the block (mod 97, exact in every dtype)."""
    items = int(np.prod(row, dtype=np.int64))
    parts = [
        (1000 * (rank % 7) + 100 * (i % 7) + np.arange(c * items) % 97).reshape(c, *row)
        for i, c in enumerate(counts)
    ]
    return np.concatenate(parts).astype(np.float64).astype(dtype)


def library(comm: MPI.Intracomm, x: np.ndarray, sends: list[int], recvs: list[int]) -> np.ndarray:
    """MPI_Alltoallv of ``x``'s raw bytes (counts in rows): the reference, any dtype."""
    items = int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
    out = np.empty((sum(recvs), *x.shape[1:]), dtype=x.dtype)
    comm.Alltoallv(
        [x.reshape(-1).view(np.uint8), [s * items for s in sends], MPI.BYTE],
        [out.reshape(-1).view(np.uint8), [r * items for r in recvs], MPI.BYTE],
    )
    return out


@pytest.mark.parametrize("algorithm", EVERY)
def test_equal_blocks_are_mpi_alltoall(comms: dict[str, MPI.Intracomm], algorithm: str) -> None:
    ok = True
    for comm in comms.values():
        g, rank = comm.Get_size(), comm.Get_rank()
        for dtype in ("float64", "float32", "int32", "complex64", "float16", "bfloat16"):
            dt = np.dtype(dtype) if dtype != "bfloat16" else np.dtype(hpcring_bfloat16())
            for rows, row in ((0, ()), (1, ()), (3, (2,)), (257, ())):
                x = blocks(rank, [rows] * g, row, dt)
                kept = x.copy()
                want = library(comm, x, [rows] * g, [rows] * g)
                for _ in range(3):  # the third runs the compiled core's step table, where it runs
                    got = hpcring.alltoall(x, algorithm=algorithm, comm=comm)
                    ok &= got.shape == x.shape and got.tobytes() == want.tobytes()
                out = np.full_like(x, -1)
                for _ in range(3):  # the third, with out= too, is the warm call in C where it runs
                    out[...] = np.full_like(x, -1)
                    ok &= hpcring.alltoall(x, algorithm=algorithm, comm=comm, out=out) is out
                    ok &= out.tobytes() == want.tobytes() and x.tobytes() == kept.tobytes()
    assert everywhere(WORLD, ok)


def hpcring_bfloat16() -> np.dtype:
    from hpcring.ops import DTYPES

    return next(d for d in DTYPES if d.name == "bfloat16")


def uneven_counts(rank: int, g: int) -> list[int]:
    """Rows rank ``rank`` sends each rank: zeros among them, and different on every rank."""
    return [(3 * rank + 5 * i) % 4 for i in range(g)]


@pytest.mark.parametrize("algorithm", UNEVEN)
def test_uneven_blocks_are_mpi_alltoallv(comms: dict[str, MPI.Intracomm], algorithm: str) -> None:
    ok = True
    for comm in comms.values():
        g, rank = comm.Get_size(), comm.Get_rank()
        sends = uneven_counts(rank, g)
        recvs = [uneven_counts(i, g)[rank] for i in range(g)]  # what rank i sends this one
        ok &= hpcring.alltoall_splits(sends, comm=comm) == recvs
        for row in ((), (3,)):
            x = blocks(rank, sends, row, np.dtype(np.float32))
            kept = x.copy()
            want = library(comm, x, sends, recvs)
            for _ in range(3):
                got = hpcring.alltoall(x, send_splits=sends, algorithm=algorithm, comm=comm)
                ok &= got.shape == want.shape and got.tobytes() == want.tobytes()
                told = hpcring.alltoall(
                    x, send_splits=sends, recv_splits=recvs, algorithm=algorithm, comm=comm
                )
                ok &= told.tobytes() == want.tobytes()
            out = np.full_like(want, -1)
            hpcring.alltoall(x, send_splits=sends, algorithm=algorithm, comm=comm, out=out)
            ok &= out.tobytes() == want.tobytes() and x.tobytes() == kept.tobytes()
            unchecked = hpcring.alltoall(
                x, send_splits=sends, recv_splits=recvs, algorithm=algorithm, comm=comm, check=False
            )
            ok &= unchecked.tobytes() == want.tobytes()
    # recv_splits= alone: x cut into equal blocks, received as the senders say
    g, rank = WORLD.size, WORLD.rank
    x = blocks(rank, [2] * g, (), np.dtype(np.float64))
    got = hpcring.alltoall(x, recv_splits=[2] * g, algorithm=algorithm)
    ok &= got.tobytes() == library(WORLD, x, [2] * g, [2] * g).tobytes()
    assert everywhere(WORLD, ok)


def test_tensors_and_jax_arrays_come_back_as_themselves() -> None:
    g, rank = WORLD.size, WORLD.rank
    sends = uneven_counts(rank, g)
    recvs = [uneven_counts(i, g)[rank] for i in range(g)]
    x = blocks(rank, sends, (2,), np.dtype(np.float32))  # JAX's default dtype
    want = library(WORLD, x, sends, recvs)
    equal = blocks(rank, [3] * g, (), np.dtype(np.float32))
    want_equal = library(WORLD, equal, [3] * g, [3] * g)
    ok = True
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x.copy())
    got = hpcring.alltoall(t, send_splits=sends)
    ok &= isinstance(got, torch.Tensor) and got.numpy().tobytes() == want.tobytes()
    ok &= hpcring.alltoall(torch.from_numpy(equal)).numpy().tobytes() == want_equal.tobytes()
    jnp = pytest.importorskip("jax.numpy")
    a = jnp.asarray(x)
    got = hpcring.alltoall(a, send_splits=sends)
    ok &= type(got).__module__.startswith("jax") and np.asarray(got).tobytes() == want.tobytes()
    ok &= np.asarray(hpcring.alltoall(jnp.asarray(equal))).tobytes() == want_equal.tobytes()
    ok &= np.asarray(a).tobytes() == x.tobytes()
    assert everywhere(WORLD, ok)


@pytest.mark.parametrize("backend", BACKENDS)
def test_device_arrays_go_through_the_gpu_path(backend: str) -> None:
    """CuPy arrays (skipped without a GPU) as NumPy's: staged through host memory where MPI is
    not CUDA-aware; every algorithm, equal and uneven blocks."""
    xp = pytest.importorskip(backend)
    g, rank = WORLD.size, WORLD.rank
    sends = uneven_counts(rank, g)
    recvs = [uneven_counts(i, g)[rank] for i in range(g)]
    ok = True
    for uneven in (False, True):
        counts = sends if uneven else [3] * g
        host = blocks(rank, counts, (2,), np.dtype(np.float32))
        want = library(WORLD, host, counts, recvs if uneven else counts)
        for algorithm in UNEVEN if uneven else EVERY:
            got = hpcring.alltoall(
                xp.asarray(host), send_splits=sends if uneven else None, algorithm=algorithm
            )
            ok &= (
                type(got) is type(xp.asarray(host))
                and np.asarray(got.get() if backend == "cupy" else got).tobytes() == want.tobytes()
            )
    assert everywhere(WORLD, ok)


def test_the_non_blocking_form_gives_the_blocking_result() -> None:
    g, rank = WORLD.size, WORLD.rank
    comm = WORLD.Dup()
    sends = uneven_counts(rank, g)
    x = blocks(rank, sends, (), np.dtype(np.int64))
    y = blocks(rank, [4] * g, (), np.dtype(np.int64))
    uneven = hpcring.ialltoall(x, send_splits=sends, comm=comm)
    equal = hpcring.ialltoall(y, comm=comm)
    recvs = [uneven_counts(i, g)[rank] for i in range(g)]
    ok = uneven.wait().tobytes() == library(comm, x, sends, recvs).tobytes()
    ok &= equal.wait().tobytes() == library(comm, y, [4] * g, [4] * g).tobytes()
    comm.Free()
    assert everywhere(WORLD, ok)


# ---- mismatches and bad arguments: every rank raises, before any data moves --------------------


def test_mismatches_raise_on_every_rank_with_the_arrays_untouched() -> None:
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    g, rank = WORLD.size, WORLD.rank
    last = rank == g - 1
    x = blocks(rank, [2] * g, (), np.dtype(np.float64))
    kept = x.copy()
    out = np.full_like(x, -1.0)
    raises_everywhere(
        ValueError,
        "hpcring.alltoall: ranks disagree on count",
        lambda: hpcring.alltoall(x[: g if last else 2 * g], out=None),
    )
    raises_everywhere(  # one rank uneven, the others equal: named by what they passed
        ValueError,
        "send_splits= (rows of 1 elements) on rank",
        lambda: hpcring.alltoall(x, send_splits=[2] * g if last else None, out=None if last else out),
    )
    raises_everywhere(
        ValueError,
        "ranks disagree on algorithm",
        lambda: hpcring.alltoall(x, algorithm="mpi" if last else "auto"),
    )
    # recv_splits that do not match what the senders send: found by the counts' exchange, and
    # raised on every rank before the data moves
    recvs = [2] * g
    if last:
        recvs[0] = 3
    raises_everywhere(
        ValueError,
        f"rank {g - 1}'s recv_splits do not match what the ranks send it: "
        "recv_splits[0] is 3, rank 0 sends 2",
        lambda: hpcring.alltoall(x, send_splits=[2] * g, recv_splits=recvs),
    )
    short = np.full((2 * g - 1 if last else 2 * g,), -1.0)
    raises_everywhere(
        ValueError,
        f"rank {g - 1}'s out has {2 * g - 1} rows, but the ranks send it {2 * g}",
        lambda: hpcring.alltoall(x, send_splits=[2] * g, out=short),
    )
    assert everywhere(WORLD, x.tobytes() == kept.tobytes() and (out == -1).all() and (short == -1).all())
    hpcring.alltoall(x, send_splits=[2] * g)  # the communicator goes on


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda x, g, bad: hpcring.alltoall(x, send_splits=[2] * (g + bad)), "one entry per rank"),
        (lambda x, g, bad: hpcring.alltoall(x, send_splits=[2 + bad] + [2] * (g - 1)), "send_splits sum to"),
        (lambda x, g, bad: hpcring.alltoall(x, send_splits=[2 - 3 * bad, *[2] * (g - 1)]), "not be negative"),
        (lambda x, g, bad: hpcring.alltoall(x[: 2 * g - bad]), "does not split into"),
        (
            lambda x, g, bad: hpcring.alltoall(x, send_splits=[2] * g, algorithm="bruck" if bad else "mpi"),
            "runs equal blocks only",
        ),
        (lambda x, g, bad: hpcring.alltoall(x, out=x if bad else None), "out overlaps x"),
        (
            lambda x, g, bad: hpcring.alltoall(x, algorithm="tree" if bad else "auto"),
            "unknown algorithm 'tree'",
        ),
        (lambda x, g, bad: hpcring.alltoall(x[:1].reshape(()) if bad else x), "0-d array"),
    ],
    ids=["length", "sum", "negative", "divisible", "bruck-uneven", "overlap", "algorithm", "0-d"],
)
def test_a_bad_argument_on_one_rank_raises_on_every_rank(call: object, match: str) -> None:
    g = WORLD.size
    if g == 1 and match == "does not split into":
        pytest.skip("one rank: every first axis splits into one block")
    bad = WORLD.rank == g - 1
    x = blocks(WORLD.rank, [2] * g, (), np.dtype(np.float64))
    kept = x.copy()
    raises_everywhere(ValueError, match, lambda: call(x, g, bad))  # type: ignore[operator]
    assert everywhere(WORLD, x.tobytes() == kept.tobytes())


# ---- the check riding the exchange (hpcring.exchange.ride) ---------------------------------------


def test_the_checked_exchange_is_mpi_alltoall_on_either_side_of_its_size_limit() -> None:
    """auto's blocks travel with the header up to a size (`EAGER_UPTO`), past it after: both are
    MPI_Alltoall bitwise, on the Python path, its compiled program and the warm call in C, and
    with one rank on the pure-Python core while the others run in C (one protocol)."""
    from hpcring import exchange, kernels

    g, rank = WORLD.size, WORLD.rank
    most = (exchange.EAGER_UPTO.get(g) or 256 << 10) // 8 // g * g  # float64 elements, G blocks
    ok = True
    for count in (most, most + g):  # at the limit, one element a block past it
        x = (np.arange(count) + 10**6 * rank).astype(np.float64)
        want = np.empty_like(x)
        WORLD.Alltoall(x, want)
        out = np.full_like(x, -1.0)
        for _ in range(3):
            ok &= hpcring.alltoall(x).tobytes() == want.tobytes()
            out[...] = -1.0
            hpcring.alltoall(x, out=out)
            ok &= out.tobytes() == want.tobytes()
        with kernels.using("python" if rank == g - 1 else kernels.ACTIVE):
            out[...] = -1.0
            hpcring.alltoall(x, out=out)
            ok &= out.tobytes() == want.tobytes()
    assert everywhere(WORLD, ok)


@pytest.mark.parametrize("check", [True, False])
def test_blocks_sent_ahead_are_counted_and_named_pairwise(check: bool) -> None:
    """Where auto's blocks leave ahead of the agreement, each call's traffic counts exactly them
    ((G-1)/G of the input per rank, pairwise's formula) and the call is named pairwise, the
    pattern that moved them, in its flight record: on the Python path, its compiled program, the
    warm call in C and the pure-Python core; with check=False too, which posts them the same way
    with no agreement before them, out= or not."""
    from hpcring import exchange, flight, kernels
    from hpcring.arrays import adapter_for
    from hpcring.comm import channel_for, known_state

    g = WORLD.size
    x = np.arange(4 * g, dtype=np.float64) + 100 * WORLD.rank  # 32 bytes a block
    want = np.empty_like(x)
    WORLD.Alltoall(x, want)
    channel = channel_for(WORLD, adapter_for(x))
    ahead = exchange.auto_runs(WORLD, x)
    ok = ahead == ("pairwise" if g in (2, 3, 4) and known_state(WORLD).agreement.exchanging else None)
    out = np.full_like(x, -1.0)
    for core in (kernels.ACTIVE,) * 4 + ("python",) + (kernels.ACTIVE,) * 4:
        for given in (None, out):
            with kernels.using(core):
                before = channel.bytes_sent
                out[...] = -1.0
                got = hpcring.alltoall(x, check=check, out=given)
                sent = channel.bytes_sent - before
            ok &= got.tobytes() == want.tobytes() and (given is None or got is out)
            ran = flight.facts(known_state(WORLD).flight.recorded()[-1][1].call)["ran"]
            if ahead is not None:
                ok &= sent == (g - 1) * 32 and ran == "pairwise"
    assert everywhere(WORLD, ok)


def test_header_mismatches_on_warm_calls_raise_everywhere_with_out_unchanged() -> None:
    """The other ranks on a warm call in C with their blocks sent ahead, one rank with another
    count, dtype or a bad argument: every rank raises the agreement's error, no output is
    written, what was sent ahead is drained (the next call is right)."""
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    g, rank = WORLD.size, WORLD.rank
    last = rank == g - 1
    x = (np.arange(4 * g) + 100 * rank).astype(np.float64)
    want = np.empty_like(x)
    WORLD.Alltoall(x, want)
    out = np.full_like(x, -1.0)
    comm = WORLD.Dup()
    for _ in range(3):
        hpcring.alltoall(x, out=out, comm=comm)  # warm: from the third on, in C
    out[...] = -1.0
    longer = np.concatenate([x, x])
    raises_everywhere(
        ValueError,
        f"ranks disagree on count: {4 * g} elements in equal blocks on rank",
        lambda: hpcring.alltoall(
            longer if last else x, out=np.full_like(longer, -1.0) if last else out, comm=comm
        ),
    )
    raises_everywhere(
        ValueError,
        "ranks disagree on dtype: float64 on rank",
        lambda: hpcring.alltoall(x.astype(np.float32) if last else x, out=None if last else out, comm=comm),
    )
    frozen = np.full_like(x, -1.0)
    frozen.flags.writeable = False
    raises_everywhere(
        ValueError,
        "hpcring.alltoall: out is read-only",
        lambda: hpcring.alltoall(x, out=frozen if last else out, comm=comm),
    )
    ok = bool((out == -1.0).all())
    hpcring.alltoall(x, out=out, comm=comm)  # the communicator goes on, nothing left unmatched
    ok &= out.tobytes() == want.tobytes()
    comm.Free()
    assert everywhere(WORLD, ok)


def test_mismatches_on_warm_calls_that_make_their_output_leave_nothing_behind() -> None:
    """Warm calls in C that make their output (no out=), one rank with a longer block, a shorter
    one, another dtype of the same size, or in another collective: every rank raises, and the
    next calls, which send their blocks ahead again, get the right blocks. (A receive posted
    ahead of the verdict would take the longer block, which Open MPI 5.0 writes past the
    buffer's end: `hpcring.exchange.receive`.)"""
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    g, rank = WORLD.size, WORLD.rank
    last = rank == g - 1
    x = (np.arange(512 * g) + 1000 * rank).astype(np.float64)  # 4 KiB blocks
    want = np.empty_like(x)
    WORLD.Alltoall(x, want)
    comm = WORLD.Dup()
    for _ in range(3):
        hpcring.alltoall(x, comm=comm)  # warm: from the third on, in C
    ok = True
    odd = {
        "longer": (np.concatenate([x, x]), "ranks disagree on count"),
        "shorter": (x[: 256 * g], "ranks disagree on count"),
        "dtype": (x.view(np.int64), "ranks disagree on dtype"),
    }
    for case, (mine, match) in odd.items():
        raises_everywhere(
            ValueError, match, lambda mine=mine: hpcring.alltoall(mine if last else x, comm=comm, timeout=3.0)
        )
        for _ in range(2):  # a message left unmatched would be taken here, or stall these
            ok &= hpcring.alltoall(x, comm=comm, timeout=3.0).tobytes() == want.tobytes()
        assert everywhere(WORLD, ok), case

    def elsewhere() -> object:
        if last:
            return hpcring.allreduce(x.copy(), comm=comm, timeout=3.0)
        return hpcring.alltoall(x, comm=comm, timeout=3.0)

    raises_everywhere(ValueError, "ranks disagree on collective", elsewhere)
    for _ in range(2):
        ok &= hpcring.alltoall(x, comm=comm, timeout=3.0).tobytes() == want.tobytes()
    comm.Free()
    assert everywhere(WORLD, ok)


@pytest.mark.parametrize("warm", [False, True], ids=["first", "warm"])
def test_a_rank_in_another_collective_raises_on_every_rank(warm: bool) -> None:
    """One rank all-reduces while the others all-to-all (their blocks sent ahead; ``warm``: on
    their warm call in C): every rank names the difference at once, not after the timeout, and
    the blocks sent ahead are drained (the next all-to-all is right)."""
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    g, rank = WORLD.size, WORLD.rank
    comm = WORLD.Dup()
    x = np.arange(8.0 * g) + 100 * rank
    out = np.full_like(x, -1.0)
    if warm:
        for _ in range(3):
            hpcring.alltoall(x, out=out, comm=comm)
    else:
        hpcring.allreduce(np.ones(1), comm=comm)  # the communicator exists, the all-to-all is cold
    out[...] = -1.0

    def call() -> object:  # a stall would be a StallError after 3 s, not the ValueError
        if rank == g - 1:
            return hpcring.allreduce(x.copy(), comm=comm, timeout=3.0)
        return hpcring.alltoall(x, out=out, comm=comm, timeout=3.0)

    start = time.monotonic()
    raises_everywhere(ValueError, "ranks disagree on collective", call)
    quick = time.monotonic() - start < 2.5
    want = np.empty_like(x)
    WORLD.Alltoall(x, want)
    ok = quick and bool((out == -1.0).all() or rank == g - 1)
    ok &= hpcring.alltoall(x, comm=comm).tobytes() == want.tobytes()
    comm.Free()
    assert everywhere(WORLD, ok)


@pytest.mark.parametrize("form", ["equal", "uneven", "warm", "unchecked", "unchecked-warm"])
@pytest.mark.waits_out
def test_a_rank_that_never_arrives_is_named(form: str) -> None:
    """Checked or not (check=False's blocks, where they leave at once, wait as the checked call's
    do), on the Python path and the warm call in C."""
    if WORLD.size == 1:
        pytest.skip("needs a rank to miss")
    uneven, check = form == "uneven", not form.startswith("unchecked")
    g, missing, timeout = WORLD.size, WORLD.size - 1, WAIT_OUT  # only the stalled call has it
    comm = WORLD.Dup()
    hpcring.allreduce(np.ones(1), comm=comm)  # hpcring's own communicator exists on every rank
    if form.endswith("warm"):  # the stalled call is the warm call in C
        for _ in range(3):
            hpcring.alltoall(np.ones(2 * g), comm=comm, check=check)
    ok = True
    if WORLD.rank != missing:
        start = time.monotonic()
        try:
            hpcring.alltoall(
                np.ones(2 * g),
                send_splits=[2] * g if uneven else None,
                comm=comm,
                timeout=timeout,
                check=check,
            )
            ok = False
        except hpcring.StallError as error:
            elapsed = time.monotonic() - start
            ok = error.missing == [missing] and timeout - 0.1 <= elapsed <= timeout + 2.0
    assert everywhere(WORLD, ok)
    comm.Free()


def test_many_ranks_check_their_splits_in_two_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past TABLE_RANKS ranks the splits travel by an all-to-all of the counts and a verdict
    instead of one all-gather of every rank's: the same results, the same errors everywhere."""
    from hpcring import exchange

    monkeypatch.setattr(exchange, "TABLE_RANKS", 1)
    g, rank = WORLD.size, WORLD.rank
    sends = uneven_counts(rank, g)
    recvs = [uneven_counts(i, g)[rank] for i in range(g)]
    x = blocks(rank, sends, (), np.dtype(np.float64))
    want = library(WORLD, x, sends, recvs)
    ok = hpcring.alltoall(x, send_splits=sends).tobytes() == want.tobytes()
    ok &= hpcring.alltoall(x, send_splits=sends, recv_splits=recvs).tobytes() == want.tobytes()
    assert everywhere(WORLD, ok)
    if g > 1:
        wrong = list(recvs)
        if rank == g - 1:
            wrong[0] += 1
        raises_everywhere(
            ValueError,
            f"rank {g - 1}'s recv_splits do not match",
            lambda: hpcring.alltoall(x, send_splits=sends, recv_splits=wrong),
        )


@pytest.mark.parametrize("riding", [True, False], ids=["riding", "apart"])
def test_the_splits_ride_with_the_check_or_go_apart(monkeypatch: pytest.MonkeyPatch, riding: bool) -> None:
    """Up to 5 ranks every rank's splits ride with the agreement, so no all-gather of their own
    runs; forced apart, one does: the same results either way, and a wrong recv_splits= or out=
    on one rank raises on every rank, out untouched."""
    from hpcring import channel, exchange

    gathers: list[int] = []
    real = channel.Channel.table
    monkeypatch.setattr(channel.Channel, "table", lambda self, row: gathers.append(1) or real(self, row))
    if not riding:
        monkeypatch.setattr(exchange.Exchange, "riding_table", lambda self, now: None)
    comm, g, rank = WORLD.Dup(), WORLD.size, WORLD.rank
    sends = uneven_counts(rank, g)
    recvs = [uneven_counts(i, g)[rank] for i in range(g)]
    x = blocks(rank, sends, (3,), np.dtype(np.float32))
    want = library(WORLD, x, sends, recvs)
    out = np.full((sum(recvs), 3), -1, np.float32)
    ok = True
    for _ in range(3):
        ok &= hpcring.alltoall(x, send_splits=sends, comm=comm).tobytes() == want.tobytes()
        ok &= hpcring.alltoall(x, send_splits=sends, recv_splits=recvs, comm=comm).tobytes() == want.tobytes()
        ok &= hpcring.alltoall(x, send_splits=sends, out=out, comm=comm) is out
        ok &= out.tobytes() == want.tobytes()
    assert everywhere(WORLD, ok)
    assert everywhere(WORLD, (not gathers) if riding or g == 1 else len(gathers) == 9)
    if g > 1:
        last = rank == g - 1
        wrong = [r + (last and i == 0) for i, r in enumerate(recvs)]
        raises_everywhere(
            ValueError,
            f"rank {g - 1}'s recv_splits do not match",
            lambda: hpcring.alltoall(x, send_splits=sends, recv_splits=wrong, comm=comm),
        )
        short = np.full((sum(recvs) - last, 3), -1, np.float32)
        raises_everywhere(
            ValueError,
            f"rank {g - 1}'s out has",
            lambda: hpcring.alltoall(x, send_splits=sends, out=short, comm=comm),
        )
        assert everywhere(WORLD, (short == -1).all())
    comm.Free()
