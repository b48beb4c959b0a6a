"""Reproducible float sums: to an exact integer representation and back, and `ExactSum`.

A float sum depends on its order; an integer sum does not (and every algorithm here sums
integers exactly: two's-complement words wrap, so even the order of overflows does not
matter, only that the final sum fits). So a reproducible sum is four steps, each the same
whatever the rank count, algorithm, ring order or chunking:

1. agree, per element, on the largest exponent over every contribution on every rank: a MAX
   all-reduce of one small integer per element (uint8; uint16 for float64), run by the
   caller's algorithm like any other all-reduce (so it takes the same topology, channel and
   byte count; MAX is exact in every algorithm);
2. convert each contribution to fixed point on that absolute grid, ``P`` bits below the
   element's largest power of two, truncating toward zero (exact, deterministic);
3. sum the integer words with the caller's algorithm;
4. round the integer once, to nearest even, to the output dtype, on every rank identically.

Why one word per element (float16, bfloat16, float32; two for float64) and not ReproBLAS's
k-word binned accumulation: binning on fixed boundaries needs one more word per element for
the same guaranteed precision (the top bin's fill varies by a whole bin width), so 17 bytes
per float32 element on the wire instead of 9, and the ring on one more word measured 1.0-2.2x
the ring on ours, on top of a conversion into bins (docs/reproducibility.md has the figures;
there the conversion, a dozen NumPy passes, is what costs most). Binning's one advantage, streaming
local adds in fixed memory, `ExactSum` gives up: it keeps its contributions until
`allreduce`, where they are converted on the agreed grid.

Limits: up to MAX_CONTRIBUTIONS (2^20) contributions in all (ranks x adds), so the summed
words cannot overflow. Special values follow IEEE addition: any NaN gives NaN, +Inf and -Inf
together give NaN, otherwise an infinity wins; a finite sum too large for the dtype rounds to
+-Inf; the sum is -0 only when every contribution is -0. docs/reproducibility.md states the
error bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .ops import BFLOAT16, OPS

HEADROOM = 20  # bits above the grid's top: the words of 2^20 contributions sum without overflow
MAX_CONTRIBUTIONS = 1 << HEADROOM
ONE_WORD = 62 - HEADROOM  # 42 bits below the element's top: |sum| < 2^62 (float64's hi word too)
TWO_WORDS_LOW = 63 - HEADROOM  # float64: the low word holds 43 bits, non-negative
TWO_WORDS = TWO_WORDS_LOW + ONE_WORD  # 85 bits below the top in all (float64 has 53)
_NAN, _NEG_INF, _POS_INF = 1 << 42, 1 << 21, 1  # special elements: counts, in disjoint bit fields

OPS_REPRODUCIBLE = ("sum", "mean")  # max and min are exact already; prod is not a sum


@dataclass(frozen=True)
class Format:
    """How one float dtype lies in its bits, and how many 64-bit words its fixed point takes."""

    dtype: np.dtype
    uint: np.dtype  # the unsigned integer of the same size, to read the bits
    mantissa: int  # stored mantissa bits
    bias: int
    exponent_mask: int
    code: np.dtype  # the agreed per-element integer (the biased exponent, see `codes`)
    words: int

    @property
    def precision(self) -> int:
        """P: the grid's bits below the element's top."""
        return ONE_WORD if self.words == 1 else TWO_WORDS

    @property
    def special(self) -> int:
        """The code of Inf and NaN: the all-ones exponent."""
        return self.exponent_mask


FORMATS: dict[np.dtype, Format] = {
    f.dtype: f
    for f in (
        Format(np.dtype(np.float16), np.dtype(np.uint16), 10, 15, 0x1F, np.dtype(np.uint8), 1),
        Format(BFLOAT16, np.dtype(np.uint16), 7, 127, 0xFF, np.dtype(np.uint8), 1),
        Format(np.dtype(np.float32), np.dtype(np.uint32), 23, 127, 0xFF, np.dtype(np.uint8), 1),
        Format(np.dtype(np.float64), np.dtype(np.uint64), 52, 1023, 0x7FF, np.dtype(np.uint16), 2),
    )
}


def format_of(dtype: np.dtype, caller: str = "hpcring.allreduce") -> Format:
    """The format of ``dtype``; TypeError for a dtype with no reproducible sum here."""
    try:
        return FORMATS[np.dtype(dtype)]
    except KeyError:
        names = ", ".join(d.name for d in FORMATS)
        raise TypeError(f"{caller}: reproducible=True needs a float dtype ({names}), got {dtype}") from None


def check(op: str, dtype: np.dtype, caller: str = "hpcring.allreduce", accumulated: bool = False) -> bool:
    """Whether a reproducible call needs the exact path (False: the plain one is reproducible
    already: integers, max, min); ValueError or TypeError where it cannot be reproducible.
    ``accumulated``: an `ExactSum`'s call, which always takes the exact path."""
    plain = op in ("max", "min") or (np.dtype(dtype).kind in "iu" and op == "sum")
    if plain and not accumulated:
        return False
    if op not in OPS_REPRODUCIBLE:
        raise ValueError(f"{caller}: reproducible=True applies to op 'sum' and 'mean', not {op!r}")
    format_of(dtype, caller)
    return True


