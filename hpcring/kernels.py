"""The element kernels: compiled (``hpcring._kernels``, C) where they built, loaded and agree with
NumPy here; else nothing, and the caller's own NumPy code runs.

Each function returns True when it did the work, False when the caller's NumPy code must: the
compiled kernels are off (``HPCRING_CORE=python``, or they did not build or load), or the arrays
are not their case (CuPy, another dtype, a strided view, a partial overlap). So a caller needs one
line, ``if xp is np and kernels.combine(self.ufunc, left, right, out): return``, and its NumPy code
stays the readable reference that tests/test_kernels.py checks the kernels against, bit for bit.

Where IEEE leaves a choice (which NaN an addition of two NaNs returns, whether NumPy's complex
multiply fuses), the kernels do what the installed NumPy and ml_dtypes do, measured once at load.
A self-test on edge values runs each dtype's reductions against NumPy before a call first reduces
that dtype (`tested`: a process pays for the dtypes it uses, not all eight at its first call); until
then, and for any that differs, NumPy's loops run (`REASON` says which differed).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import config
from .stamp import stale

# The C side's dtype and op codes (enum hr_dtype, hr_op in hpcring/_c/reduce.h). bfloat16's place
# (code 1) is None until a call first needs bfloat16 (`add_bfloat16`): no array can hold one
# before ml_dtypes is imported, and importing it costs up to half a second (hpcring.ops).
DTYPES: tuple[np.dtype | None, ...] = tuple(
    None if t is None else np.dtype(t)
    for t in (
        np.float16,
        None,
        np.float32,
        np.float64,
        np.int32,
        np.int64,
        np.complex64,
        np.complex128,
        np.uint8,
        np.uint16,
    )
)
BFLOAT16_CODE = 1
DTYPE_CODES: dict[np.dtype, int] = {dtype: code for code, dtype in enumerate(DTYPES) if dtype is not None}
OP_CODES: dict[str, int] = {"add": 0, "maximum": 1, "minimum": 2, "multiply": 3}
_REDUCED = 8  # the first 8 codes are the dtypes hpcring reduces (the last two are exact.py's codes)

ACTIVE = "python"  # which kernels run: "c" or "python"
REASON = "not selected yet"  # why, in words (hpcring.info()["core_reason"])
COMPILED: Any = None  # the loaded hpcring._kernels, selected or not
QUIRKS: tuple[bool, bool, bool] = (False, False, False)  # what `_quirks` measured (the MPI-linked core's too)
OFF: tuple[tuple[int, int], ...] = ()  # (dtype, op) codes whose compiled reduction failed the self-test
UNTESTED: set[int] = set()  # dtype codes not self-tested yet (`tested`): NumPy's loops reduce them until then
_SETTLED: set[int] = set()  # dtype codes `tested` is done with: every side has their verdict
_TESTING = threading.Lock()  # held while `tested` tests
LISTENERS: list[Callable[[str], None]] = []  # told of every `select` (the MPI-linked core follows it)
# told when QUIRKS or `refused` change (a dtype tested, bfloat16 added): the MPI-linked core follows
QUIRK_LISTENERS: list[Callable[[], None]] = []


# --- the entry points: rebound to the compiled ones by `select` -------------------------------


def combine(ufunc: str, left: Any, right: Any, out: Any) -> bool:
    """out <- ``ufunc``(left, right), ufunc one of add, maximum, minimum, multiply (Op.combine)."""
    return False


def narrow(src: Any, out: Any, on_grid: bool) -> bool:
    """out (bfloat16/float16) <- src (float32/float64), as wire.narrow rounds."""
    return False


def widen(src: Any, out: Any) -> bool:
    """out (float32/float64) <- src (bfloat16/float16), exactly (wire.widen)."""
    return False


def round_trip(array: Any, scratch: Any) -> bool:
    """array <- widen(narrow(array)) in place, through scratch's dtype (wire.round_trip)."""
    return False


def widen_add(wire: Any, other: Any, out: Any, wire_left: bool) -> bool:
    """out <- widen(wire) + other (``wire_left``), or other + widen(wire): a receive and its sum."""
    return False


