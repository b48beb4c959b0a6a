"""The compiled element kernels against the NumPy path they replace, bit for bit, serially.

Every kernel (reductions for every dtype and op, wire narrowing and widening, the reproducible
sum's codes/encode/decode) runs once with ``hpcring.kernels.using("c")`` and once with
``using("python")`` around the very functions hpcring calls (Op.combine, wire.narrow,
exact.encode...), on sizes 0, 1, odd and large, views at an offset, misaligned and strided
views (which the kernels leave to NumPy), edge values and random bit patterns. Where two NaNs
meet in a float32/float64/complex addition or product, NumPy's own bits depend on the element's
position in its SIMD loop, so there the test asks only for a NaN.

``HPCRING_REQUIRE_CORE=1`` (CI sets it) makes a compiled core that did not build, load or pass
its self-test a failure instead of a silent fallback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import exact_cases
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hpcring import core, exact, kernels, wire
from hpcring.ops import DTYPES, OPS

ROOT = Path(__file__).resolve().parents[1]
BF16 = np.dtype(ml_dtypes.bfloat16)
COMPILED = kernels.COMPILED is not None
needs_c = pytest.mark.skipif(not COMPILED, reason=f"no compiled kernels: {kernels.REASON}")
SIZES = [0, 1, 2, 3, 7, 31, 64, 65, 1001, (1 << 17) + 3]
# Edge values overflow and make NaNs on purpose, in the NumPy reference too.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
UFUNC_OPS = {"sum": "add", "max": "maximum", "min": "minimum", "prod": "multiply"}
for _dtype in DTYPES:  # each dtype's self-test, as a call's first reduction of it runs it:
    kernels.tested(_dtype)  # the compiled reductions these tests compare are on from here


def bits(a: np.ndarray) -> np.ndarray:
    """The array's bytes as unsigned words (complex: two per element)."""
    return a.view(
        np.dtype(f"u{a.dtype.itemsize}")
        if a.dtype.kind != "c"
        else np.uint64
        if a.dtype.itemsize == 16
        else np.uint32
    )


def is_nan(a: np.ndarray) -> np.ndarray:
    """isnan per element, bfloat16 included; complex: either part."""
    return np.isnan(a.astype(np.float32) if a.dtype == BF16 else a)


