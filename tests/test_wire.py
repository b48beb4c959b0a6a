"""wire=: every algorithm that moves data itself, both wire dtypes, in and out of place, at any
rank count: the same bits on every rank, the error within `hpcring.wire.error_bound` of a
float64 reference, the bytes the Channel counted equal to the formula in the wire's itemsize,
and the refusals (mpi, nccl, integers, odd wires, ranks that differ) raised on every rank."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring import algorithms, kernels, topology, wire
from hpcring.arrays import adapter_for
from hpcring.comm import channel_for

WORLD = MPI.COMM_WORLD
MOVERS = ["naive", "ps", "ring", "rabenseifner", "hierarchical"]
SIZES = [0, 1, 7, 1001]


def inputs(n: int, dtype: str = "float32") -> np.ndarray:
    """This rank's input: random normals, a different stream per rank."""
    return np.random.default_rng(1000 + WORLD.rank).standard_normal(n).astype(dtype)


def reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float64 sum over the ranks, and the sum of magnitudes the bound scales with."""
    exact, magnitude = np.empty(x.size), np.empty(x.size)
    WORLD.Allreduce(x.astype(np.float64), exact)
    WORLD.Allreduce(np.abs(x).astype(np.float64), magnitude)
    return exact, magnitude


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("wire_name", list(wire.WIRES))
@pytest.mark.parametrize("algorithm", MOVERS)
def test_identical_within_the_bound_and_half_the_bytes(
    algorithm: str, wire_name: str, in_place: bool
) -> None:
    channel = channel_for(WORLD, adapter_for(np.empty(0, np.float32)))
    nodes = topology.of(channel.comm)
    per_node = nodes.per_node[0] if nodes.two_level else 1
    position = (
        nodes.order.index(WORLD.rank) if algorithms.spec("allreduce", algorithm).ring_order else WORLD.rank
    )
    for n in SIZES:
        x = inputs(n)
        kept = x.copy()
        before = channel.bytes_sent
        out = hpcring.allreduce(
            x, algorithm=algorithm, wire=wire_name, out=None if in_place else np.empty_like(x)
        )
        sent = channel.bytes_sent - before
        assert everywhere(WORLD, in_place or np.array_equal(x, kept)), "out of place: x was changed"
        assert identical_everywhere(WORLD, out), (algorithm, wire_name, n)
        exact, magnitude = reference(kept)
        bound = wire.error_bound(algorithm, WORLD.size, wire_name, 2.0**-24, per_node)
        error = np.abs(out - exact) <= bound * magnitude
        assert everywhere(WORLD, error.all()), (algorithm, wire_name, n)
        narrowed = wire.WIRES[wire_name]
        formula = wire.bytes_sent(algorithm, n, 4, narrowed, WORLD.size, position, per_node) if n else 0
        assert everywhere(WORLD, sent == formula), (algorithm, wire_name, n, sent, formula)


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_float64_and_mean() -> None:
    x = inputs(513, "float64")
    out = hpcring.allreduce(x, op="mean", algorithm="ring", wire="float16", out=np.empty_like(x))
    exact, magnitude = reference(x)
    bound = wire.error_bound("ring", WORLD.size, "float16", 2.0**-53) * magnitude / WORLD.size
    assert identical_everywhere(WORLD, out) and out.dtype == np.float64
    assert everywhere(WORLD, (np.abs(out - exact / WORLD.size) <= bound + 1e-300).all())


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_narrowing_is_real() -> None:
    """A value bfloat16 cannot hold comes back rounded: the wire is not a no-op."""
    x = np.full(64, 1 + 2**-12, np.float32)
    hpcring.allreduce(x, algorithm="ring", wire="bfloat16")
    assert everywhere(WORLD, WORLD.size == 1 or not np.allclose(x, WORLD.size * (1 + 2**-12), rtol=2**-20))


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_auto_takes_wire_and_stays_identical() -> None:
    x = inputs(50_000)
    out = hpcring.allreduce(x, algorithm="auto", wire="bfloat16", out=np.empty_like(x))
    exact, magnitude = reference(x)
    assert identical_everywhere(WORLD, out)
    assert everywhere(
        WORLD,
        (np.abs(out - exact) <= wire.error_bound("ring", WORLD.size, "bfloat16", 2.0**-24) * magnitude).all(),
    )


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kwargs", "kind", "match"),
    [
        ({"algorithm": "mpi", "wire": "bfloat16"}, ValueError, "cannot narrow"),
        ({"algorithm": "nccl", "wire": "bfloat16"}, ValueError, "cannot narrow"),
        ({"wire": "int8"}, ValueError, "unknown wire"),
        ({"wire": ["bfloat16"]}, ValueError, "unknown wire"),
        ({"wire": "float16", "reproducible": True}, ValueError, "cannot be combined"),
    ],
)
def test_refused_on_every_rank(kwargs: dict, kind: type[Exception], match: str) -> None:
    x = inputs(10)
    kept = x.copy()
    raises_everywhere(kind, match, lambda: hpcring.allreduce(x, **kwargs))
    assert everywhere(WORLD, np.array_equal(x, kept))


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", ["int32", "int64", "float16", "complex64"])
def test_other_dtypes_refused_on_every_rank(dtype: str) -> None:
    x = np.arange(10).astype(dtype)
    kept = x.copy()
    raises_everywhere(
        TypeError, "applies to float32 and float64", lambda: hpcring.allreduce(x, wire="bfloat16")
    )
    assert everywhere(WORLD, np.array_equal(x, kept))


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_ranks_that_differ_on_wire_raise_everywhere() -> None:
    if WORLD.size == 1:
        pytest.skip("needs two ranks to differ")
    x = inputs(10)
    mine = "bfloat16" if WORLD.rank == 0 else None
    raises_everywhere(ValueError, "disagree on wire", lambda: hpcring.allreduce(x, wire=mine))
    # and the warm path: the same call twice, then one rank changes its wire
    for _ in range(2):
        hpcring.allreduce(x, wire="bfloat16")
    other = "float16" if WORLD.rank == WORLD.size - 1 else "bfloat16"
    raises_everywhere(ValueError, "disagree on wire", lambda: hpcring.allreduce(x, wire=other))


# ---- serially: the numerics and the bound --------------------------------------------------------


def test_round_trip_is_the_nearest_wire_value() -> None:
    x = np.array([1 + 2**-9, 1 + 3 * 2**-9, -3.14159, 65504.0, 1e-30], np.float32)
    y = x.copy()
    wire.round_trip(y, np.empty(x.size, wire.WIRES["bfloat16"]))
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x.astype(wire.WIRES["bfloat16"]).astype(np.float32))
    assert y[0] == 1.0 and y[1] == 1 + 4 * 2**-9  # round to nearest even


def test_narrowings_and_bound() -> None:
    assert wire.narrowings("ring", 4) == 4
    assert wire.narrowings("rabenseifner", 4) == 3 and wire.narrowings("rabenseifner", 3) == 3
    assert wire.narrowings("hierarchical", 8, per_node=2) == 4  # across 4 nodes; the node's sum stays wide
    assert wire.narrowings("naive", 1000) == 1 and wire.narrowings("ring", 1) == 0
    assert wire.error_bound("ring", 2, "bfloat16", 0.0) == 2 * 2**-8


def test_single_rank_copies_out_of_place() -> None:
    x = inputs(33)
    out = hpcring.allreduce(x, wire="bfloat16", comm=MPI.COMM_SELF, out=np.empty_like(x))
    np.testing.assert_array_equal(out, x)  # nothing travels: nothing is narrowed


# ---- GradientSync: wire= and error feedback ----------------------------------------------------


def run_steps(error_feedback: bool, steps: int = 64) -> tuple[float, hpcring.GradientSync]:
    """Rank 0's gradient is 1 + 2^-10 every step (bfloat16 rounds it to 1), the others' 0, so every
    sum is exact and only rank 0's own narrowing loses anything: the total over the steps."""
    g = np.zeros(16, np.float32)
    sync = hpcring.GradientSync(
        [g], op="sum", algorithm="ring", wire="bfloat16", error_feedback=error_feedback, comm=WORLD
    )
    total = 0.0
    for _ in range(steps):
        sync.grads[0][...] = (1 + 2**-10) if WORLD.rank == 0 else 0.0
        sync.ready_all()
        total += float(sync.wait()[0][0])
    return total, sync


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_error_feedback_keeps_and_applies_the_residual() -> None:
    steps, g = 64, 1 + 2**-10
    plain, _ = run_steps(False, steps)
    fed, sync = run_steps(True, steps)
    # Without it every step loses 2^-10 for good; with it the loss is at most what is held back now.
    # (one rank: nothing travels, nothing is narrowed)
    assert everywhere(WORLD, WORLD.size == 1 or abs(plain - steps * g) >= steps * 2**-10 * 0.99)
    assert everywhere(WORLD, abs(fed - steps * g) <= 2**-8)
    held = sync.residuals[0][0] if WORLD.rank == 0 else 0.0
    assert everywhere(WORLD, abs(fed + held - steps * g) <= 2**-16)  # nothing is lost: sent or held


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_gradient_sync_refuses_bad_wire_on_every_rank() -> None:
    ints = [np.zeros(4, np.int32)]
    raises_everywhere(ValueError, "applies to float32", lambda: hpcring.GradientSync(ints, wire="bfloat16"))
    floats = [np.zeros(4, np.float32)]
    raises_everywhere(ValueError, "needs a wire", lambda: hpcring.GradientSync(floats, error_feedback=True))
    if WORLD.size > 1:
        mine = "bfloat16" if WORLD.rank == 0 else None
        raises_everywhere(ValueError, "disagree", lambda: hpcring.GradientSync(floats, wire=mine))