def codes(x: Any, into: Any, out: Any) -> bool:
    """out <- exact.codes(x), the larger of it and ``into`` where that is not None."""
    return False


def encode(x: Any, code: Any, into: Any, words: Any, floats: bool) -> bool:
    """exact.encode of one contribution into the words (added to ``into`` where not None)."""
    return False


def decode(words: Any, mine: Any, code: Any, out: Any, divisor: int, terms: int | None, floats: bool) -> bool:
    """exact.decode of the summed words (plus ``mine``'s, where not None) into out."""
    return False


def gather(own: Any, rows: Any, stride: int, others: int, out: Any, divisor: int) -> bool:
    """exact.py's gathered sum: out <- codes, encode and decode of own and ``others`` rows of ``rows``
    (row k from k x stride elements on), float words, in one pass where it can."""
    return False


_NAMES = ("combine", "narrow", "widen", "widen_add", "round_trip", "codes", "encode", "decode", "gather")
_PYTHON: dict[str, Callable[..., bool]] = {name: globals()[name] for name in _NAMES}


# --- choosing, probing, self-testing --------------------------------------------------------------


def _load() -> tuple[Any, str]:
    """The compiled module, set up for this NumPy, and the words for REASON; (None, why not)."""
    global QUIRKS, OFF
    try:  # by name: an optional build, which may not be there
        _kernels = importlib.import_module("hpcring._kernels")
    except ImportError as error:
        return None, f"hpcring._kernels did not load ({error}); reinstall with a C compiler to build it"
    why = stale(_kernels, "kernels.c")
    if why:
        return None, why
    try:
        quirks = _quirks()
        untested = {code for code, dtype in enumerate(DTYPES[:_REDUCED]) if dtype is not None}
        _kernels.setup(np.ndarray, DTYPES, *quirks, refused(untested=untested))
        QUIRKS, OFF = quirks, ()
        UNTESTED.update(untested)
    except Exception as error:  # a module of another build than this file expects: Python's path
        return None, f"hpcring._kernels failed its setup ({type(error).__name__}: {error})"
    return _kernels, f"compiled kernels (hpcring._kernels, {_kernels.COMPILER.split()[0]} {_kernels.CFLAGS})"


def _kept(off: Any) -> str:
    """The (dtype, op) codes left to NumPy's loops, in words."""
    return ", ".join(f"{DTYPES[d].name} {list(OP_CODES)[o]}" for d, o in off)  # type: ignore[union-attr]


def refused(untested: set[int] | None = None) -> tuple[tuple[int, int], ...]:
    """The (dtype, op) codes the compiled reductions leave to NumPy's loops (the C side's
    ``combine_off``): those that failed the self-test, and every op of a dtype not tested yet."""
    waiting = UNTESTED if untested is None else untested
    return (*OFF, *((code, op) for code in sorted(waiting) for op in OP_CODES.values()))


def tested(dtype: np.dtype) -> None:
    """Self-test ``dtype``'s compiled reductions against NumPy, once per process, before a call
    first reduces it (the engine asks as it prepares a call); any that differs stays NumPy's."""
    global OFF, REASON, _WHY
    code = DTYPE_CODES.get(dtype)
    if code is None or code in _SETTLED:
        return
    with _TESTING:  # a second thread's call of that dtype waits until every side has the verdict
        if code in _SETTLED:
            return
        if COMPILED is not None and code in UNTESTED:
            COMPILED.setup(np.ndarray, DTYPES, *QUIRKS, refused(untested=UNTESTED - {code}))  # on, to test
            off = _self_test(COMPILED, [dtype])
            OFF = (*OFF, *off)
            UNTESTED.discard(code)
            COMPILED.setup(np.ndarray, DTYPES, *QUIRKS, refused())
            if off:  # say so, as `REASON` always has
                _WHY = f"{_WHY.split('; ')[0]}; NumPy's loops kept for {_kept(OFF)}"
                REASON = _WHY if ACTIVE == "c" else REASON
            for listener in QUIRK_LISTENERS:
                listener()
        UNTESTED.discard(code)
        _SETTLED.add(code)


