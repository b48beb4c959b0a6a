"""Rabenseifner and the pipelined ring against closed forms, MPI_Allreduce and each other rank.

Inputs are small integers f(rank, index), so every summation order gives the exact
answer and the expected value can be written down: for sum, x = i % 5 + rank + 1 gives
G·(i % 5) + G(G+1)/2. The rest are reduced here from every rank's inputs (rebuilt
locally), which is exact for the same reason. Each test loops over sizes and in/out of
place itself, so the matrix stays a few dozen pytest items.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere
from mpi4py import MPI

import hpcring
from hpcring import config
from hpcring.ops import BFLOAT16, DTYPES, OPS, kind

WORLD = MPI.COMM_WORLD
ALGORITHMS = ("rabenseifner", "ring")
CASES = [(dtype, op) for dtype in DTYPES for op in OPS if kind(dtype) in OPS[op].kinds]


def inputs(rank: int, count: int, dtype: np.dtype, op: str) -> np.ndarray:
    """Rank ``rank``'s buffer: small integers (Gaussian integers for complex)."""
    i = np.arange(count)
    if op == "prod":  # 1s and 2s: the product over 4 ranks stays exact even in float16
        real, imag = 1 + (i + rank) % 2, (i + rank) % 2
    elif op in ("max", "min"):
        real, imag = (7 * i + 3 * rank) % 11 - 5, 0 * i
    else:
        real, imag = i % 5 + rank + 1, i % 3 - rank
    x = real.astype(dtype)
    if dtype.kind == "c":
        x += 1j * imag
    return x


def expected(size: int, count: int, dtype: np.dtype, op: str) -> np.ndarray:
    """The exact result, reduced here from every rank's inputs."""
    stack = np.stack([inputs(rank, count, dtype, op) for rank in range(size)])
    ufunc = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[op]
    result = ufunc.reduce(stack, axis=0).astype(dtype)
    return np.true_divide(result, size, out=result) if op == "mean" else result


def sizes(size: int, largest: int = 2**16 + 3) -> list[int]:
    return sorted(n for n in {0, 1, max(size - 1, 0), size, size + 1, 1000, 2**16 + 3} if n <= largest)


def check(
    comm: MPI.Intracomm, algorithm: str, dtype: np.dtype, op: str, largest: int = 2**16 + 3
) -> list[str]:
    """Every size up to ``largest``, in place and out of place, on ``comm``; the failures seen here."""
    failures = []
    for count in sizes(comm.size, largest):
        want = expected(comm.size, count, dtype, op)
        for in_place in (True, False):
            x = inputs(comm.rank, count, dtype, op)
            original = x.copy()
            if in_place:
                got = hpcring.allreduce(x, op=op, algorithm=algorithm, comm=comm)
                ok = got is x
            else:
                got = hpcring.allreduce(x, op=op, algorithm=algorithm, comm=comm, out=np.empty_like(x))
                ok = np.array_equal(x, original)  # out= leaves the input untouched
            ok = ok and got.tobytes() == want.tobytes()
            if dtype not in (np.float16, BFLOAT16) and op != "mean":  # MPI has no type for them
                reference = np.empty_like(original)
                comm.Allreduce(original, reference, OPS[op].mpi_op())
                ok = ok and np.array_equal(got, reference)
            ok = identical_everywhere(comm, got) and ok
            if not ok:
                failures.append(f"{algorithm} {dtype} {op} count={count} in_place={in_place}")
    return failures


@pytest.mark.mpi
@pytest.mark.parametrize("dtype,op", CASES, ids=[f"{d.name}-{o}" for d, o in CASES])
def test_rabenseifner_matrix(dtype: np.dtype, op: str) -> None:
    failures = check(WORLD, "rabenseifner", dtype, op)
    assert everywhere(WORLD, not failures), failures