def codes(fmt: Format, x: Any, xp: Any, out: Any = None, scratch: Any = None) -> Any:
    """The per-element integer the ranks agree on with MAX: the biased exponent, except that
    subnormals and zeros count as exponent 1 (the same grid) and -0 as 0, so a MAX of 0 means
    every contribution was -0. Into ``out`` if given (``scratch``: as in `encode`)."""
    bits = x.view(fmt.uint)
    shifted = xp.right_shift(
        bits, fmt.mantissa, out=None if scratch is None else scratch("exact-bits", fmt.uint)
    )
    if fmt.exponent_mask != 0xFF:  # float16 and float64: the sign bit is still in the code's range
        shifted &= fmt.exponent_mask
    code = xp.empty(x.size, fmt.code) if out is None else out
    xp.copyto(code, shifted, casting="unsafe")  # uint8 drops float32's and bfloat16's sign bit
    if code.size and code.min() == 0:  # zeros and subnormals: rare, so fixed up apart
        zero = code == 0
        code[zero] = 1 - (bits[zero] == (1 << (fmt.uint.itemsize * 8 - 1)))
    return code


def _shifts(fmt: Format, code: Any, offset: int, xp: Any, scratch: Any) -> Any:
    """Per element, ``offset - top`` as int32, where 2^top bounds every contribution (|x| < 2^top):
    the ldexp exponent to the grid (offset = P) or, negated, back."""
    shift = scratch("exact-shift", np.dtype(np.int32))
    xp.copyto(shift, code, casting="unsafe")
    xp.maximum(shift, 1, out=shift)  # zeros and subnormals: the grid of exponent 1
    xp.subtract(offset + fmt.bias - 1, shift, out=shift)
    return shift


def _special_words(x: Any, xp: Any) -> Any:
    """Counts of NaN, -Inf and +Inf among the contributions, one bit field each."""
    return (
        xp.isnan(x).astype(np.int64) * _NAN
        + (x == -np.inf).astype(np.int64) * _NEG_INF
        + (x == np.inf).astype(np.int64) * _POS_INF
    )


def _special(fmt: Format, code: Any) -> Any:
    """The elements with an Inf or NaN somewhere (None where none: one reduction, no temporary)."""
    return code == fmt.special if code.size and code.max() == fmt.special else None


