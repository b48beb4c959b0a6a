"""Bad input raises on every rank, within seconds, and leaves the user's buffers as they were."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import everywhere, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring import config
from hpcring.arrays import adapter_for
from hpcring.comm import channel_for

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD


@pytest.mark.parametrize("algorithm", hpcring.ALGORITHMS)
def test_count_mismatch(algorithm: str) -> None:
    x = np.arange(10 + (WORLD.rank == WORLD.size - 1), dtype=np.float32)
    before = x.copy()
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    raises_everywhere(ValueError, "disagree on count", lambda: hpcring.allreduce(x, algorithm=algorithm))
    assert everywhere(WORLD, np.array_equal(x, before))


def test_dtype_mismatch_names_ranks() -> None:
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    x = np.ones(8, dtype=np.float64 if WORLD.rank == 0 else np.float32)
    raises_everywhere(ValueError, "float64 on rank 0", lambda: hpcring.allreduce(x))
    assert everywhere(WORLD, (x == 1).all())


def test_op_and_algorithm_mismatch() -> None:
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    x = np.ones(8)
    op = "max" if WORLD.rank == 1 else "sum"
    raises_everywhere(ValueError, "disagree on op", lambda: hpcring.allreduce(x, op=op))
    algorithm = "ps" if WORLD.rank == 0 else "ring"
    raises_everywhere(ValueError, "disagree on algorithm", lambda: hpcring.allreduce(x, algorithm=algorithm))
    assert everywhere(WORLD, (x == 1).all())


def test_placement_mismatch() -> None:
    """In place on some ranks, out= on others: refused as MPI refuses a partial MPI_IN_PLACE.
    Under auto it hung: a rank that had chosen for that size and placement ran its choice
    while another entered the table's broadcast."""
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    x = np.ones(256, dtype=np.float32)
    hpcring.allreduce(x.copy(), algorithm="auto")  # every rank has chosen for 1 KiB in place
    out = np.zeros_like(x) if WORLD.rank == 1 else None
    raises_everywhere(
        ValueError,
        "disagree on placement: in place on rank",
        lambda: hpcring.allreduce(x, algorithm="auto", out=out),
    )
    assert everywhere(WORLD, bool((x == 1).all()) and (out is None or (out == 0).all()))


def test_one_bad_rank_fails_everywhere() -> None:
    """A local mistake on the last rank becomes an error on all ranks, not a hang."""
    bad = WORLD.rank == WORLD.size - 1
    x = np.ones((6, 4))
    arg = x[:, ::2] if bad else np.ones((6, 2))  # non-contiguous on one rank only
    kept = arg.copy()
    raises_everywhere(ValueError, "C-contiguous", lambda: hpcring.allreduce(arg))
    assert everywhere(WORLD, np.array_equal(arg, kept))


@pytest.mark.parametrize(
    ("make", "kind", "match"),
    [
        (lambda: ([1.0, 2.0], None, {}), TypeError, "must be a numpy.ndarray"),
        (lambda: (np.ones(4), None, {"op": "avg"}), ValueError, "sum, mean, max, min, prod"),
        (lambda: (np.ones(4), None, {"algorithm": "tree"}), ValueError, "naive, ps, ring"),
        (lambda: (np.ones(4, dtype=np.int8), None, {}), TypeError, "int8 is not supported"),
        (lambda: (np.ones(4), np.empty(5), {}), ValueError, "out must have x's shape"),
        (lambda: (np.ones(4), np.empty(4, np.float32), {}), ValueError, "out must have x's shape"),
        (lambda: (np.ones(4), [0.0] * 4, {}), TypeError, "out must be a numpy.ndarray"),
        (lambda: (np.ones(8)[::2], None, {}), ValueError, "C-contiguous"),
        (lambda: (np.ones(4), np.empty((2, 4))[:, 0], {}), ValueError, "out must have"),
        (lambda: (np.ones(4), np.empty(8)[::2], {}), ValueError, "out must be C-contiguous"),
    ],
)
@pytest.mark.parametrize("check", [True, False])
def test_bad_arguments(make, kind, match, check: bool) -> None:
    x, out, kwargs = make()
    raises_everywhere(kind, match, lambda: hpcring.allreduce(x, out=out, check=check, **kwargs))


