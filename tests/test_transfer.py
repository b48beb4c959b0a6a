"""The state a newcomer receives (`hpcring.growth.transfer`), on a plain communicator: rank 0's
header and arrays arrive bit for bit on every rank, packed or in place; ranks whose packed arrays
hold other bytes in all raise before a byte moves, their arrays as they were. Killed ranks during
a transfer: tests/test_elastic_grow.py."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import everywhere
from mpi4py import MPI

from hpcring import growth

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