def add_bfloat16(dtype: np.dtype) -> None:
    """ml_dtypes' bfloat16 (``dtype``), now that a call needs it: its code, what its additions of
    two NaNs return, and the self-test of its compiled reductions (`tested`)."""
    global DTYPES, QUIRKS
    DTYPES = (*DTYPES[:BFLOAT16_CODE], dtype, *DTYPES[BFLOAT16_CODE + 1 :])
    DTYPE_CODES[dtype] = BFLOAT16_CODE
    UNTESTED.add(BFLOAT16_CODE)
    if COMPILED is None:
        return
    QUIRKS = (QUIRKS[0], _bf16_nan_right(dtype), QUIRKS[2])
    tested(dtype)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}") if a.dtype.kind != "c" else np.uint64)


def _quirks() -> tuple[bool, bool, bool]:
    """What this NumPy does where IEEE leaves the choice to the implementation: which NaN survives
    float16 additions of two NaNs, and whether complex multiply fuses (bfloat16's NaNs: measured
    when bfloat16 is first needed, `_bf16_nan_right`)."""
    with np.errstate(all="ignore"):
        half = np.array([0x7E01], np.uint16).view(np.float16), np.array([0xFE02], np.uint16).view(np.float16)
        half_right = int(_bits(np.add(*half))[0]) == 0xFE02
        # fma(ar, br, -(ai bi)) differs from ar br - ai bi in the last bit for these
        a = np.full(64, 1 + 2**-23 + 1j * (1 + 2**-22), np.complex64)
        b = np.full(64, 1 - 2**-23 + 1j * (1 - 2**-22), np.complex64)
        p = a * b
        ar, ai, br, bi = (np.float64(v) for v in (a[0].real, a[0].imag, b[0].real, b[0].imag))
        fused = np.float32(ar * br - np.float64(np.float32(ai * bi)))
    return half_right, False, bool(p[0].real == fused and p[-1].real == fused)


def _bf16_nan_right(bf16: np.dtype) -> bool:
    """Which NaN survives an ml_dtypes bfloat16 addition of two NaNs (only the sign survives the
    narrowing): the right one's."""
    with np.errstate(all="ignore"):
        brain = np.array([0x7FC1], np.uint16).view(bf16), np.array([0xFFC2], np.uint16).view(bf16)
        return int(_bits(np.add(*brain))[0]) == 0xFFC0


class _Stream:
    """Reproducible pseudo-random numbers from a seed (splitmix64), in NumPy arithmetic: the
    self-test runs in a first call, where importing numpy.random would cost more than the test."""

    def __init__(self, seed: int) -> None:
        self.state = np.uint64(seed * 0x9E3779B97F4A7C15 % (1 << 64))

    def bits(self, n: int) -> np.ndarray:
        """n uniform 64-bit words (array arithmetic: it wraps without a warning)."""
        z = self.state + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        self.state = z[-1] if n else self.state
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


# Each float dtype's largest value, smallest normal and smallest subnormal, as bit patterns by
# itemsize (bfloat16 apart): np.finfo builds them at its first call per dtype (0.1-0.6 ms for
# the three here), which the self-test would add to a first call.
_EXTREMES = {2: (0x7BFF, 0x0400, 0x0001), 4: (0x7F7FFFFF, 0x00800000, 1), 8: (0x7FEFFFFFFFFFFFFF, 1 << 52, 1)}
_BF16_EXTREMES = (0x7F7F, 0x0080, 0x0001)


def _extremes(dtype: np.dtype) -> list[float]:
    """``dtype``'s (max, tiny, smallest subnormal), as floats."""
    patterns = _BF16_EXTREMES if dtype.kind == "V" else _EXTREMES[dtype.itemsize]
    return np.array(patterns, f"u{dtype.itemsize}").view(dtype).astype(np.float64).tolist()