def test_read_only_and_overlap() -> None:
    x = np.ones(8)
    x.flags.writeable = False
    raises_everywhere(ValueError, "read-only", lambda: hpcring.allreduce(x))
    out = np.empty(8)
    out.flags.writeable = False
    raises_everywhere(ValueError, "out is read-only", lambda: hpcring.allreduce(np.ones(8), out=out))
    buf = np.ones(12)
    raises_everywhere(ValueError, "overlaps", lambda: hpcring.allreduce(buf[:8], out=buf[4:]))
    assert everywhere(WORLD, (buf == 1).all())
    # Read-only input is fine out of place.
    result = hpcring.allreduce(x, out=np.empty(8))
    assert everywhere(WORLD, (result == WORLD.size).all() and (x == 1).all())


def test_out_that_is_another_view_of_x_is_in_place() -> None:
    """out= the very bytes of x (another view, not the same object) is in place, not an overlap."""
    x = np.ones((2, 4))
    result = hpcring.allreduce(x, out=x.reshape(8))
    ok = result is x and (x == WORLD.size).all()  # in place returns x, as allreduce(x) does
    readonly = np.ones(8)
    readonly.flags.writeable = False  # in place, so refused like allreduce(readonly) itself
    view = readonly.view()
    raises_everywhere(ValueError, "x is read-only", lambda: hpcring.allreduce(readonly, out=view))
    assert everywhere(WORLD, bool(ok))


def test_out_x_is_the_in_place_call(fresh_world: MPI.Intracomm, full_path: list[int]) -> None:
    """out=x (the very object) is ``allreduce(x)``: in place, the same warm call (in C where the
    compiled core runs it), and a read-only x refused as in place. It once took the full path on
    every call, validation and agreement in Python: 8x the bare call at 64 KiB on 4 ranks."""
    x = np.ones(8)
    for _ in range(3):
        for out in (x, None):
            x[...] = 1
            result = hpcring.allreduce(x, out=out, comm=fresh_world)
            assert everywhere(fresh_world, result is x and bool((x == fresh_world.size).all()))
    assert everywhere(fresh_world, len(full_path) == 1)  # the first call's, then warm for both forms
    readonly = np.ones(8)
    readonly.flags.writeable = False
    raises_everywhere(ValueError, "x is read-only", lambda: hpcring.allreduce(readonly, out=readonly))


def test_out_on_x_bytes_with_another_dtype_or_strides_is_refused() -> None:
    """x's bytes seen as another dtype, or a strided view that starts at x and spans as many
    bytes, are not x: refused for what they are, not taken for in place (x unchanged)."""
    x = np.ones(8, dtype=np.float32)
    raises_everywhere(ValueError, "dtype", lambda: hpcring.allreduce(x, out=x.view(np.int32)))
    base = np.arange(16, dtype=np.float32)
    raises_everywhere(ValueError, "C-contiguous", lambda: hpcring.allreduce(base[:8], out=base[::2]))
    assert everywhere(WORLD, bool((x == 1).all() and (base == np.arange(16)).all()))


def test_bad_comm() -> None:
    raises_everywhere(TypeError, "intracommunicator", lambda: hpcring.allreduce(np.ones(2), comm="world"))
    null = MPI.COMM_NULL
    raises_everywhere(TypeError, "intracommunicator", lambda: hpcring.allreduce(np.ones(2), comm=null))


def test_duplicate_cached_and_released() -> None:
    """One private duplicate per user communicator, reused by every call, freed with the communicator."""
    comm = WORLD.Dup()
    x = np.ones(3)
    hpcring.allreduce(x, comm=comm)
    channel = channel_for(comm, adapter_for(x))
    private = channel.comm
    assert everywhere(WORLD, private != MPI.COMM_NULL and MPI.Comm.Compare(private, comm) == MPI.CONGRUENT)
    for _ in range(3):
        hpcring.allreduce(x, comm=comm)
    assert everywhere(WORLD, channel_for(comm, adapter_for(x)) is channel and channel.comm is private)
    comm.Free()
    assert everywhere(WORLD, private == MPI.COMM_NULL)


