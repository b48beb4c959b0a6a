"""The training layer: iallreduce, GradientSync's buckets, the example's equivalence to one process.

Serial tests run on COMM_SELF; the mpi-marked ones pass at any rank count, every
assertion through `everywhere` so that no rank hangs while another fails.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring.training import GradientSync, plan_buckets

WORLD = MPI.COMM_WORLD
SELF = MPI.COMM_SELF
mpi = pytest.mark.mpi


# -- bucket planning (pure) --------------------------------------------------------------------


def test_buckets_reverse_order_first_smaller_one_dtype_each() -> None:
    shapes = [(100,)] * 6  # 800 bytes each in float64
    dtypes = [np.float64] * 4 + [np.float32] * 2
    buckets = plan_buckets(shapes, dtypes, bucket_bytes=1600, first_bucket_bytes=400)
    assert [b.members for b in buckets] == [[5], [4], [3, 2], [1, 0]]
    assert [b.dtype for b in buckets] == [np.float32, np.float32, np.float64, np.float64]
    assert buckets[0].nbytes == 400  # the small first bucket: one float32 gradient
    assert all(b.nbytes <= 1600 for b in buckets)


def test_oversized_gradient_gets_its_own_bucket() -> None:
    buckets = plan_buckets([(10,), (1000,), (10,)], [np.float64] * 3, 1024, 1024)
    assert [b.members for b in buckets] == [[2], [1], [0]]


# -- GradientSync on one process ---------------------------------------------------------------


def small_grads() -> list[np.ndarray]:
    return [np.full((3, 4), 1.0), np.arange(4, dtype=np.float32), np.full((4, 2), 2.0), np.zeros(2)]


def test_grads_are_views_into_buckets_no_copy() -> None:
    grads = small_grads()
    sync = GradientSync(grads, comm=SELF, bucket_bytes=64, first_bucket_bytes=16, algorithm="ring")
    for index, view in enumerate(sync.grads):
        b, _ = sync._where[index]
        assert np.shares_memory(view, sync.buckets[b].buffer)
        assert view.shape == grads[index].shape and view.dtype == grads[index].dtype
        assert np.array_equal(view, grads[index])  # initial values copied once, at construction
    pointers = [view.ctypes.data for view in sync.grads]
    for index in reversed(range(len(sync))):
        sync.grads[index][...] = index + 1
        sync.ready(index)
    assert sync.wait() is sync.grads
    assert [view.ctypes.data for view in sync.grads] == pointers  # same memory, result in place
    assert all((view == index + 1).all() for index, view in enumerate(sync.grads))


def test_mixed_dtypes_go_to_separate_buckets() -> None:
    sync = GradientSync(small_grads(), comm=SELF)
    for bucket in sync.buckets:
        assert all(sync.grads[i].dtype == bucket.dtype == bucket.buffer.dtype for i in bucket.members)
    assert {b.dtype for b in sync.buckets} == {np.dtype(np.float32), np.dtype(np.float64)}


def test_wait_without_launch_is_refused() -> None:
    sync = GradientSync(small_grads(), comm=SELF)
    with pytest.raises(RuntimeError, match="no bucket was launched"):
        sync.wait()


def test_launching_twice_is_refused_and_missing_gradients_are_named() -> None:
    sync = GradientSync(small_grads(), comm=SELF, first_bucket_bytes=8)
    sync.ready(3)
    with pytest.raises(RuntimeError, match="launch twice"):
        sync.ready(3)
    with pytest.raises(RuntimeError, match="never marked ready"):
        sync.wait()


def test_changing_shapes_after_construction_is_refused() -> None:
    sync = GradientSync(small_grads(), comm=SELF)
    with pytest.raises(ValueError, match="registered as"):
        sync.ready(0, np.ones((4, 3)))
    sync.grads[2].shape = (8,)  # reshaping the view in place
    with pytest.raises(ValueError, match="changed after construction"):
        sync.ready(2)


def test_ready_with_fresh_array_copies_it_in() -> None:
    sync = GradientSync(small_grads(), comm=SELF, op="sum")
    fresh = [np.full(g.shape, 7, dtype=g.dtype) for g in sync.grads]
    for index in range(len(sync)):
        sync.ready(index, fresh[index])
    sync.wait()
    assert all((g == 7).all() for g in sync.grads)


def test_bad_gradient_list_is_refused() -> None:
    with pytest.raises(ValueError, match="not a NumPy or CuPy array"):
        GradientSync([np.ones(3), [1.0, 2.0]], comm=SELF)
    with pytest.raises(ValueError, match="cannot reduce"):
        GradientSync([np.ones(3, dtype=np.uint8)], comm=SELF)


def test_iallreduce_single_rank() -> None:
    x = np.arange(5.0)
    request = hpcring.iallreduce(x, comm=SELF)
    assert request.wait() is x and request.test()
    assert np.array_equal(x, np.arange(5.0))


def test_example_without_sklearn_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcring.examples import train

    monkeypatch.setitem(sys.modules, "sklearn", None)  # makes `import sklearn...` raise ImportError
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(SystemExit, match=r"pip install -e '.\[train\]' in hpcring's clone"):
        train.load_digits_split()


def test_info_reports_progress_mode() -> None:
    assert hpcring.info()["iallreduce_progress"] in ("thread", "inline")


# -- under MPI -------------------------------------------------------------------------------


@mpi
@pytest.mark.parametrize("algorithm", hpcring.ALGORITHMS)
def test_iallreduce_matches_closed_form(algorithm: str) -> None:
    n, size = 1001, WORLD.size
    x = np.full(n, float(WORLD.rank), dtype=np.float64)
    y = np.arange(n, dtype=np.float32) * (WORLD.rank + 1)
    out = np.empty_like(y)
    first = hpcring.iallreduce(x, algorithm=algorithm)
    second = hpcring.iallreduce(y, algorithm=algorithm, out=out, op="mean")
    ok = second.wait() is out and first.wait() is x
    ok &= bool((x == size * (size - 1) / 2).all())
    ok &= np.allclose(out, np.arange(n, dtype=np.float32) * (size + 1) / 2)
    ok &= bool((y == np.arange(n, dtype=np.float32) * (WORLD.rank + 1)).all())  # out-of-place
    assert everywhere(WORLD, ok)
    assert everywhere(WORLD, identical_everywhere(WORLD, out))


@mpi
def test_test_is_false_until_every_rank_arrives_then_wait_returns() -> None:
    if WORLD.size == 1:
        pytest.skip("a single rank never waits")
    x = np.full(100, float(WORLD.rank))
    if WORLD.rank == 0:
        time.sleep(0.5)
    request = hpcring.iallreduce(x)
    early = request.test()
    request.wait()
    ok = (WORLD.rank == 0 or not early) and request.test()
    ok &= bool((x == WORLD.size * (WORLD.size - 1) / 2).all())
    assert everywhere(WORLD, ok)


@mpi
def test_blocking_allreduce_on_same_comm_while_request_runs() -> None:
    """The worker has its own duplicate communicator: the main thread's calls do not collide."""
    big = np.full(1 << 18, 1.0)
    request = hpcring.iallreduce(big)
    small = np.full(10, 2.0)
    hpcring.allreduce(small)
    request.wait()
    assert everywhere(WORLD, bool((big == WORLD.size).all() and (small == 2.0 * WORLD.size).all()))


