"""Serial checks of what each algorithm module says it needs: scratch and bytes sent."""

from __future__ import annotations

import pytest

from hpcring import ALGORITHMS, algorithms

GIB = 1 << 30


def test_scratch_at_scale() -> None:
    """The 1000-GPU question: 1 GiB of float32 gradients."""
    count, itemsize, size = GIB // 4, 4, 1000
    assert algorithms.scratch_bytes("ps", count, itemsize, size, 0) == 1000 * GIB  # the root
    assert algorithms.scratch_bytes("ps", count, itemsize, size, 1) == 0
    assert algorithms.scratch_bytes("naive", count, itemsize, size, 7) == 1000 * GIB
    assert algorithms.scratch_bytes("ring", count, itemsize, size, 7) <= GIB // 1000 + itemsize
    assert algorithms.scratch_bytes("rabenseifner", count, itemsize, size, 999) <= GIB
    assert algorithms.scratch_bytes("mpi", count, itemsize, size, 0) == 0


# An id of "mpi" alone would read as pytest-mpi's marker and skip the test.
@pytest.mark.parametrize("name", ALGORITHMS, ids=lambda name: f"{name}-algorithm")
def test_one_rank_needs_nothing(name: str) -> None:
    assert algorithms.scratch_bytes(name, 100, 8, 1, 0) == 0
    assert algorithms.bytes_sent(name, 100, 8, 1, 0) in (0, None)


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match="naive, ps, ring"):
        algorithms.bytes_sent("tree", 1, 1, 2, 0)