def test_cost_model_halves_the_bytes() -> None:
    from hpcring.model.costs import NO_SOFTWARE, Link, predict

    link = Link(0.0, 1e-9)  # bandwidth only, no reductions, no software: the time is the bytes
    for algorithm in ("naive", "ps", "ring", "rabenseifner"):
        plain = predict(algorithm, 1 << 20, 4, link, gamma=0.0, software=NO_SOFTWARE)
        narrow = predict(algorithm, 1 << 20, 4, link, gamma=0.0, wire="bfloat16", software=NO_SOFTWARE)
        assert narrow == pytest.approx(plain / 2)


# ---- the wire pool: priced by the memory guard, settled after a failed call -----------------


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_memory_guard_prices_the_wire_buffers(monkeypatch) -> None:
    """With its scratch held the ring needs nothing more, but its wire buffers hold about a
    narrowed copy of the data."""
    from hpcring import config

    if WORLD.size == 1:
        pytest.skip("one rank narrows nothing")
    comm = WORLD.Dup()  # a fresh channel: no wire buffers held from earlier tests
    x = inputs(65536)  # 256 KiB of float32, 128 KiB on the wire
    out = np.empty_like(x)
    hpcring.allreduce(x, algorithm="ring", comm=comm, out=out)  # its scratch is held from now on
    monkeypatch.setenv("HPCRING_MEMORY_LIMIT", str(64 << 10))
    config.reload()
    try:
        hpcring.allreduce(x, algorithm="ring", comm=comm, out=out)  # nothing narrowed: fits
        raises_everywhere(
            MemoryError,
            "wire='bfloat16'",
            lambda: hpcring.allreduce(x, algorithm="ring", wire="bfloat16", comm=comm, out=out),
        )
        monkeypatch.setenv("HPCRING_MEMORY_LIMIT", str(1 << 20))
        config.reload()
        hpcring.allreduce(x, algorithm="ring", wire="bfloat16", comm=comm, out=out)
        monkeypatch.setenv("HPCRING_MEMORY_LIMIT", str(64 << 10))
        config.reload()  # the pool is held now: the same call needs nothing more
        hpcring.allreduce(x, algorithm="ring", wire="bfloat16", comm=comm, out=out)
        assert identical_everywhere(WORLD, out)
    finally:
        monkeypatch.delenv("HPCRING_MEMORY_LIMIT")
        config.reload()
        comm.Free()