@mpi
def test_errors_come_out_of_wait_on_every_rank() -> None:
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    x = np.ones(10 + (WORLD.rank == 0))
    request = hpcring.iallreduce(x)
    raises_everywhere(ValueError, "disagree on count", request.wait)
    after = np.ones(4)  # the engine carries on with the next request
    hpcring.iallreduce(after).wait()
    assert everywhere(WORLD, bool((after == WORLD.size).all()))


@mpi
def test_an_argument_of_the_wrong_type_on_one_rank_raises_everywhere() -> None:
    """bucket_bytes=None on the last rank raised TypeError there alone; the others hung."""
    bucket = None if WORLD.rank == WORLD.size - 1 else 1 << 20
    last = WORLD.size - 1
    raises_everywhere(
        ValueError, f"rank {last}: bad argument", lambda: GradientSync([np.zeros(3)], bucket_bytes=bucket)
    )


@mpi
@pytest.mark.parametrize("difference", ["count", "shape", "dtype"])
def test_gradient_lists_differing_between_ranks_raise_at_construction(difference: str) -> None:
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    grads = [np.zeros((4, 3)), np.zeros(3)]
    odd = WORLD.rank == WORLD.size - 1
    if odd and difference == "count":
        grads.append(np.zeros(2))
    elif odd and difference == "shape":
        grads[0] = np.zeros((3, 4))
    elif odd:
        grads[1] = np.zeros(3, dtype=np.float32)
    match = "different numbers of gradients" if difference == "count" else "gradient"
    raises_everywhere(ValueError, match, lambda: GradientSync(grads))


@mpi
@pytest.mark.parametrize("algorithm", ["auto", "mpi", "ring"])
def test_gradient_sync_mean_over_ranks_with_overlap(algorithm: str) -> None:
    """Buckets whose algorithm has MPI's persistent all-reduce (mpi; auto, which picks it for
    these small buckets) run a plan made at their first launch; the others go through iallreduce."""
    grads = [np.zeros((50, 20)), np.zeros(20), np.zeros((20, 5), dtype=np.float32), np.zeros(5)]
    sync = GradientSync(grads, bucket_bytes=4096, first_bucket_bytes=256, algorithm=algorithm)
    for step in range(3):
        for index in reversed(range(len(sync))):
            sync.grads[index][...] = WORLD.rank + step + index
            sync.ready(index)
        sync.wait()
        expected = [(WORLD.size - 1) / 2 + step + index for index in range(len(sync))]
        ok = all(np.allclose(g, e) for g, e in zip(sync.grads, expected, strict=True))
        assert everywhere(WORLD, ok)
        assert everywhere(WORLD, all(identical_everywhere(WORLD, g) for g in sync.grads))
    planned = [bucket.planned for bucket in sync.buckets]
    assert everywhere(WORLD, planned == [WORLD.size > 1 and algorithm != "ring"] * len(planned))


@mpi
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_training_matches_single_process(optimizer: str) -> None:
    """float64: the loss after every step equals one process's to 1e-9; weights identical on every rank."""
    pytest.importorskip("sklearn")
    from hpcring.examples.train import train

    settings = dict(epochs=1, batch=30, width=16, depth=2, optimizer=optimizer, dtype="float64", seed=3)
    settings.update(max_steps=4, record_losses=True, algorithm="ring", bucket_mb=0.001)
    lr = 1e-2 if optimizer == "adam" else 0.05
    ranks = train(WORLD, lr=lr, **settings)
    alone = train(SELF, lr=lr, **settings)
    relative = np.abs(np.array(ranks.losses) - alone.losses) / np.abs(alone.losses)
    assert everywhere(WORLD, len(ranks.losses) == 4 and bool((relative <= 1e-9).all()))
    assert everywhere(WORLD, len(set(map(tuple, WORLD.allgather(ranks.digests)))) == 1)  # after every step
    assert everywhere(WORLD, all(identical_everywhere(WORLD, p) for p in ranks.params))
    pairs = zip(ranks.params, alone.params, strict=True)
    close = all(np.allclose(p, q, rtol=1e-9, atol=1e-12) for p, q in pairs)
    assert everywhere(WORLD, close)