def encode(
    fmt: Format, x: Any, code: Any, words: Any, xp: Any, scratch: Any, first: bool = False, shift: Any = None
) -> None:
    """words += the fixed point of ``x`` on the grid that the agreed ``code`` sets (``words``:
    int64, ``fmt.words`` rows of x.size; wrapping adds, which stay exact as long as the final
    sums fit); ``first``: words = instead, so nothing needs zeroing. ``scratch(name, dtype)``
    gives reused temporaries of x.size: fresh pages for every temporary cost more than the
    arithmetic (at 16 MiB, several times over on a shared machine).

    ldexp scales by a power of two exactly wherever the result reaches 1 (below that the cast
    truncates to 0 anyway), and the cast to int64 truncates toward zero. By measurement ldexp
    with an exponent per element beats looking the scale up in a table (NumPy's take: 24 ms
    for 4 Mi elements, ldexp 4 ms) and building it from bits (6 ms).
    """
    special = _special(fmt, code)
    with np.errstate(invalid="ignore", over="ignore"):
        if fmt.words == 1:  # float32 (float16 and bfloat16 widen to it exactly): 42 bits below the top
            shift = _shifts(fmt, code, ONE_WORD, xp, scratch) if shift is None else shift
            wide = x if fmt.dtype == np.float32 else x.astype(np.float32)
            value = xp.ldexp(wide, shift, out=scratch("exact-f32", np.dtype(np.float32)))
            word = words[0] if first else scratch("exact-i64", np.dtype(np.int64))
            xp.copyto(word, value, casting="unsafe")
            if special is not None:
                word[special] = _special_words(x[special].astype(np.float64), xp)
            if not first:
                words[0] += word
            return
        # float64: 85 bits below the top; hi carries the upper 42 bits (signed), lo the lower 43
        # (non-negative, so the low words' sum needs no sign).
        shift = _shifts(fmt, code, TWO_WORDS, xp, scratch) if shift is None else shift
        value = xp.ldexp(x, shift, out=scratch("exact-f64", np.dtype(np.float64)))
        xp.trunc(value, out=value)
        hi = xp.multiply(value, 2.0**-TWO_WORDS_LOW, out=scratch("exact-f64b", np.dtype(np.float64)))
        xp.floor(hi, out=hi)
        if special is not None:
            hi[special] = _special_words(x[special], xp)
            value[special] = hi[special] * 2.0**TWO_WORDS_LOW  # lo becomes 0 below
        word = words[0] if first else scratch("exact-i64", np.dtype(np.int64))
        xp.copyto(word, hi, casting="unsafe")
        if not first:
            words[0] += word
        xp.multiply(hi, 2.0**TWO_WORDS_LOW, out=hi)
        xp.subtract(value, hi, out=value)
        word = words[1] if first else scratch("exact-i64", np.dtype(np.int64))
        xp.copyto(word, value, casting="unsafe")
        if not first:
            words[1] += word


