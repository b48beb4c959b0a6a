"""Segment bounds: how `count` elements are cut into `size` contiguous segments.

Pure functions with no MPI in them, so every (count, size) can be tested serially.
The remainder goes to the first segments (as heat and MPI's block distributions do):
with count = 10 and size = 4 the segment lengths are 3, 3, 2, 2.
"""

from __future__ import annotations


def segment(count: int, size: int, index: int) -> tuple[int, int]:
    """Half-open bounds ``(start, stop)`` of segment ``index`` of ``count`` elements cut ``size`` ways."""
    if count < 0 or size < 1 or not 0 <= index < size:
        raise ValueError(
            f"segment: need count >= 0, size >= 1, 0 <= index < size; got {count}, {size}, {index}"
        )
    base, extra = divmod(count, size)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def segment_bounds(count: int, size: int) -> list[tuple[int, int]]:
    """Bounds of all ``size`` segments, in order; they tile ``range(count)`` exactly."""
    return [segment(count, size, index) for index in range(size)]


def chunk_bounds(start: int, stop: int, chunk: int) -> list[tuple[int, int]]:
    """``[start, stop)`` cut into pieces of ``chunk`` elements (the last one shorter).

    An empty range still gives one empty piece: the pipelined ring sends one message per
    piece, and a segment that is empty (count < size) must still take its turn.
    """
    if chunk < 1 or not 0 <= start <= stop:
        raise ValueError(
            f"chunk_bounds: need 0 <= start <= stop and chunk >= 1; got {start}, {stop}, {chunk}"
        )
    if start == stop:
        return [(start, stop)]
    return [(lo, min(lo + chunk, stop)) for lo in range(start, stop, chunk)]