def _edge_values(dtype: np.dtype, n: int, seed: int) -> np.ndarray:
    """n values of ``dtype`` full of edges: signed zeros, Infs, NaNs, subnormals, extremes, ties
    (one draw of random words per call: the self-test runs in a first call)."""
    rng = _Stream(seed)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        words = rng.bits(2 * n)
        edges = np.array([0, 1, -1, info.max, info.min, info.max - 1], dtype=np.int64)[:n]
        out = words[:n].astype(np.dtype(f"u{dtype.itemsize}")).view(dtype)  # the whole range
        out[: len(edges)] = edges.astype(dtype)
        return out[np.argsort(words[n:], kind="stable")]
    if dtype.kind == "c":
        part = np.dtype(np.float32 if dtype.itemsize == 8 else np.float64)
        out = np.empty(n, dtype)
        # the parts from streams 2^32 words apart (seed + 1 would give the same words, one on)
        out.real, out.imag = _edge_values(part, n, seed), _edge_values(part, n, seed + (1 << 32))
        return out
    big, tiny, subnormal = _extremes(dtype)
    words = rng.bits(4 * n)
    scale = np.array([1.0, tiny, big / 4, subnormal * 3])[words[:n] % np.uint64(4)]
    unit = ((words[n : 3 * n] >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
    u, v = unit[:n], unit[n:]
    with np.errstate(all="ignore"):
        out = (np.sqrt(-2.0 * np.log(u)) * np.cos(2.0 * np.pi * v) * scale).astype(dtype)  # Box-Muller
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, big, -big, tiny][:n]
    out[: len(edges)] = np.array(edges).astype(dtype)
    return out[np.argsort(words[3 * n :], kind="stable")]


def _nan(a: np.ndarray) -> np.ndarray:
    """isnan, bfloat16 included (through float32), complex where either part is NaN."""
    return np.isnan(a.astype(np.float32) if a.dtype.kind == "V" else a)


def _self_test(module: Any, dtypes: list[np.dtype]) -> list[tuple[int, int]]:
    """The (dtype, op) pairs whose compiled reduction differs from NumPy's on edge values. Only
    where at most one operand is NaN: for two NaNs NumPy's own float32 bits depend on the position."""
    off = []
    with np.errstate(all="ignore"):
        for dtype in dtypes:
            left, right = _edge_values(dtype, 67, 1), _edge_values(dtype, 67, 2)
            if dtype.kind not in "iu":
                right[_nan(left) & _nan(right)] = 1
            for ufunc, op in OP_CODES.items():
                if dtype.kind == "c" and ufunc in ("maximum", "minimum"):
                    continue
                want = getattr(np, ufunc)(left, right)
                got = np.empty_like(want)
                if not module.combine(ufunc, left, right, got) or not np.array_equal(_bits(got), _bits(want)):
                    off.append((DTYPE_CODES[dtype], op))
    return off


def select(choice: str | None = None) -> tuple[str, str]:
    """Choose the kernels: ``"c"``, ``"python"``, or None for HPCRING_CORE's choice (unset: the
    compiled ones where they load). Returns (ACTIVE, REASON). ``"c"`` where they do not load
    raises ImportError saying why."""
    global ACTIVE, REASON, COMPILED, _WHY
    wanted = config.current().core if choice is None else choice
    if wanted not in (None, "c", "python"):
        raise ValueError(f"hpcring.kernels.select: choice must be 'c', 'python' or None, got {choice!r}")
    if wanted != "python" and not _WHY:
        COMPILED, _WHY = _load()
        _SETTLED.clear()  # a dtype settled while no compiled kernels were loaded is tested now
    if wanted == "python":
        ACTIVE, REASON = "python", "HPCRING_CORE=python" if choice is None else "chosen: python"
    elif COMPILED is None:
        if wanted == "c":
            raise ImportError(f"HPCRING_CORE=c asks for the compiled core, but {_WHY}")
        ACTIVE, REASON = "python", _WHY
    else:
        ACTIVE, REASON = "c", _WHY
    for name in _NAMES:
        globals()[name] = getattr(COMPILED, name) if ACTIVE == "c" else _PYTHON[name]
    for listener in LISTENERS:
        listener(ACTIVE)
    return ACTIVE, REASON


_WHY = ""  # what loading the compiled kernels gave, in words (empty: not tried yet)


@contextlib.contextmanager
def using(choice: str) -> Iterator[None]:
    """Within it, the kernels ``choice`` ("c" or "python") run; as before after (for tests)."""
    before = ACTIVE, REASON
    select(choice)
    try:
        yield
    finally:
        select(before[0])
        globals()["REASON"] = before[1]


select()