def decode(
    fmt: Format,
    words: Any,
    code: Any,
    out: Any,
    divisor: int,
    xp: Any,
    scratch: Any,
    terms: int | None = None,
    shift: Any = None,
) -> None:
    """out <- the summed ``words`` rounded once to out's dtype (divided by ``divisor`` for a
    mean first, in float64); the same bits wherever the same words arrive. ``words`` is
    overwritten; ``scratch`` as in `encode`; ``terms``: how many contributions were summed,
    where known (None: up to MAX_CONTRIBUTIONS); ``shift``: `encode`'s, if at hand (negated here)."""
    special = _special(fmt, code)
    value = scratch("exact-f64", np.dtype(np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        if fmt.words == 1:
            total = words[0]
            xp.copyto(value, total, casting="unsafe")
            may_be_big = terms is None or terms << ONE_WORD >= 1 << 53  # |total| < terms x 2^42
            if may_be_big and total.size and n_big(total, xp):
                # |total| < 2^62 has more bits than float64 holds: round to odd on a grid 2^10
                # first (its last bit set where bits were dropped), which then rounds to the
                # dtype's 24 or fewer bits exactly as the integer itself would (round-to-odd
                # with >= 2 spare bits); only where |total| >= 2^53, else the cast is exact.
                big = xp.abs(total) >= (1 << 53)
                odd = (total[big] >> 10) | ((total[big] & 1023) != 0)
                value[big] = odd.astype(np.float64) * 1024.0
        else:
            hi, lo = words[0], words[1]
            carry = xp.right_shift(lo, TWO_WORDS_LOW, out=scratch("exact-i64", np.dtype(np.int64)))
            hi += carry
            xp.left_shift(carry, TWO_WORDS_LOW, out=carry)
            lo -= carry
            # hi * 2^43 + lo exactly as a float64 sum of two exact terms: one rounding.
            xp.copyto(value, hi, casting="unsafe")
            rest = lo
            if terms is None or terms << ONE_WORD >= 1 << 52:  # |hi| may pass 2^53: keep what the cast lost
                rest = carry
                xp.copyto(rest, value, casting="unsafe")
                xp.subtract(hi, rest, out=rest)
                xp.left_shift(rest, TWO_WORDS_LOW, out=rest)
                rest += lo
            value *= 2.0**TWO_WORDS_LOW
            xp.add(value, rest, out=value, casting="unsafe")  # rest < 2^53: exact in float64
            total = hi
        shift = _shifts(fmt, code, fmt.precision, xp, scratch) if shift is None else shift
        xp.negative(shift, out=shift)
        # Back to the element's scale: exact (a result below float64's normal range is a
        # multiple of the smallest subnormal, so it fits), then one rounding to the dtype.
        xp.ldexp(value, shift, out=value)
        if divisor != 1:
            value /= divisor
        xp.copyto(out, value, casting="unsafe")
        if special is not None:
            counts = total[special]
            pos, neg = counts & (_NEG_INF - 1), (counts >> 21) & (_NEG_INF - 1)
            nan = ((counts >> 42) > 0) | ((pos > 0) & (neg > 0))
            inf = xp.where(pos > 0, np.inf, -np.inf)
            out[special] = xp.where(nan, np.nan, inf).astype(fmt.dtype)
        if code.size and code.min() == 0:
            out[code == 0] = -0.0


def n_big(total: Any, xp: Any) -> bool:
    """Whether some |total| needs more than float64's 53 bits (two reductions, no temporaries)."""
    return bool(total.max() >= (1 << 53)) or bool(total.min() <= -(1 << 53))


def run(ch: Any, algorithm: str, parts: list[Any], dst: Any, op: str) -> None:
    """dst <- the reproducible sum (op "sum") or mean over every rank of the flat arrays ``parts``
    (this rank's contributions: one for `hpcring.allreduce`, any number for `ExactSum`).

    The MAX and the integer sum run by ``algorithm`` on ``ch`` (`auto` chooses for the sizes
    that travel); with one rank there is nothing to exchange, and the same conversion runs, so
    the bits are those of any rank count.
    """
    from . import algorithms

    xp, fmt, n = ch.xp, FORMATS[dst.dtype], dst.size
    # Reused across calls, like an algorithm's scratch: fresh pages cost more than the sum.
    code = ch.scratch("exact-code", n, fmt.code)
    words = ch.scratch("exact-words", fmt.words * n, np.dtype(np.int64)).reshape(fmt.words, n)

    def scratch(name: str, dtype: np.dtype) -> Any:
        return ch.scratch(name, n, dtype)

    if parts:
        codes(fmt, parts[0], xp, out=code, scratch=scratch)
    else:
        code.fill(0)  # no contribution here: the MAX's identity
    for part in parts[1:]:
        xp.maximum(code, codes(fmt, part, xp, scratch=scratch), out=code)
    if ch.size > 1 and n > 0:
        algorithms.prepare(algorithm, ch, n, code.itemsize, True).run(ch, code, code, OPS["max"])
    if not parts:
        words.fill(0)
    shift = _shifts(fmt, code, fmt.precision, xp, scratch)  # once for every part, and back
    for index, part in enumerate(parts):
        encode(fmt, part, code, words, xp, scratch, first=index == 0, shift=shift)
    if ch.size > 1 and n > 0:
        flat = words.reshape(-1)
        algorithms.prepare(algorithm, ch, flat.size, 8, True).run(ch, flat, flat, OPS["sum"])
    terms = ch.size if len(parts) == 1 else None  # an ExactSum's other ranks may hold more
    decode(fmt, words, code, dst, ch.size if op == "mean" else 1, xp, scratch, terms, shift)


def bytes_sent(
    algorithm: str, count: int, dtype: np.dtype, size: int, rank: int, per_node: int = 1
) -> int | None:
    """Bytes this rank hands to MPI for one reproducible call: the algorithm's formula for the
    agreed integers plus the one for the words (None where the algorithm's is not visible)."""
    from . import algorithms

    fmt = FORMATS[np.dtype(dtype)]
    codes = algorithms.bytes_sent(algorithm, count, fmt.code.itemsize, size, rank, per_node)
    words = algorithms.bytes_sent(algorithm, fmt.words * count, 8, size, rank, per_node)
    return None if codes is None or words is None else codes + words


def tagged(op: str) -> str:
    """The op as the ranks' agreement sees it on the reproducible path, so that ranks that
    disagree on ``reproducible=`` disagree on the op, and are told so."""
    return f"{op} (reproducible=True)"


class ExactSum:
    """An accumulator of local contributions whose all-reduce is reproducible.

    ``acc = ExactSum(like=x)``; ``acc.add(a)`` any number of times (arrays of x's shape and
    dtype); ``acc.allreduce(comm=..., algorithm=...)`` returns the sum over every contribution
    on every rank, whose bits depend only on that multiset: not on how the contributions are
    split over the ranks, the order of the adds, the rank count or the algorithm. So B
    microbatches over G ranks give the same bits for every G. The contributions are kept (one
    copy per add) until `allreduce`, where they are converted on the grid all ranks agree on.
    """

    def __init__(self, like: Any) -> None:
        from .arrays import adapter_for

        self._adapter = adapter_for(like)
        self.dtype = self._adapter.dtype(like)
        self.shape = tuple(self._adapter.shape(like))
        format_of(self.dtype, "hpcring.ExactSum")
        self._like = like
        self._parts: list[Any] = []

    def add(self, a: Any) -> None:
        """Keep a copy of ``a`` as one contribution."""
        adapter = self._adapter
        if not adapter.owns(a) or adapter.dtype(a) != self.dtype or tuple(adapter.shape(a)) != self.shape:
            raise ValueError(
                f"hpcring.ExactSum.add: expected an array of shape {self.shape} and dtype {self.dtype}"
            )
        if len(self._parts) >= MAX_CONTRIBUTIONS:
            raise ValueError(f"hpcring.ExactSum.add: at most {MAX_CONTRIBUTIONS} contributions")
        self._parts.append(adapter.xp.array(a, copy=True).reshape(-1))

    def __len__(self) -> int:
        return len(self._parts)

    def clear(self) -> None:
        """Forget every contribution (for the next step)."""
        self._parts.clear()

    def allreduce(
        self,
        *,
        comm: Any = None,
        algorithm: str = "ring",
        op: str = "sum",
        out: Any = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> Any:
        """The reproducible sum (or mean over the ranks) of every rank's contributions, on
        every rank; in ``out`` if given, else a new array. Collective; the ranks agree first, as
        `hpcring.allreduce` does (same checks, same errors)."""
        from . import api

        result = self._adapter.xp.zeros(self.shape, dtype=self.dtype) if out is None else out
        return api.allreduce(
            result,
            op=op,
            algorithm=algorithm,
            comm=comm,
            check=check,
            timeout=timeout,
            reproducible=True,
            _parts=self._parts,
        )