def pool(ch: wire.WireChannel) -> tuple[set[int], int]:
    """The ids of the pooled wire buffers, and how many requests hold one."""
    return {id(buf) for bufs in ch._free.values() for buf in bufs}, len(ch._pending)


@pytest.fixture
def python_core() -> Iterator[None]:
    """The Python path's WireChannel and its pool of wire buffers, whose Channel calls a test can
    make fail: the compiled core runs a warm call's steps in C, with buffers of its own."""
    with kernels.using("python"):
        yield


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("algorithm", ["ring", "naive"])
@pytest.mark.usefixtures("python_core")
def test_a_failed_call_leaves_the_pool_as_before(algorithm: str, monkeypatch) -> None:
    """Every rank's second exchange raises (as a StallError would): the wire buffers taken for it
    go back to the pool, and the next call is right."""
    from hpcring.channel import Channel

    if WORLD.size == 1:
        pytest.skip("one rank narrows nothing")
    x = inputs(1001)
    hpcring.allreduce(x.copy(), algorithm=algorithm, wire="bfloat16")  # warm: the pool is filled
    ch = wire.channel(channel_for(WORLD, adapter_for(x)), wire.WIRES["bfloat16"])
    before = pool(ch)
    calls = {"n": 0}
    name, real = "sendrecv", Channel.sendrecv

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == (2 if algorithm == "ring" else 1):
            raise RuntimeError("injected failure")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Channel, name, failing)
    raises_everywhere(
        RuntimeError, "injected", lambda: hpcring.allreduce(x.copy(), algorithm=algorithm, wire="bfloat16")
    )
    monkeypatch.setattr(Channel, name, real)
    WORLD.Barrier()
    after = pool(ch)
    assert everywhere(WORLD, after[1] == 0 and after[0] >= before[0]), (before, after)
    out = hpcring.allreduce(x.copy(), algorithm=algorithm, wire="bfloat16")
    assert identical_everywhere(WORLD, out)


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("python_core")
def test_a_stalled_exchange_keeps_its_wire_buffers_out_of_the_pool(monkeypatch) -> None:
    """After a StallError MPI may still read or write the exchange's wire buffers (a send it could
    not finish, a receive it could not cancel): they must not go back to the pool, where a later
    call would reuse them."""
    from hpcring.channel import Channel
    from hpcring.errors import StallError

    if WORLD.size == 1:
        pytest.skip("one rank narrows nothing")
    x = inputs(1001)
    hpcring.allreduce(x.copy(), algorithm="ring", wire="bfloat16")  # warm: the pool is filled
    ch = wire.channel(channel_for(WORLD, adapter_for(x)), wire.WIRES["bfloat16"])
    lent: list[int] = []
    real = Channel.sendrecv

    def stalling(self, send, dest, recv, source):
        lent.extend((id(send), id(recv)))  # the wire buffers WireChannel lent this exchange
        raise StallError([dest], "an injected stall", 1.0)

    monkeypatch.setattr(Channel, "sendrecv", stalling)
    raises_everywhere(
        StallError, "injected", lambda: hpcring.allreduce(x.copy(), algorithm="ring", wire="bfloat16")
    )
    monkeypatch.setattr(Channel, "sendrecv", real)
    assert everywhere(WORLD, len(lent) == 2 and not set(lent) & pool(ch)[0])
    out = hpcring.allreduce(x.copy(), algorithm="ring", wire="bfloat16")
    assert identical_everywhere(WORLD, out)