@pytest.mark.mpi
@pytest.mark.parametrize("chunk_bytes", ["8", "40", ""])
@pytest.mark.parametrize("dtype,op", [(np.dtype(np.float32), "sum"), (np.dtype(np.complex128), "prod")])
def test_ring_chunks(
    monkeypatch: pytest.MonkeyPatch, fresh_world: MPI.Intracomm, chunk_bytes: str, dtype: np.dtype, op: str
) -> None:
    """Chunks of one element, of a few (not dividing the segments) and the default."""
    monkeypatch.setenv("HPCRING_CHUNK_BYTES", chunk_bytes)
    config.reload()
    failures = check(fresh_world, "ring", dtype, op, largest=1000 if chunk_bytes else 2**16 + 3)
    assert everywhere(WORLD, not failures), failures


@pytest.mark.mpi
def test_ring_chunks_with_sleeping_waits(monkeypatch: pytest.MonkeyPatch, fresh_world: MPI.Intracomm) -> None:
    """HPCRING_WAIT_SLEEP_US: the pipelined ring polls and naps instead of spinning, same results."""
    monkeypatch.setenv("HPCRING_CHUNK_BYTES", "40")
    monkeypatch.setenv("HPCRING_WAIT_SLEEP_US", "20")
    config.reload()
    failures = check(fresh_world, "ring", np.dtype(np.float32), "sum", largest=1000)
    assert everywhere(WORLD, not failures), failures


@pytest.mark.mpi
@pytest.mark.parametrize("value", ["-1", "soon", "nan", "1e9"])
@pytest.mark.parametrize("chunk_bytes", ["40", ""])  # pipelined, and whole segments
def test_bad_wait_nap_is_refused_on_every_rank(
    monkeypatch: pytest.MonkeyPatch, fresh_world: MPI.Intracomm, value: str, chunk_bytes: str
) -> None:
    monkeypatch.setenv("HPCRING_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setenv("HPCRING_WAIT_SLEEP_US", value)
    config.reload()
    x = np.arange(1000, dtype=np.float32)
    before = x.copy()
    refused = False
    try:
        hpcring.allreduce(x, algorithm="ring", comm=fresh_world)
    except ValueError as error:
        refused = "HPCRING_WAIT_SLEEP_US" in str(error)
    assert everywhere(WORLD, (refused or WORLD.size == 1) and np.array_equal(x, before))


@pytest.mark.mpi
@pytest.mark.parametrize("dtype,op", CASES, ids=[f"{d.name}-{o}" for d, o in CASES])
def test_ring_matrix(
    monkeypatch: pytest.MonkeyPatch, fresh_world: MPI.Intracomm, dtype: np.dtype, op: str
) -> None:
    monkeypatch.setenv("HPCRING_CHUNK_BYTES", "4096")  # several chunks per segment at 2**16 + 3
    config.reload()
    failures = check(fresh_world, "ring", dtype, op)
    assert everywhere(WORLD, not failures), failures


def sub_communicators() -> list[tuple[str, MPI.Intracomm, bool]]:
    """(name, communicator, whether to Free it afterwards)."""
    half = WORLD.Split(color=int(WORLD.rank >= WORLD.size // 2), key=WORLD.rank)
    return [("split", half, True), ("dup", WORLD.Dup(), True), ("self", MPI.COMM_SELF, False)]


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_sub_communicators(algorithm: str) -> None:
    failures = []
    for name, comm, free in sub_communicators():
        for dtype, op in [
            (np.dtype(np.float64), "sum"),
            (np.dtype(np.int32), "max"),
            (np.dtype(np.float16), "mean"),
        ]:
            failures += [f"{name}: {failure}" for failure in check(comm, algorithm, dtype, op)]
        if free:
            comm.Free()  # releases hpcring's duplicate and its plans with it
    assert everywhere(WORLD, not failures), failures


@pytest.mark.mpi
def test_closed_form_sum() -> None:
    size, count = WORLD.size, 1001
    i = np.arange(count)
    for algorithm in ALGORITHMS:
        x = (i % 5 + WORLD.rank + 1).astype(np.float64)
        hpcring.allreduce(x, algorithm=algorithm)
        ok = np.array_equal(x, size * (i % 5) + size * (size + 1) / 2)
        assert everywhere(WORLD, ok), algorithm