def test_host_messages_never_match_ours() -> None:
    """A message of the host code in flight on the same communicator and tag is not taken by hpcring."""
    if WORLD.size == 1:
        pytest.skip("needs a neighbour")
    right, left = (WORLD.rank + 1) % WORLD.size, (WORLD.rank - 1) % WORLD.size
    mine = np.full(16, 1000.0 + WORLD.rank)
    request = WORLD.Isend(mine, dest=right, tag=0)
    x = np.full(16, float(WORLD.rank))
    for algorithm in hpcring.ALGORITHMS:
        x[:] = WORLD.rank
        hpcring.allreduce(x, algorithm=algorithm)
        assert everywhere(WORLD, (x == WORLD.size * (WORLD.size - 1) / 2).all())
    theirs = np.empty(16)
    WORLD.Recv(theirs, source=left, tag=0)
    request.Wait()
    assert everywhere(WORLD, (theirs == 1000.0 + left).all())


def test_info() -> None:
    info = hpcring.info()
    assert info["mpi_library"] and "numpy" in info["backends"]
    assert set(info["algorithms"]) >= {"naive", "ps", "ring", "mpi"}
    assert isinstance(info["cuda_aware"], bool) and info["cuda_aware_reason"]


@pytest.mark.parametrize("algorithm", ["naive", "ps"])
def test_scratch_that_cannot_fit_raises_memory_error_everywhere(algorithm: str, monkeypatch) -> None:
    """naive needs G copies on every rank, ps on the root only: either way every rank is told."""
    if WORLD.size == 1:
        pytest.skip("one rank needs no scratch")
    monkeypatch.setenv("HPCRING_MEMORY_LIMIT", str(64 << 10))
    config.reload()
    comm = WORLD.Dup()  # a fresh channel: no scratch held from earlier tests
    x = np.ones(8192)  # 64 KiB: G copies cannot fit in 64 KiB, one segment can
    kept = x.copy()
    raises_everywhere(
        MemoryError, "algorithm='ring' needs", lambda: hpcring.allreduce(x, algorithm=algorithm, comm=comm)
    )
    assert everywhere(WORLD, np.array_equal(x, kept))
    hpcring.allreduce(x, algorithm="ring", comm=comm)  # the suggestion works
    assert everywhere(WORLD, (x == WORLD.size).all())
    comm.Free()


def test_settings_that_must_agree_are_compared(fresh_world: MPI.Intracomm, monkeypatch) -> None:
    """A must-agree HPCRING_* variable set on one rank only: every rank raises, naming the
    settings, where the ring would otherwise run two schedules and hang."""
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    if WORLD.rank == 0:
        monkeypatch.setenv("HPCRING_CHUNK_BYTES", "4096")
    config.reload()  # fresh_world has not been used: its channel takes this snapshot
    x = np.ones(10_000)
    raises_everywhere(
        ValueError,
        "ranks disagree on settings",
        lambda: hpcring.allreduce(x, algorithm="ring", comm=fresh_world),
    )
    assert everywhere(WORLD, (x == 1).all())


def test_an_unhashable_name_on_a_warm_communicator_raises_everywhere(fresh_world: MPI.Intracomm) -> None:
    """A warm call looks its kind of call up by op and algorithm name: a name that is not a
    string (unhashable) on one rank must still become that rank's verdict, not its lone error."""
    x = np.ones(16)
    hpcring.allreduce(x, algorithm="ring", comm=fresh_world)  # warm on every rank
    algorithm: object = ["ring"] if WORLD.rank == 0 else "ring"
    raises_everywhere(
        ValueError, "unknown algorithm", lambda: hpcring.allreduce(x, algorithm=algorithm, comm=fresh_world)
    )
    assert everywhere(WORLD, (x == WORLD.size).all())
