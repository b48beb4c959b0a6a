"""Serial tests of the pure segment bounds: no MPI involved."""

from __future__ import annotations

import itertools

import pytest

from hpcring.partition import segment, segment_bounds


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 16, 1000])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 5, 15, 16, 17, 999, 1000, 1001, 2**20 + 3])
def test_segments_tile_the_range(count: int, size: int) -> None:
    bounds = segment_bounds(count, size)
    assert len(bounds) == size
    assert bounds[0][0] == 0 and bounds[-1][1] == count
    for (_, stop), (start, _) in itertools.pairwise(bounds):
        assert stop == start  # contiguous, no gap, no overlap
    lengths = [stop - start for start, stop in bounds]
    assert max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths, reverse=True)  # the remainder goes to the first segments
    assert sum(lengths) == count


def test_known_values() -> None:
    assert segment_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert segment_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert segment_bounds(0, 3) == [(0, 0), (0, 0), (0, 0)]
    assert segment(7, 1, 0) == (0, 7)


@pytest.mark.parametrize("args", [(-1, 2, 0), (5, 0, 0), (5, 2, 2), (5, 2, -1)])
def test_bad_arguments(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        segment(*args)
