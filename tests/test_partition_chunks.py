"""chunk_bounds, the pure helper behind the pipelined ring's chunks."""

from __future__ import annotations

import itertools

import pytest

from hpcring.partition import chunk_bounds, segment_bounds


@pytest.mark.parametrize("count", [0, 1, 2, 7, 64, 1000])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("chunk", [1, 3, 64, 10**6])
def test_chunks_tile_each_segment(count: int, size: int, chunk: int) -> None:
    for start, stop in segment_bounds(count, size):
        pieces = chunk_bounds(start, stop, chunk)
        assert pieces[0][0] == start and pieces[-1][1] == stop
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
        assert all(0 < b - a <= chunk for a, b in pieces) or pieces == [(start, start)]
        assert len(pieces) == max(1, -(-(stop - start) // chunk))


def test_empty_range_is_one_empty_piece() -> None:
    assert chunk_bounds(5, 5, 4) == [(5, 5)]


@pytest.mark.parametrize("args", [(0, 4, 0), (3, 2, 1), (-1, 2, 1)])
def test_bad_arguments(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="chunk_bounds"):
        chunk_bounds(*args)
