"""Inputs for the reproducible-sum tests, built from a seed alone (so every rank builds the same
multiset), and the exact reference with its bound."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np

from hpcring import exact
from hpcring.ops import BFLOAT16

DTYPES = ["float16", "bfloat16", "float32", "float64"]
KINDS = ["normal", "cancel", "wide", "special", "subnormal", "zeros"]


def dtype_of(name: str) -> np.dtype:
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def values(seed: int, count: int, n: int, dtype: str, kind: str) -> np.ndarray:
    """``count`` arrays of ``n`` elements (rows): cancelling, spread over 2^100, specials..."""
    rng = np.random.default_rng(seed)
    dt = dtype_of(dtype)
    info = ml_dtypes.finfo(dt)
    normal = rng.standard_normal((count, n))
    if kind == "cancel":  # big terms that cancel, and small ones that survive
        big = normal * 2.0 ** rng.integers(0, min(info.maxexp - 2, 60), (1, n))
        rows = np.concatenate([big[: (count + 1) // 2], -big[: count // 2]])[:count]
        rows = rows + rng.standard_normal((count, n)) * 2.0**-8
    elif kind == "wide":  # magnitudes across 2^100 (float16's whole range)
        span = min(100, info.maxexp - info.minexp - 4)
        rows = normal * 2.0 ** (rng.integers(0, span, (count, n)) + info.minexp + 2)
    elif kind == "subnormal":
        rows = normal * float(info.smallest_subnormal) * 8 if dt != BFLOAT16 else normal * 2.0**-130
    elif kind == "zeros":
        rows = np.where(rng.random((count, n)) < 0.5, -0.0, 0.0)
        rows[:, ::3] = -0.0
    else:
        rows = normal
    out = rows.astype(dt)
    if kind == "special":
        pick = rng.random((count, n))
        out[pick < 0.1] = np.inf
        out[(pick >= 0.1) & (pick < 0.2)] = -np.inf
        out[(pick >= 0.2) & (pick < 0.25)] = np.nan
        big = ml_dtypes.finfo(dt).max
        out[(pick >= 0.25) & (pick < 0.4)] = np.array(big).astype(dt)  # overflow to Inf
    return out


def reference(rows: np.ndarray, divisor: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The exact sum per element (as float64, NaN for NaN) and the error bound the docs state:
    half an ulp of the result plus N x 2^(top - P), P = 42 (85 for float64)."""
    fmt = exact.FORMATS[rows.dtype]
    precision = exact.ONE_WORD if fmt.words == 1 else exact.TWO_WORDS
    count, n = rows.shape
    wide = rows.astype(np.float64)
    exact_sum, bound = np.empty(n), np.empty(n)
    tiny = float(ml_dtypes.finfo(fmt.dtype).smallest_subnormal)
    for j in range(n):
        column = wide[:, j]
        finite = np.isfinite(column)
        if not finite.all():
            exact_sum[j], bound[j] = np.nan, np.nan
            continue
        total = sum((Fraction(float(v)) for v in column), Fraction(0)) / divisor
        try:
            exact_sum[j] = float(total)
        except OverflowError:  # beyond float64: the sum overflows whatever the dtype
            exact_sum[j] = np.inf if total > 0 else -np.inf
        top = int(np.frexp(np.abs(column).max())[1])
        grid = Fraction(2) ** (top - precision) * count / divisor
        ulp = max(abs(exact_sum[j]) * 2.0**-fmt.mantissa, tiny)  # one ulp: the mean rounds twice
        bound[j] = float(grid) + ulp
    return exact_sum, bound


def ieee_special(rows: np.ndarray) -> np.ndarray:
    """IEEE's answer where an element has a NaN or an infinity among its terms (else NaN too)."""
    wide = rows.astype(np.float64)
    nan = np.isnan(wide).any(0) | ((wide == np.inf).any(0) & (wide == -np.inf).any(0))
    return np.where(nan, np.nan, np.where((wide == np.inf).any(0), np.inf, -np.inf))
