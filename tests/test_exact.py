"""Reproducible sums, serially (COMM_SELF): the bits do not depend on the order of the contributions,
the result is within the documented bound of the exact sum, and NaN, Inf, overflow, subnormals and
-0 come out as the docs say. tests/test_exact_mpi.py re-splits the same values over the ranks."""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import pytest
from exact_cases import DTYPES, KINDS, dtype_of, ieee_special, reference, values
from mpi4py import MPI

import hpcring
from hpcring import exact, kernels

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SELF = MPI.COMM_SELF


def summed(rows: np.ndarray, order: list[int] | None = None, op: str = "sum") -> np.ndarray:
    acc = hpcring.ExactSum(like=rows[0])
    for i in order if order is not None else range(len(rows)):
        acc.add(rows[i])
    return acc.allreduce(comm=SELF, op=op)


def sha(array: np.ndarray) -> str:
    return hashlib.sha256(array.tobytes()).hexdigest()


def check_bound(rows: np.ndarray, result: np.ndarray, divisor: int = 1) -> None:
    want, bound = reference(rows, divisor)
    got = result.astype(np.float64)
    finite = ~np.isnan(want)
    biggest = float(ml_dtypes.finfo(rows.dtype).max)
    overflow = finite & (np.abs(want) > biggest)
    with np.errstate(invalid="ignore"):
        ok = np.abs(got - want) <= bound
    ok |= overflow & (np.isinf(got) | (np.abs(got) == biggest)) & (np.sign(got) == np.sign(want))
    assert ok[finite].all(), (rows[:, finite & ~ok][:, :3].T, got[finite & ~ok][:3], want[finite & ~ok][:3])
    special = ~finite
    np.testing.assert_array_equal(got[special], ieee_special(rows)[special])


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    count=st.integers(1, 12),
    n=st.integers(0, 40),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(KINDS),
    op=st.sampled_from(["sum", "mean"]),
)
def test_any_order_of_adds_gives_one_digest_within_the_bound(
    seed: int, count: int, n: int, dtype: str, kind: str, op: str
) -> None:
    rows = values(seed, count, n, dtype, kind)
    first = summed(rows, op=op)
    order = list(np.random.default_rng(seed + 1).permutation(count))
    assert sha(summed(rows, order, op=op)) == sha(first)
    assert sha(summed(rows, order[::-1], op=op)) == sha(first)
    check_bound(rows, first)  # at one rank the mean divides by 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_contribution_comes_back_unchanged_and_nan_is_canonical(dtype: str) -> None:
    x = values(3, 1, 500, dtype, "wide")[0]
    x[:4] = np.array([-0.0, 0.0, np.inf, -np.inf]).astype(x.dtype)
    y = hpcring.allreduce(x.copy(), comm=SELF, reproducible=True)
    assert sha(y) == sha(x)
    assert np.signbit(y[0]) and not np.signbit(y[1])
    x[5] = np.nan
    out = np.empty_like(x)
    hpcring.allreduce(x, comm=SELF, reproducible=True, out=out)
    assert np.isnan(out[5]) and sha(out[6:]) == sha(x[6:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_specials_follow_ieee_addition(dtype: str) -> None:
    dt = dtype_of(dtype)
    big = ml_dtypes.finfo(dt).max
    cases = [  # terms, IEEE's sum (a list: as dict keys, (-0.0, -0.0) == (0.0, 0.0))
        ((1.0, np.nan), np.nan),
        ((np.inf, -np.inf), np.nan),
        ((np.inf, 1.0, np.inf), np.inf),
        ((-np.inf, -5.0), -np.inf),
        ((-0.0, -0.0), -0.0),
        ((-0.0, 0.0), 0.0),
        ((1.0, -1.0), 0.0),
        ((float(big), float(big)), np.inf),  # overflow rounds to Inf, as IEEE would
        ((-float(big), -float(big), float(big)), -float(big)),  # the exact sum fits: no overflow here
    ]
    for terms, want in cases:
        rows = np.array(terms, dtype=np.float64).astype(dt)[:, None]
        got = float(summed(rows)[0])
        assert (np.isnan(got) and np.isnan(want)) or (got == want and np.signbit(got) == np.signbit(want)), (
            terms,
            got,
        )


def test_heavy_cancellation_is_exact_where_float_order_is_not() -> None:
    rows = np.array([[2.0**60], [1.0], [-(2.0**60)], [2.0**-30]], dtype=np.float64)
    assert summed(rows)[0] == 1.0  # 85 bits below 2^61: 1 survives, 2^-30 is below the grid
    rows = np.array([[1e8], [1.0], [-1e8]], dtype=np.float32)
    assert summed(rows)[0] == np.float32(1.0)
    assert np.float32(1e8) + np.float32(1.0) - np.float32(1e8) == 0  # the plain float32 order loses it


def test_subnormal_sums_are_exact() -> None:
    tiny = np.finfo(np.float32).smallest_subnormal
    rows = (np.arange(1, 9, dtype=np.float32) * tiny)[:, None]
    assert summed(rows)[0] == np.float32(36) * tiny


def test_integers_max_and_min_take_the_plain_path_and_prod_is_refused() -> None:
    x = np.arange(5, dtype=np.int64)
    assert (hpcring.allreduce(x.copy(), comm=SELF, reproducible=True) == x).all()
    assert exact.check("max", np.dtype(np.float32)) is False
    with pytest.raises(ValueError, match="reproducible=True applies to op 'sum' and 'mean'"):
        hpcring.allreduce(np.ones(3), comm=SELF, op="prod", reproducible=True)
    with pytest.raises(TypeError, match="needs a float dtype"):
        hpcring.allreduce(np.ones(3, np.complex64), comm=SELF, reproducible=True)
    with pytest.raises(TypeError, match="needs a float dtype"):
        hpcring.ExactSum(like=np.ones(3, np.int32))
    acc = hpcring.ExactSum(like=np.ones(3))
    with pytest.raises(ValueError, match="expected an array of shape"):
        acc.add(np.ones(4))
    with pytest.raises(ValueError, match="reproducible=True applies"):
        acc.allreduce(comm=SELF, op="max")


def test_empty_accumulator_is_negative_zero_the_additive_identity() -> None:
    result = hpcring.ExactSum(like=np.ones(2, np.float32)).allreduce(comm=SELF)
    assert (result == 0).all() and np.signbit(result).all()


def test_sums_past_float64s_53_bits_round_once() -> None:
    """3,000 float32 terms near the top of their binade: the integer sum passes 2^53, where the
    cast to float64 alone would round; the result is still the exact sum rounded once, and the
    same in any order."""
    rng = np.random.default_rng(5)
    rows = (1.9 + rng.random((3000, 3)) * 0.099).astype(np.float32)
    rows[7] = np.float32(2.0**-20)  # a term far below the others: a sticky bit in the sum
    first = summed(rows)
    assert sha(summed(rows, list(rng.permutation(len(rows))))) == sha(first)
    check_bound(rows, first)


@pytest.mark.skipif(kernels.ACTIVE != "c", reason="the compiled kernels did not load")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gathered_sum_in_one_pass_is_the_three_kernels(dtype: str, kind: str) -> None:
    """The compiled one-pass gathered sum (an owner holding every contribution: its fast path
    where nothing is truncated, the three kernels for the rest) gives, for 1 to 4 other rows, a
    sum and a mean, in and out of place, the bits of NumPy's codes, encode and decode in turn."""
    fmt = exact.format_of(dtype_of(dtype))
    made: dict[str, np.ndarray] = {}

    def block(name: str, dt: np.dtype, rows: int | None = None) -> np.ndarray:
        made.setdefault(f"{name} {rows}", np.empty((rows or 1) * exact.BLOCK, dt))
        return made[f"{name} {rows}"] if rows is None else made[f"{name} {rows}"].reshape(rows, -1)

    ok = True
    for others in (1, 2, 4):
        rows = values(others, others + 1, 3001, dtype, kind)
        own, rest = rows[0], np.ascontiguousarray(rows[1:]).reshape(-1)
        for divisor in (1, others + 1):
            want = np.empty_like(own)  # codes, encode and decode in turn, in NumPy
            with kernels.using("python"):
                exact.gathered_sum(fmt, own, rest, own.size, others, want, divisor, np, block, floats=False)
            got, mine = np.empty_like(own), own.copy()  # out of place, and in place (out is own)
            ok &= kernels.gather(own, rest, own.size, others, got, divisor)
            ok &= kernels.gather(mine, rest, own.size, others, mine, divisor)
            ok &= got.tobytes() == want.tobytes() == mine.tobytes()
    assert ok
