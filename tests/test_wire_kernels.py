"""The integer narrowing and widening of hpcring.wire, bitwise against ml_dtypes' casts on every
class of float32 (NaN payloads, +-Inf, overflow, ties, subnormals, -0, random bits), serially."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hpcring import wire

BF16 = np.dtype(ml_dtypes.bfloat16)


def specials() -> np.ndarray:
    """Bit patterns at every edge of the conversion, both signs, in blocks that cross BLOCK."""
    edges = [
        0x00000000,
        0x00000001,
        0x00007FFF,
        0x00008000,
        0x00008001,
        0x00018000,
        0x0000FFFF,  # subnormals
        0x007FFFFF,
        0x00800000,
        0x3F808000,
        0x3F818000,
        0x3F808001,
        0x3F80FFFF,  # ties, even and odd
        0x7F7F7FFF,
        0x7F7F8000,
        0x7F7FFFFF,
        0x7F7F0000,  # max finite, and what rounds past it
        0x7F800000,
        0x7F800001,
        0x7F807FFF,
        0x7F808000,
        0x7F80FFFF,
        0x7F810000,  # Inf, low-payload NaNs
        0x7FBFFFFF,
        0x7FC00000,
        0x7FC00001,
        0x7FFF8000,
        0x7FFFFFFF,  # signalling and quiet NaNs
    ]
    bits = np.array(edges, np.uint32)
    return np.concatenate([bits, bits | 0x80000000])


def patterns() -> np.ndarray:
    """The specials, then 2^20 random bit patterns (NaNs among them), then the specials again
    past a block boundary (so a NaN's fix-up in a later block is tested too)."""
    rng = np.random.default_rng(24)
    randoms = rng.integers(0, 2**32, 2**20, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([specials(), randoms, specials()]).view(np.float32)


def expected(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(BF16)


def test_narrow_is_bitwise_ml_dtypes() -> None:
    x = patterns()
    got = wire.narrow(x, np.empty(x.size, BF16))
    np.testing.assert_array_equal(got.view(np.uint16), expected(x).view(np.uint16))
    assert np.isnan(got[np.isnan(x)].astype(np.float32)).all()  # no NaN became Inf


def test_widen_is_exact_and_bitwise_ml_dtypes() -> None:
    words = np.arange(2**16, dtype=np.uint16).view(BF16)  # every bfloat16
    got = wire.widen(words, np.empty(words.size, np.float32))
    np.testing.assert_array_equal(got.view(np.uint32), words.astype(np.float32).view(np.uint32))


def test_on_grid_truncation_is_exact_for_wire_values() -> None:
    words = np.arange(2**16, dtype=np.uint16).view(BF16)
    grid = words.astype(np.float32)
    got = wire.narrow(grid, np.empty(grid.size, BF16), on_grid=True)
    np.testing.assert_array_equal(got.view(np.uint16), words.view(np.uint16))


@pytest.mark.parametrize("n", [0, 1, 5, wire.BLOCK - 1, wire.BLOCK + 3])
def test_round_trip_in_place_and_sizes(n: int) -> None:
    x = patterns()[:n].copy()
    y = x.copy()
    wire.round_trip(y, np.empty(n, BF16))
    np.testing.assert_array_equal(y.view(np.uint32), expected(x).astype(np.float32).view(np.uint32))


def test_other_layouts_and_dtypes_fall_back() -> None:
    """Strided, float64 and float16: the library casts, same values."""
    x = patterns()[:4096]
    strided = x[::2]
    np.testing.assert_array_equal(
        wire.narrow(strided, np.empty(strided.size, BF16)).view(np.uint16), expected(strided).view(np.uint16)
    )
    d = np.random.default_rng(1).standard_normal(1000)
    np.testing.assert_array_equal(wire.narrow(d, np.empty(d.size, BF16)), d.astype(BF16))
    f = d.astype(np.float32)
    np.testing.assert_array_equal(wire.narrow(f, np.empty(f.size, np.float16)), f.astype(np.float16))
