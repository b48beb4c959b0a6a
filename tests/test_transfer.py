"""The state a newcomer receives (`hpcring.growth.transfer`), on a plain communicator: rank 0's
header and arrays arrive bit for bit on every rank, packed or in place; ranks whose packed arrays
hold other bytes in all raise before a byte moves, their arrays as they were. Killed ranks during
a transfer: tests/test_elastic_grow.py."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import everywhere
from mpi4py import MPI

from hpcring import growth, kernels

WORLD = MPI.COMM_WORLD


def state_of(rank: int, packed_bytes: int) -> list[np.ndarray]:
    """Arrays of every kind `transfer` sends: packed float32 (``packed_bytes`` of them), a packed
    dtype the collectives do not take (bool), and one float64 array sent in place. Filled from
    ``rank``: the values are the rank's own."""
    rng = np.random.default_rng(rank)
    return [
        rng.standard_normal(packed_bytes // 4).astype(np.float32),
        rng.integers(0, 2, 13).astype(bool),
        rng.standard_normal(growth.PACK_BELOW // 8 + 3),
    ]


@pytest.mark.mpi
@pytest.mark.parametrize("packed_bytes", [4 << 10, 256 << 10], ids=["4KiB", "256KiB"])
def test_rank_zeros_state_arrives_bit_for_bit(packed_bytes: int) -> None:
    comm = WORLD.Dup()
    header = (
        np.arange(len(growth.HEADER), dtype=np.int64) - 3
        if comm.rank == 0
        else np.zeros(len(growth.HEADER), np.int64)
    )
    header[growth.HEADER.index("holds")] = int(comm.rank == 0)
    sent = header.copy()
    state = state_of(comm.rank, packed_bytes)
    heard = []
    got = growth.transfer(comm, state, header, arrived=lambda h: heard.append(h.copy()))
    expected = state_of(0, packed_bytes)
    first = comm.bcast(sent, root=0)
    ok = got is header and np.array_equal(header, first) and np.array_equal(heard[0], first)
    ok &= all(a.tobytes() == b.tobytes() for a, b in zip(state, expected, strict=True))
    assert everywhere(WORLD, ok)
    comm.Free()


@pytest.mark.mpi
def test_ranks_that_expect_other_state_all_raise() -> None:
    if WORLD.size == 1:
        pytest.skip("needs a second rank to differ")
    comm = WORLD.Dup()
    header = np.zeros(len(growth.HEADER), np.int64)
    header[growth.HEADER.index("holds")] = 1
    state = state_of(comm.rank, 4 << 10)
    if comm.rank == comm.size - 1:  # the last rank built a longer first array
        state[0] = np.zeros(state[0].size + 2, np.float32)
    before = [a.copy() for a in state]
    try:
        growth.transfer(comm, state, header)
        ok = False
    except ValueError as error:
        ok = "disagree on count" in str(error)
    ok &= all(a.tobytes() == b.tobytes() for a, b in zip(state, before, strict=True))
    assert everywhere(WORLD, ok)
    comm.Free()


def header_of(rank: int) -> np.ndarray:
    """Rank 0's header (distinct values), or a blank one elsewhere; rank 0 holds the state."""
    header = (
        np.arange(len(growth.HEADER), dtype=np.int64) - 3
        if rank == 0
        else np.zeros(len(growth.HEADER), np.int64)
    )
    header[growth.HEADER.index("holds")] = int(rank == 0)
    return header


@pytest.mark.mpi
@pytest.mark.parametrize("joined", [1, 2])
def test_a_joins_first_try_sends_to_the_newcomers_alone(joined: int) -> None:
    """`send_state`: the last ``joined`` ranks get rank 0's header and arrays bit for bit (packed
    and sent apart); the other holders keep their own and hear their own header; no problem."""
    comm = WORLD.Dup()
    newcomers = range(max(comm.size - joined, 1), comm.size)
    header, state = header_of(comm.rank), state_of(comm.rank, 4 << 10)
    first = comm.bcast(header.copy(), root=0)
    heard = []
    got, problem = growth.send_state(comm, state, header, newcomers, arrived=lambda h: heard.append(h.copy()))
    owner = 0 if comm.rank in newcomers else comm.rank
    expected = state_of(owner, 4 << 10)
    ok = problem is None and got is header and len(heard) == 1
    ok &= np.array_equal(header, first) if comm.rank in newcomers or comm.rank == 0 else True
    ok &= all(a.tobytes() == b.tobytes() for a, b in zip(state, expected, strict=True))
    assert everywhere(WORLD, ok)
    comm.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("other", ["longer", "reshaped"])
def test_a_newcomer_with_other_state_hears_why_and_nothing_hangs(other: str) -> None:
    """The last rank, a newcomer, built a longer first array (a message of another length), or
    one of the same bytes in another shape (a message of its own length, whose layout differs):
    it takes rank 0's messages as they come, keeps its arrays as they were and returns the problem
    (for the join's agreement to make every rank's error); the others return none."""
    if WORLD.size == 1:
        pytest.skip("needs a newcomer")
    comm = WORLD.Dup()
    newcomer = comm.size - 1
    state = state_of(comm.rank, 4 << 10)
    if comm.rank == newcomer:
        state[0] = np.zeros(
            (state[0].size + 2,) if other == "longer" else (2, state[0].size // 2), np.float32
        )
    before = [a.copy() for a in state]
    _, problem = growth.send_state(comm, state, header_of(comm.rank), range(newcomer, comm.size))
    if comm.rank == newcomer:
        shape = "(1026,)" if other == "longer" else "(2, 512)"
        ok = problem is not None and "differs from rank 0's" in problem and shape in problem
        ok &= all(a.tobytes() == b.tobytes() for a, b in zip(state, before, strict=True))
    else:
        ok = problem is None
    assert everywhere(WORLD, ok)
    comm.Free()


class Tagged(np.ndarray):
    """An array type of the user's own: not a plain NumPy array to `send_state`."""


@pytest.mark.mpi
def test_state_that_is_not_all_numpy_goes_by_the_checked_broadcast() -> None:
    """A state with an array of another type (an ndarray subclass): rank 0's first message says
    so, and every rank takes `transfer` (the holders' arrays then rank 0's too)."""
    comm = WORLD.Dup()
    state = [*state_of(comm.rank, 4 << 10), np.full(5, float(comm.rank)).view(Tagged)]
    newcomers = range(comm.size - 1, comm.size) if comm.size > 1 else range(1, 1)
    _, problem = growth.send_state(comm, state, header_of(comm.rank), newcomers)
    expected = [*state_of(0, 4 << 10), np.zeros(5)]
    ok = problem is None and all(a.tobytes() == b.tobytes() for a, b in zip(state, expected, strict=True))
    assert everywhere(WORLD, ok)
    comm.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("python_rank", ["sender", "newcomer"])
def test_the_compiled_and_the_python_first_try_speak_alike(python_rank: str) -> None:
    """Rank 0 and the newcomer on different cores (one compiled, one the Python reference): the
    state arrives bit for bit with no problem, so both pack the same bytes and checksum the same
    layout (arrays of several formats, shapes and byte orders); where the compiled core does not
    run here, both are the reference."""
    if WORLD.size == 1:
        pytest.skip("needs a newcomer")
    comm = WORLD.Dup()
    newcomer = comm.size - 1
    rng = np.random.default_rng(comm.rank)
    state = [
        *state_of(comm.rank, 4 << 10),
        rng.standard_normal((3, 5)).astype(">f8"),
        np.array(comm.rank, dtype=np.int32),
        (rng.standard_normal(6) + 1j).astype(np.complex64),
    ]
    sent = comm.bcast([a.copy() for a in state] if comm.rank == 0 else None, root=0)
    expected = sent if comm.rank == newcomer else [a.copy() for a in state]
    python_here = comm.rank == (0 if python_rank == "sender" else newcomer)
    with kernels.using("python" if python_here else kernels.ACTIVE):
        _, problem = growth.send_state(comm, state, header_of(comm.rank), range(newcomer, comm.size))
    ok = problem is None and all(a.tobytes() == b.tobytes() for a, b in zip(state, expected, strict=True))
    assert everywhere(WORLD, ok)
    comm.Free()