def random_bits(rng: np.random.Generator, dtype: np.dtype, n: int) -> np.ndarray:
    """n elements of every bit pattern (NaN payloads, subnormals, Infs among them)."""
    raw = rng.integers(0, 2**64 - 1, (n * dtype.itemsize + 7) // 8, dtype=np.uint64, endpoint=True)
    return raw.view(np.uint8)[: n * dtype.itemsize].copy().view(dtype)


def edge_values(rng: np.random.Generator, dtype: np.dtype, n: int) -> np.ndarray:
    """n elements mixing random bits with the edges: signed zeros, Infs, NaNs, extremes, ties."""
    out = random_bits(rng, dtype, n)
    if dtype.kind in "iu" or n == 0:
        return out
    edges = kernels._edge_values(dtype, min(n, 64), int(rng.integers(1 << 30)))
    out[: edges.size] = edges
    normal = kernels._edge_values(dtype, n, 7)  # values in range, where products and sums round
    pick = rng.random(n) < 0.5
    out[pick] = normal[pick]
    return rng.permutation(out)


def python(script: str, core: str | None) -> subprocess.CompletedProcess[str]:
    """``script`` run by a fresh Python, with HPCRING_CORE set to ``core`` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "HPCRING_CORE"}
    if core is not None:
        env["HPCRING_CORE"] = core
    command = [sys.executable, "-c", script]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(autouse=True)
def _kernels_as_configured() -> Iterator[None]:
    """Each test leaves the kernels chosen as HPCRING_CORE chose them."""
    yield
    kernels.select()


def on_both(run: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """(the NumPy path's result, the compiled kernels') of ``run(*args)``."""
    with kernels.using("python"):
        want = run(*args)
    with kernels.using("c"):
        got = run(*args)
    return want, got


def assert_same_bits(want: np.ndarray, got: np.ndarray, where_both_nan: np.ndarray | None = None) -> None:
    """Bitwise equal; at ``where_both_nan`` (two NaN operands: NumPy's bits depend on the
    position) both NaN."""
    assert want.dtype == got.dtype and want.shape == got.shape
    if want.size == 0:
        return
    same = (bits(want) == bits(got)).reshape(want.size, -1).all(axis=1).reshape(want.shape)
    if where_both_nan is not None:
        same |= where_both_nan & is_nan(want) & is_nan(got)
    assert same.all(), f"{(~same).sum()} of {want.size} differ, first at {np.flatnonzero(~same.ravel())[:5]}"


def combined(name: str, left: np.ndarray, right: np.ndarray, target: str = "apart") -> np.ndarray:
    """OPS[name].combine on copies, into a new array or into the left or right operand."""
    a, b = left.copy(), right.copy()
    out = {"apart": np.empty_like(a), "left": a, "right": b}[target]
    with np.errstate(all="ignore"):
        OPS[name].combine(np, a, b, out)
    return out


def reduced(name: str, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """OPS[name].reduce into a copy of left."""
    acc = left.copy()
    with np.errstate(all="ignore"):
        OPS[name].reduce(np, acc, right)
    return acc


def narrowed(x: np.ndarray, to: np.dtype, on_grid: bool) -> np.ndarray:
    with np.errstate(all="ignore"):
        return wire.narrow(x, np.empty(x.size, to), on_grid)


def widened(words: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return wire.widen(words, np.empty(words.size, dtype))


def tripped(x: np.ndarray, to: np.dtype) -> np.ndarray:
    y = x.copy()
    with np.errstate(all="ignore"):
        wire.round_trip(y, np.empty(y.size, to))
    return y


def blocks() -> Callable[..., np.ndarray]:
    """exact.run's ``block``: reused temporaries of BLOCK elements."""
    made: dict[tuple[str, int | None], np.ndarray] = {}

    def block(name: str, dtype: np.dtype, rows: int | None = None) -> np.ndarray:
        if (name, rows) not in made:
            made[name, rows] = np.empty((rows or 1) * exact.BLOCK, dtype)
        return made[name, rows] if rows is None else made[name, rows].reshape(rows, -1)

    return block


def coded(fmt: exact.Format, x: np.ndarray, into: np.ndarray | None = None) -> np.ndarray:
    return exact.codes(
        fmt, x, np, np.empty(x.size, fmt.code), blocks(), None if into is None else into.copy()
    )


def encoded(
    fmt: exact.Format, parts: np.ndarray, code: np.ndarray, floats: bool, into: np.ndarray | None = None
) -> np.ndarray:
    """The words of ``parts`` summed (the first added to ``into``'s where given, out of place)."""
    words = np.empty((code.size, fmt.words), np.int64)
    with np.errstate(all="ignore"):
        for index, part in enumerate(parts):
            given = words if index else None if into is None else into.copy()
            exact.encode(fmt, part, code, words, np, blocks(), given, floats)
    return words


def decoded(
    fmt: exact.Format,
    words: np.ndarray,
    code: np.ndarray,
    divisor: int,
    terms: int | None,
    floats: bool,
    mine: np.ndarray | None = None,
) -> np.ndarray:
    out = np.empty(code.size, fmt.dtype)
    with np.errstate(all="ignore"):
        exact.decode(fmt, words.copy(), code, out, divisor, np, blocks(), terms, floats, mine)
    return out


# --- the core is there where it should be -----------------------------------------------------


def test_the_compiled_core_is_there_where_required() -> None:
    """CI sets HPCRING_REQUIRE_CORE=1: then a build or load that failed quietly fails here."""
    if os.environ.get("HPCRING_REQUIRE_CORE", "") != "1":
        pytest.skip("HPCRING_REQUIRE_CORE is not 1: the pure-Python fallback is allowed")
    assert kernels.COMPILED is not None, kernels.REASON
    differ = kernels._self_test(kernels.COMPILED, list(DTYPES))
    assert differ == [], "a compiled kernel differs from NumPy here"
    module, why = core.mpi_core()
    assert module is not None, why


@needs_c
def test_a_dtype_s_reductions_are_self_tested_before_a_call_first_reduces_it() -> None:
    """A fresh process loads the kernels with no dtype tested (NumPy's loops reduce them all);
    a call's first reduction of float32 tests float32 alone, and its compiled reduction is on."""
    script = (
        "import numpy as np; from mpi4py import MPI; import hpcring; from hpcring import kernels\n"
        "x = np.arange(5, dtype=np.float32); y = np.empty_like(x)\n"
        "f32, f64 = kernels.DTYPE_CODES[x.dtype], kernels.DTYPE_CODES[np.dtype(np.float64)]\n"
        "print(f32 in kernels.UNTESTED, f64 in kernels.UNTESTED, kernels.COMPILED.combine('add', x, x, y))\n"
        "hpcring.allreduce(x.copy(), op='max', comm=MPI.COMM_SELF)\n"
        "print(f32 in kernels.UNTESTED, f64 in kernels.UNTESTED, kernels.COMPILED.combine('add', x, x, y))\n"
        "print(y.tolist(), kernels.OFF)\n"
    )
    done = python(script, core=None)
    assert done.returncode == 0, done.stderr
    before, after, result = done.stdout.split("\n")[:3]
    assert before == "True True False", "a dtype tested before any call reduced it"
    assert after == "False True True", "the call's dtype alone tested, and its kernel on"
    assert result == "[0.0, 2.0, 4.0, 6.0, 8.0] ()"


@needs_c
def test_kernels_loaded_after_a_dtype_was_settled_test_it_at_its_next_call() -> None:
    """Started with HPCRING_CORE=python, a process that turns the compiled kernels on later
    (`kernels.select("c")`) tests a dtype it already reduced at its next reduction of it."""
    script = (
        "import numpy as np; from hpcring import kernels\n"
        "kernels.tested(np.dtype(np.float32)); kernels.select('c')\n"
        "x = np.arange(5, dtype=np.float32); y = np.empty_like(x)\n"
        "print(kernels.COMPILED.combine('add', x, x, y))\n"
        "kernels.tested(x.dtype); print(kernels.COMPILED.combine('add', x, x, y), y.tolist())\n"
    )
    done = python(script, core="python")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["False", "True [0.0, 2.0, 4.0, 6.0, 8.0]"]


def test_hpcring_core_chooses_and_info_says_why() -> None:
    """HPCRING_CORE=python and =c in fresh processes: info()['core'] and its reason."""
    script = "import hpcring; i = hpcring.info(); print(i['core']); print(i['core_reason'])"
    done = python(script, core="python")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["python", "HPCRING_CORE=python"]
    if COMPILED:
        done = python(script, core="c")
        assert done.returncode == 0, done.stderr
        kind, why = done.stdout.split("\n")[:2]
        assert kind == "c" and "hpcring._kernels" in why and "hpcring._core" in why


def test_a_kernels_module_that_does_not_load_falls_back_or_raises_for_c() -> None:
    """The import of hpcring._kernels failing (as where it was never built): Python, saying why;
    HPCRING_CORE=c then raises ImportError where the kernels are first needed."""
    script = (
        "import sys; sys.modules['hpcring._kernels'] = None\n"  # what an absent module does to import
        "from hpcring import kernels; print(kernels.ACTIVE); print(kernels.REASON)\n"
        "import numpy as np; from hpcring.ops import OPS\n"
        "a = np.ones(3, np.float32); OPS['sum'].reduce(np, a, a); print(a.tolist())\n"
    )
    done = python(script, core=None)
    assert done.returncode == 0, done.stderr
    active, reason, total = done.stdout.split("\n")[:3]
    assert active == "python" and "did not load" in reason and total == "[2.0, 2.0, 2.0]"
    done = python(script, core="c")
    assert done.returncode != 0 and "ImportError: HPCRING_CORE=c asks for the compiled core" in done.stderr


def test_abi_mismatch_names_what_differs() -> None:
    """The ABI check on this process's real facts, and on those of an MPICH-family build."""
    from mpi4py import MPI

    here = MPI.Get_library_version().strip()
    size, world = MPI._sizeof(MPI.Comm), MPI.COMM_WORLD.handle
    assert core.abi_mismatch("Open MPI", size, world, here, here, size, world) is None
    mpich = core.abi_mismatch("MPICH", 4, 0x44000000, "MPICH Version: 4.2.0", here, size, world)
    if size != 4:
        assert mpich is not None and "handles of 4 bytes" in mpich
    other = core.abi_mismatch("Open MPI", size, world + 64, here, here, size, world)
    assert other is not None and "MPI_COMM_WORLD differs" in other
    if COMPILED:
        module, why = core.mpi_core()
        assert module is None or "the MPI mpi4py runs" in why


def test_a_module_built_from_other_sources_is_refused(tmp_path: Path) -> None:
    """hpcring.stamp: sources no newer than the module pass on their times alone; a newer source
    with other bytes refuses the module, saying to rebuild; a newer one with the same bytes
    (touched, a branch checked out and back) does not."""
    from types import SimpleNamespace

    from hpcring import stamp

    (tmp_path / "core.c").write_text("int f(void);\n")
    (tmp_path / "agree.h").write_text("#define A 1\n")
    (tmp_path / "notes.txt").write_text("not a source\n")
    built = tmp_path / "_core.so"
    built.write_bytes(b"")
    names = stamp.sources("core.c", str(tmp_path))
    assert names == ["agree.h", "core.c"]
    made = stamp.digest(names, str(tmp_path))
    module = SimpleNamespace(__file__=str(built), __name__="fake", SOURCES_DIGEST=made)
    later = built.stat().st_mtime + 10
    assert stamp.stale(module, "core.c", str(tmp_path)) is None
    (tmp_path / "agree.h").write_text("#define A 2\n")
    os.utime(tmp_path / "agree.h", (later, later))
    why = stamp.stale(module, "core.c", str(tmp_path))
    assert why is not None and "rebuild" in why and "fake was built from other sources" in why
    (tmp_path / "agree.h").write_text("#define A 1\n")
    os.utime(tmp_path / "agree.h", (later, later))
    assert stamp.stale(module, "core.c", str(tmp_path)) is None
    assert stamp.stale(module, "kernels.c", str(tmp_path)) is None  # no such source: a wheel


def test_the_compiled_modules_carry_their_sources_digest() -> None:
    """What setup.py wrote into each built module is the digest of the sources beside it now (a
    fresh build; where this fails, the module is refused and its Python path runs)."""
    from hpcring import stamp

    if COMPILED:
        assert stamp.digest(stamp.sources("kernels.c")) == kernels.COMPILED.SOURCES_DIGEST
        module, _ = core.mpi_core()
        if module is not None:
            assert stamp.digest(stamp.sources("core.c")) == module.SOURCES_DIGEST


# --- reductions -----------------------------------------------------------------------------------


def reduction_cases() -> Iterator[tuple[np.dtype, str]]:
    for dtype in DTYPES:
        for name in UFUNC_OPS:
            if dtype.kind != "c" or name in ("sum", "prod"):
                yield dtype, name


def loose_where(left: np.ndarray, right: np.ndarray) -> np.ndarray | None:
    """Where two NaNs meet in float32/float64/complex arithmetic (NumPy's bits vary there)."""
    if left.dtype.kind not in "fc" or left.dtype == np.float16:
        return None
    return is_nan(left) & is_nan(right)


@needs_c
@pytest.mark.parametrize(("dtype", "name"), list(reduction_cases()), ids=lambda v: getattr(v, "name", v))
def test_reductions_are_bitwise_numpys(dtype: np.dtype, name: str) -> None:
    """Op.combine and Op.reduce on every size, out apart, out = left, out = right."""
    rng = np.random.default_rng(list(reduction_cases()).index((dtype, name)))
    for n in SIZES:
        left, right = edge_values(rng, dtype, n), edge_values(rng, dtype, n)
        if n > 3 and dtype.kind not in "iu":  # NaN pairs, where the choice of NaN shows
            both = rng.random(n) < 0.02
            left[both], right[both] = np.array(np.nan).astype(dtype), -np.array(np.nan).astype(dtype)
        loose = loose_where(left, right)
        for target in ("apart", "left", "right"):
            assert_same_bits(*on_both(combined, name, left, right, target), loose)
        assert_same_bits(*on_both(reduced, name, left, right), loose)
        for offset in (1, 3):  # views at an element offset: still the kernels' case
            a, b = left[offset:], right[: max(n - offset, 0)]
            assert_same_bits(*on_both(combined, name, a, b), loose_where(a, b))
        assert kernels.COMPILED.combine(UFUNC_OPS[name], left, right, np.empty_like(left)), (
            "the kernel declined"
        )


@needs_c
def test_float16_and_bfloat16_nan_pairs_are_numpys_too() -> None:
    """For the 16-bit floats NumPy and ml_dtypes are consistent where two NaNs meet: so are the
    kernels, for every sign and payload pair, at every position of a long array."""
    for dtype, nans in (
        (np.dtype(np.float16), [0x7C01, 0x7E02, 0xFC03, 0xFE04]),
        (BF16, [0x7F81, 0x7FC2, 0xFF83, 0xFFC4]),
    ):
        pairs = np.array([(a, b) for a in nans for b in nans], np.uint16)
        left = np.tile(pairs[:, 0], 40).view(dtype)
        right = np.tile(pairs[:, 1], 40).view(dtype)
        for name in UFUNC_OPS:
            assert_same_bits(*on_both(combined, name, left, right))


@needs_c
def test_layouts_the_kernels_leave_to_numpy_give_numpys_result() -> None:
    """Strided, misaligned, partially overlapping, mixed-dtype, broadcast, read-only and
    non-NumPy arrays: the kernel declines (returns False), and the result is NumPy's."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1001).astype(np.float32)
    y = rng.standard_normal(1001).astype(np.float32)
    add = kernels.COMPILED.combine
    raw = np.zeros(4 * 1001 + 1, np.uint8)
    odd = raw[1:].view(np.float32)  # misaligned
    odd[...] = x
    assert not odd.flags.aligned
    frozen = np.empty_like(x)
    frozen.flags.writeable = False
    buf = np.concatenate([x, y])
    declined = [
        (x[::2], y[::2], np.empty(501, np.float32)),  # strided
        (odd, y, np.empty_like(y)),
        (buf[:1001], y, buf[1:1002]),  # out overlaps left partially
        (x, y.astype(np.float64), np.empty(1001, np.float64)),  # mixed dtypes
        (x, y[:1], np.empty_like(x)),  # broadcast
        (x.tolist(), y, np.empty_like(y)),  # not an ndarray
        (x, y, np.empty_like(x).view(np.recarray)),  # a subclass
        (x.astype(">f4"), y.astype(">f4"), np.empty(1001, ">f4")),  # byte-swapped
        (x, y, frozen),
    ]
    for a, b, out in declined:
        assert not add("add", a, b, out)
    assert not add("logaddexp", x, y, np.empty_like(x))  # an op it does not have
    for a, b, target in ((x[::2], y[::2], "apart"), (odd, y, "apart"), (odd, y, "left")):
        assert_same_bits(*on_both(combined, "sum", a, b, target))
    overlapping = buf.copy()
    with kernels.using("c"):
        OPS["sum"].combine(np, overlapping[:1001], y, overlapping[1:1002])
    np.testing.assert_array_equal(overlapping[1:1002], np.add(buf[:1001], y))


@needs_c
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_reductions_property(data: st.DataObject) -> None:
    """Any arrays hypothesis draws (any floats, NaNs and subnormals included), any shape."""
    dtype = data.draw(st.sampled_from([d for d in DTYPES if d != BF16]))
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=9))
    left = data.draw(hnp.arrays(dtype, shape))
    right = data.draw(hnp.arrays(dtype, shape))
    name = data.draw(st.sampled_from([n for n in UFUNC_OPS if dtype.kind != "c" or n in ("sum", "prod")]))
    assert_same_bits(*on_both(combined, name, left, right), loose_where(left, right))


# --- wire conversions -------------------------------------------------------------------------------


@needs_c
@pytest.mark.parametrize("wide", ["float32", "float64"])
@pytest.mark.parametrize("narrow_name", list(wire.WIRES))
def test_wire_conversions_are_bitwise_the_library_casts(wide: str, narrow_name: str) -> None:
    """narrow (rounded and on_grid), widen of every wire value, round_trip in place."""
    dtype, to = np.dtype(wide), wire.WIRES[narrow_name]
    rng = np.random.default_rng(len(wide) + len(narrow_name))
    for n in SIZES:
        spread = (rng.standard_normal(n) * 2.0 ** rng.integers(-140, 140, n)).astype(dtype)
        for x in (edge_values(rng, dtype, n), spread, spread[1:]):
            for on_grid in (False, True):
                assert_same_bits(*on_both(narrowed, x, to, on_grid))
            assert_same_bits(*on_both(tripped, x, to))
    every = np.arange(1 << 16, dtype=np.uint16).view(to)  # every bfloat16 / float16, NaNs included
    for view in (every, every[1:], every[: (1 << 16) - 3]):
        assert_same_bits(*on_both(widened, view, dtype))
    with np.errstate(all="ignore"):
        assert kernels.COMPILED.narrow(every.astype(dtype), np.empty(every.size, to), False)


@needs_c
@pytest.mark.parametrize("wide", ["float32", "float64"])
@pytest.mark.parametrize("narrow_name", ["bfloat16", "float16"])
def test_widen_add_is_the_widening_then_the_sum(wide: str, narrow_name: str) -> None:
    """The fused receive-and-add of a wire= step (a WIDEN_ADD row) against widen then
    Op.combine, with the widened value as either operand and the output the other operand."""
    rng = np.random.default_rng(5)
    to = BF16 if narrow_name == "bfloat16" else np.dtype(np.float16)
    for n in SIZES:
        words = random_bits(rng, to, n)
        other = edge_values(rng, np.dtype(wide), n)
        with np.errstate(all="ignore"):
            wide_words = wire.widen(words, np.empty(n, wide))
            for left in (True, False):
                operands = (wide_words, other) if left else (other, wide_words)
                want = np.empty(n, wide)
                OPS["sum"].combine(np, *operands, want)
                for into in ("apart", "other"):
                    out = np.empty(n, wide) if into == "apart" else other.copy()
                    assert kernels.COMPILED.widen_add(
                        words, other.copy() if into == "apart" else out, out, left
                    )
                    assert_same_bits(want, out, is_nan(wide_words) & is_nan(other))


@needs_c
def test_float64_to_bfloat16_rounds_once_as_ml_dtypes() -> None:
    """A float64 just past a bfloat16 tie rounds up; through float32 it would land on the tie and
    round to even (down)."""
    x = np.array([1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30), 2.0**-133 * (1 + 2**-40)])
    with kernels.using("c"):
        got = wire.narrow(x, np.empty(3, BF16))
    np.testing.assert_array_equal(got.view(np.uint16), x.astype(BF16).view(np.uint16))
    assert got.view(np.uint16)[0] != x.astype(np.float32).astype(BF16).view(np.uint16)[0]


# --- the reproducible sum's conversions -----------------------------------------------------------------


@needs_c
@pytest.mark.parametrize("dtype_name", exact_cases.DTYPES)
def test_exact_conversions_are_bitwise_the_numpy_blocks(dtype_name: str) -> None:
    """codes, encode (first or accumulating, int64 or float64 words) and decode (float words,
    small and cast integers, terms unknown; means) on every kind of input exact_cases makes."""
    fmt = exact.FORMATS[exact_cases.dtype_of(dtype_name)]
    rng = np.random.default_rng(len(dtype_name))
    for kind in exact_cases.KINDS:
        for n in (0, 1, 7, exact.BLOCK + 5):
            rows = exact_cases.values(n + len(kind), 3, n, dtype_name, kind)
            code = np.zeros(n, fmt.code)
            for row in rows:
                want, got = on_both(coded, fmt, row)
                assert_same_bits(want, got)
                assert_same_bits(*on_both(coded, fmt, row, code))  # the MAX step's: into the codes received
                np.maximum(code, got, out=code)
            if n:  # other ranks' larger values: a coarser grid for some elements
                higher = np.minimum(code.astype(np.int64) + rng.integers(0, 30, n), fmt.special - 1)
                code = np.where(rng.random(n) < 0.3, np.maximum(code, higher), code).astype(fmt.code)
            for floats in (False, True):
                want_words, got_words = on_both(encoded, fmt, rows[:1] if floats else rows, code, floats)
                assert_same_bits(want_words, got_words)
                if len(rows) > 1:  # a reduction step: another rank's words, this rank's added
                    theirs = encoded(fmt, rows[1:2], code, floats)
                    assert_same_bits(*on_both(encoded, fmt, rows[:1], code, floats, theirs))
                for terms in (1, 3) if floats else (None, 1, 3, 128, 129, 512, 513, 1024, 1025, 2048):
                    for divisor in (1, 3):
                        assert_same_bits(*on_both(decoded, fmt, want_words, code, divisor, terms, floats))
                if len(rows) > 1:  # the last step: rounded as this rank's contribution is added
                    theirs = encoded(fmt, rows[1:], code, floats)
                    for divisor in (1, 3):
                        args = (fmt, theirs, code, divisor, len(rows), floats, rows[0])
                        want, got = on_both(decoded, *args)
                        assert_same_bits(want, got)
                        summed = encoded(fmt, rows, code, floats)
                        whole = decoded(fmt, summed, code, divisor, len(rows), floats)
                        assert_same_bits(whole, got)  # the same bits as the words summed first


@needs_c
@pytest.mark.parametrize("dtype_name", exact_cases.DTYPES)
def test_exact_decode_of_any_words_is_bitwise(dtype_name: str) -> None:
    """Words up to 2^63 (an ExactSum's, past float64's 53 bits: the round-to-odd and carry paths),
    codes of every value, any terms and divisor."""
    fmt = exact.FORMATS[exact_cases.dtype_of(dtype_name)]
    rng = np.random.default_rng(99)
    n = 20001
    code = rng.integers(0, fmt.special + 1, n).astype(fmt.code)
    for scale in (10, 50, 55, 62, 63):
        words = rng.integers(-(2**scale), 2**scale, (n, fmt.words), dtype=np.int64)
        for terms in (None, 1, 100, 600, 1500, 5000):
            for divisor in (1, 7):
                assert_same_bits(*on_both(decoded, fmt, words, code, divisor, terms, False))


@needs_c
def test_exact_kernels_decline_what_is_not_their_case() -> None:
    """A code array of the wrong type, strided input, words of the wrong size or overlapping what
    they are made from, an odd terms or divisor: NumPy's path (the kernel returns False)."""
    c = kernels.COMPILED
    x = np.ones(10, np.float32)
    code = np.ones(10, np.uint8)
    words = np.empty((10, 1), np.int64)
    assert c.codes(x, None, code) and c.codes(x, code, code)
    assert c.encode(x, code, None, words, True) and c.encode(x, code, words, words, False)
    assert c.decode(words, None, code, x, 1, None, True) and c.decode(words, x, code, x, 1, 2, True)
    assert not c.codes(x, None, np.ones(10, np.uint16))
    assert not c.codes(x[::2], None, np.ones(5, np.uint8))
    assert not c.codes(x, np.ones(9, np.uint8), code)
    assert not c.encode(x, code, None, np.empty((10, 2), np.int64), False)
    assert not c.encode(x, code, np.empty((10, 2), np.int64), words, False)
    assert not c.encode(x, code, None, x.view(np.int32), False)
    assert not c.decode(words, None, code, x, 1, -1, False)
    assert not c.decode(words, None, code, x, 0, None, False)
    assert not c.decode(words, x[:9], code, x, 1, None, False)


def test_the_page_lists_the_require_variable() -> None:
    """HPCRING_REQUIRE_CORE is this test file's own variable: the configuration page says so."""
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert "`tests/test_kernels.py`" in page and "`HPCRING_REQUIRE_CORE`" in page
