"""The payload the agreement's collective carries: its reductions, serially.

A small `mpi` all-reduce rides with the agreement (hpcring/agreement.py), reduced by the
agreement's own MPI op (hpcring/_c/agree.h, and `agreement.combine_payload` on the pure-Python
core). MPI may combine the ranks' payloads in any tree and hand each rank's op its operands in
either order, so each reduction must be bitwise commutative (every rank then gets the same bits),
and the compiled op must give the reference's bits. Edge values (signed zeros, Infs, NaNs with
payloads, subnormals, extremes) and random bit patterns, for every pair a payload may carry.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcring import agreement, core, kernels

OPS = {"sum": 0, "max": 1, "min": 2, "prod": 3}
CASES = [
    (name, op)
    for name in ("float32", "float64", "int32", "int64", "complex64", "complex128")
    for op in OPS
    if name.startswith(("float", "int")) or op == "sum"
]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def values(dtype: np.dtype, n: int, seed: int) -> np.ndarray:
    """Edge values and random bit patterns of ``dtype``, mixed."""
    rng = np.random.default_rng(seed)
    if dtype.kind == "c":
        part = np.dtype(np.float32 if dtype.itemsize == 8 else np.float64)
        return values(part, 2 * n, seed).view(dtype)
    edges = kernels._edge_values(dtype, n, seed)
    noise = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype)
    return np.where(rng.random(n) < 0.5, edges, noise)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize // (2 if a.dtype.kind == 'c' else 1)}"))


def combined(code: int, op: int, a: np.ndarray, b: np.ndarray, compiled: bool) -> np.ndarray:
    out = b.copy()
    if compiled:
        core.mpi_core()[0].combine_payload(code, op, a, out)
    else:
        agreement.combine_payload(code, op, a, out)
    return out


@pytest.mark.parametrize(("name", "op"), CASES)
def test_payload_reductions_commute_bitwise(name: str, op: str) -> None:
    dtype = np.dtype(name)
    code = kernels.DTYPE_CODES[dtype]
    a, b = values(dtype, 257, 1), values(dtype, 257, 2)
    b[:64] = a[:64]  # equal operands too (+0 and -0 are equal; NaNs are not)
    b[64:80] = -a[64:80] if dtype.kind != "u" else b[64:80]
    ab = combined(code, OPS[op], a, b, compiled=False)
    ba = combined(code, OPS[op], b, a, compiled=False)
    np.testing.assert_array_equal(bits(ab), bits(ba))


@pytest.mark.parametrize(("name", "op"), CASES)
def test_compiled_payload_reductions_are_the_references(name: str, op: str) -> None:
    if not core.active():
        pytest.skip(f"no compiled core here: {core.describe()[1]}")
    dtype = np.dtype(name)
    code = kernels.DTYPE_CODES[dtype]
    a, b = values(dtype, 1001, 3), values(dtype, 1001, 4)
    b[:100] = a[:100]
    np.testing.assert_array_equal(
        bits(combined(code, OPS[op], a, b, compiled=True)),
        bits(combined(code, OPS[op], a, b, compiled=False)),
    )


@pytest.mark.parametrize("name", ["float32", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_are_associative_and_let_nan_win(name: str, op: str) -> None:
    dtype = np.dtype(name)
    code = kernels.DTYPE_CODES[dtype]
    a, b, c = values(dtype, 301, 5), values(dtype, 301, 6), values(dtype, 301, 7)
    left = combined(code, OPS[op], combined(code, OPS[op], a, b, False), c, False)
    right = combined(code, OPS[op], a, combined(code, OPS[op], b, c, False), False)
    np.testing.assert_array_equal(bits(left), bits(right))
    nan = np.isnan(a) | np.isnan(b) | np.isnan(c)
    assert np.isnan(left[nan]).all()
    zeros = np.array([0.0, -0.0], dtype)
    got = combined(code, OPS[op], zeros, zeros[::-1].copy(), False)
    want = 0.0 if op == "max" else -0.0
    assert all(np.signbit(v) == np.signbit(want) for v in got)


@pytest.mark.parametrize(
    ("dtype", "ufunc", "count", "rides"),
    [
        ("float64", "add", 1, True),
        ("float32", "maximum", agreement.SLOT // 4, True),
        ("float32", "maximum", agreement.SLOT // 4 + 1, False),  # too large for the slot
        ("int64", "multiply", 3, True),
        ("complex128", "add", 2, True),
        ("complex64", "multiply", 2, False),  # a complex product's NaNs depend on the order
        ("float16", "add", 2, False),  # MPI has no float16: `mpi` refuses it anyway
        ("float64", "add", 0, False),
    ],
)
def test_what_may_ride(dtype: str, ufunc: str, count: int, rides: bool) -> None:
    got = agreement.payload_descriptor(np.dtype(dtype), ufunc, count)
    assert (got != agreement.NO_PAYLOAD) == rides
