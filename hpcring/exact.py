"""Reproducible float sums: to an exact integer representation and back (`hpcring.ExactSum` and
``reproducible=True`` run on it).

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
3. sum the integer words with the caller's algorithm (int64; for `hpcring.allreduce` on up to
   2^10 ranks, float64 words holding the same integers, which float64 sums exactly);
4. round the integer once, to nearest even, to the output dtype, on every rank identically.

Why one word per element (float16, bfloat16, float32; two for float64) and not ReproBLAS's
k-word binned accumulation: binning on fixed boundaries needs one more word per element for
the same guaranteed precision (the top bin's fill varies by a whole bin width), so 17 bytes
per float32 element on the wire instead of 9, and the ring on one more word measured 1.2-2.2x
the ring on ours, on top of a conversion into bins (docs/reproducibility.md has the figures;
there the conversion, about 15 NumPy passes over cache-sized blocks, is what costs most).
Binning's one advantage, streaming local adds in fixed memory, `ExactSum` gives up: it keeps
its contributions until `allreduce`, where they are converted on the agreed grid.

Limits: up to MAX_CONTRIBUTIONS (2^20) contributions in all (ranks x adds), so the summed
words cannot overflow. Special values follow IEEE addition: any NaN gives NaN, +Inf and -Inf
together give NaN, otherwise an infinity wins; a finite sum too large for the dtype rounds to
+-Inf; the sum is -0 only when every contribution is -0. docs/reproducibility.md states the
error bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import kernels, ops
from .channel import Channel

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


_FORMATS: dict[np.dtype, Format] = {
    f.dtype: f
    for f in (
        Format(np.dtype(np.float16), np.dtype(np.uint16), 10, 15, 0x1F, np.dtype(np.uint8), 1),
        Format(np.dtype(np.float32), np.dtype(np.uint32), 23, 127, 0xFF, np.dtype(np.uint8), 1),
        Format(np.dtype(np.float64), np.dtype(np.uint64), 52, 1023, 0x7FF, np.dtype(np.uint16), 2),
    )
}
_NAMES = "float16, bfloat16, float32, float64"


def _bfloat16_format() -> Format:
    """bfloat16's format, made when a call first needs it (ml_dtypes is imported then)."""
    return Format(ops.bfloat16(), np.dtype(np.uint16), 7, 127, 0xFF, np.dtype(np.uint8), 1)


def format_of(dtype: Any) -> Format:
    """The format of ``dtype``; TypeError for a dtype with no reproducible sum here."""
    dtype = np.dtype(dtype)
    found = _FORMATS.get(dtype)
    if found is None and ops.is_bfloat16(dtype):
        found = _FORMATS[dtype] = _bfloat16_format()
    if found is None:
        raise TypeError(f"reproducible=True needs a float dtype ({_NAMES}), got {dtype}")
    return found


def __getattr__(name: str) -> Any:
    """``FORMATS`` (dtype -> Format, bfloat16 included) imports ml_dtypes: made when asked for."""
    if name == "FORMATS":
        format_of(ops.bfloat16())
        return dict(_FORMATS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check(op: str, dtype: np.dtype, accumulated: bool = False) -> bool:
    """Whether a reproducible call needs the exact path (False: the plain one is reproducible
    already: integers, max, min); ValueError or TypeError where it cannot be reproducible.
    ``accumulated``: an `ExactSum`'s call, which always takes the exact path."""
    plain = op in ("max", "min") or (np.dtype(dtype).kind in "iu" and op == "sum")
    if plain and not accumulated:
        return False
    if op not in OPS_REPRODUCIBLE:
        raise ValueError(f"reproducible=True applies to op 'sum' and 'mean', not {op!r}")
    format_of(dtype)
    return True


BLOCK = 1 << 15  # elements converted at a time, so that every temporary stays in cache
_MAGIC = 1.5 * 2.0**52  # an integral float64 v with |v| < 2^51, plus this, holds v in its low bits
_MAGIC_BITS = int(np.array(_MAGIC).view(np.int64))


def _step(n: int, xp: Any) -> int:
    """Elements per block: BLOCK on the CPU; on a GPU, the whole array (a kernel launch per
    block would cost more than the cache saves)."""
    return BLOCK if xp is np else max(n, 1)


def _blocks(n: int, xp: Any) -> Iterator[tuple[int, int]]:
    """The (start, stop) of each block of ``n`` elements."""
    step = _step(n, xp)
    for i in range(0, n, step):
        yield i, min(i + step, n)


def _as_int(value: Any, xp: Any) -> Any:
    """Integral float64 values with |v| < 2^51, in place, as the int64 view of their buffer.

    NumPy's cast from float to int64 costs several additions of the same array (it is not
    vectorized); two vectorized additions do it exactly here (v + 1.5 2^52 is exact, and its
    low 52 bits are v's two's complement)."""
    xp.add(value, _MAGIC, out=value)
    word = value.view(np.int64)
    xp.subtract(word, _MAGIC_BITS, out=word)
    return word


def _as_float(word: Any, xp: Any) -> Any:
    """int64 values with |w| < 2^51, in place, as the float64 view of their buffer (exact)."""
    xp.add(word, _MAGIC_BITS, out=word)
    value = word.view(np.float64)
    xp.subtract(value, _MAGIC, out=value)
    return value


def codes(fmt: Format, x: Any, xp: Any, out: Any, block: Any, into: Any = None) -> Any:
    """The per-element integer the ranks agree on with MAX, into ``out``: the biased exponent,
    except that subnormals and zeros count as exponent 1 (the same grid) and -0 as 0, so a
    MAX of 0 means every contribution was -0. With ``into`` (codes from other ranks), ``out`` <-
    the larger of the two: a step of the MAX all-reduce that converts this rank's contribution
    as it reduces it. ``block(name, dtype)``: reused temporaries of BLOCK elements (see `encode`)."""
    if xp is np and kernels.codes(x, into, out):
        return out  # the compiled kernel did it, bitwise as below
    if into is not None:
        mine = block("exact-mine", fmt.code)
        for i, j in _blocks(x.size, xp):
            xp.maximum(into[i:j], codes(fmt, x[i:j], xp, mine[: j - i], block), out=out[i:j])
        return out
    bits, code = x.view(fmt.uint), out
    wide, flag = block("exact-bits", fmt.uint), block("exact-flag", np.dtype(np.uint8))
    signed_zero = 1 << (fmt.uint.itemsize * 8 - 1)
    for i, j in _blocks(x.size, xp):
        part, mark = code[i:j], flag[: j - i]  # mark: a bool array's bytes, added as 0 and 1
        xp.copyto(part, xp.right_shift(bits[i:j], fmt.mantissa, out=wide[: j - i]), casting="unsafe")
        if fmt.exponent_mask != 0xFF:  # float16 and float64: the sign bit is still in the code's range
            xp.bitwise_and(part, fmt.exponent_mask, out=part)
        if part.min() == 0:  # zeros and subnormals (gradients have many): 1, and -0: 0
            xp.equal(part, 0, out=mark.view(np.bool_))
            xp.add(part, mark, out=part)
            xp.equal(bits[i:j], signed_zero, out=mark.view(np.bool_))
            xp.subtract(part, mark, out=part)
    return code


def _shifts(fmt: Format, code: Any, offset: int, xp: Any, shift: Any, back: bool = False) -> Any:
    """Per element, ``offset - top`` as int32 into ``shift`` (``back``: ``top - offset``), where
    2^top bounds every contribution (|x| < 2^top): the ldexp exponent to the grid (offset = P),
    or back. A code of 0 (every contribution -0) would take the grid of code 1; here it takes
    the next one up, which changes nothing: -0 is 0 on any grid."""
    xp.copyto(shift, code, casting="unsafe")
    base = offset + fmt.bias - 1
    if back:
        xp.subtract(shift, base, out=shift)
    else:
        xp.subtract(base, shift, out=shift)
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
    fmt: Format,
    x: Any,
    code: Any,
    out: Any,
    xp: Any,
    block: Any,
    into: Any = None,
    floats: bool = False,
) -> None:
    """out <- the fixed point of ``x`` on the grid that the agreed ``code`` sets, plus the words
    ``into`` where given (``out`` itself: an accumulation; other words: a reduction step that
    converts this rank's contribution as it adds it). Words are ``fmt.words`` 8-byte words per
    element, side by side: an (x.size, fmt.words) int64 array; int64 sums wrap, which stays exact
    as long as the final sums fit. ``floats``: the words are float64 holding the integers (see
    `run`), summed as float64.

    ldexp scales by a power of two exactly wherever the result reaches 1 (below that the
    truncation gives 0 anyway); trunc truncates toward zero, and `_as_int` makes the integral
    float an int64. Done BLOCK elements at a time with ``block(name, dtype)``'s reused
    temporaries of BLOCK elements: NumPy cannot fuse passes, but a pass over a block in cache
    costs a fraction of one over memory (at 16 MiB, whole-array passes measured 3x slower than
    these), and fresh pages for a temporary cost more still. By measurement ldexp with an
    exponent per element beats looking the scale up in a table (NumPy's take: 24 ms for 4 Mi
    elements, ldexp 4 ms) and building it from bits (6 ms). The compiled kernel, where it
    runs, gives the same words in one pass.
    """
    if xp is np and kernels.encode(x, code, into, out, floats):
        return
    special = _special(fmt, code)
    if into is not None and into is not out:
        out[...] = into
    first = into is None
    words = out.T  # one row per word: rows[k][i] is element i's word k
    shift_block = block("exact-shift", np.dtype(np.int32))
    spare = block("exact-words", np.dtype(np.float64), fmt.words)
    n = x.size
    # Inf and NaN are counted in bit fields of the top word instead (this part's finite values
    # there are below the grid: 0); the words the other parts left there, kept.
    kept = None if first or special is None else words[:, special]
    with np.errstate(invalid="ignore", over="ignore"):
        for i, j in _blocks(n, xp):
            part, m = x[i:j], j - i
            target = spare[:, :m]
            if fmt.words == 1:  # float16, bfloat16, float32: widened to float64 exactly; P = 42
                shift = _shifts(fmt, code[i:j], ONE_WORD, xp, shift_block[:m])
                value = target[0]
                xp.copyto(value, part, casting="unsafe")
                xp.ldexp(value, shift, out=value)  # |value| < 2^42
                xp.trunc(value, out=value)
                if not floats:
                    _as_int(value, xp)
            else:
                # float64: T = trunc(x 2^(85 - top)) as hi 2^43 + lo, hi = trunc(T / 2^43) (the
                # upper 42 bits, signed), lo = T - hi 2^43 (|lo| < 2^43, T's sign). From
                # w = x 2^(42 - top): hi is trunc(w), lo is trunc((w - hi) 2^43), every step
                # exact. Any split with hi 2^43 + lo = T sums to the same integer, so `decode`
                # rounds the same bits.
                shift = _shifts(fmt, code[i:j], TWO_WORDS - TWO_WORDS_LOW, xp, shift_block[:m])
                hi, lo = target[0], target[1]
                xp.ldexp(part, shift, out=lo)  # |w| < 2^42
                xp.trunc(lo, out=hi)
                xp.subtract(lo, hi, out=lo)
                xp.multiply(lo, 2.0**TWO_WORDS_LOW, out=lo)
                xp.trunc(lo, out=lo)
                if not floats:
                    _as_int(hi, xp)
                    _as_int(lo, xp)
            dest = words[:, i:j]
            if floats:
                if first:
                    xp.copyto(dest.view(np.float64), target)
                else:
                    xp.add(dest.view(np.float64), target, out=dest.view(np.float64))
            elif first:
                xp.copyto(dest, target.view(np.int64))
            else:
                xp.add(dest, target.view(np.int64), out=dest)
    if special is not None:
        counts = _special_words(x[special].astype(np.float64), xp)
        top = xp.zeros((fmt.words, counts.size), np.int64)
        if floats:
            total = counts.astype(np.float64)  # < 2^53: exact
            if kept is not None:
                total += kept[0].view(np.float64)
            top[0] = total.view(np.int64)
        else:
            top[0] = counts if kept is None else kept[0] + counts
        words[:, special] = top


def decode(
    fmt: Format,
    words: Any,
    code: Any,
    out: Any,
    divisor: int,
    xp: Any,
    block: Any,
    terms: int | None = None,
    floats: bool = False,
    mine: Any = None,
) -> None:
    """out <- the summed ``words`` (plus the fixed point of ``mine``, where given: a reduction's
    last step, that adds this rank's contribution as it rounds) rounded once to out's dtype
    (divided by ``divisor`` for a mean first, in float64); the same bits wherever the same words
    arrive. ``words`` (as `encode` lays them out) is overwritten; ``block`` as in `encode`;
    ``terms``: how many contributions were summed, where known (None: up to
    MAX_CONTRIBUTIONS); ``floats``: the words hold float64 integers (`run`). The compiled
    kernel, where it runs, gives the same bits in one pass (and leaves the words as they were)."""
    if xp is np and kernels.decode(words, mine, code, out, divisor, terms, floats):
        return
    if mine is not None:
        encode(fmt, mine, code, words, xp, block, into=words, floats=floats)
    special = _special(fmt, code)
    rows = words.T  # one row per word
    counts = None if special is None else rows[0, special]  # a copy: the loop below turns the words
    if floats and counts is not None:
        counts = counts.view(np.float64).astype(np.int64)
    n = out.size
    if floats:
        _decode_blocks(fmt, rows.view(np.float64), code, out, divisor, xp, block, None)
    elif fmt.words == 1:
        big = terms is None or terms << ONE_WORD >= 1 << 53  # |total| < terms x 2^42
        if big and n and n_big(rows[0], xp):
            _decode_big(fmt, rows, code, out, divisor, xp, block)
        else:
            # Every |total| < 2^53: exact in float64, the scaling too, and the cast into ``out``
            # is the one rounding.
            small = terms is not None and terms << ONE_WORD <= 1 << 51
            _decode_blocks(fmt, rows, code, out, divisor, xp, block, small)
    elif terms is None or terms > 1 << 10:  # |hi| may pass 2^53: carries first
        _decode_big(fmt, rows, code, out, divisor, xp, block)
    else:
        # |hi| < 2^52 and |lo| < 2^53: both exact in float64, so hi 2^43 + lo is the one
        # rounding of the exact integer (the lo words need no carry first).
        _decode_blocks(fmt, rows, code, out, divisor, xp, block, terms << (TWO_WORDS_LOW + 1) <= 1 << 51)
    if special is not None:
        pos, neg = counts & (_NEG_INF - 1), (counts >> 21) & (_NEG_INF - 1)
        nan = ((counts >> 42) > 0) | ((pos > 0) & (neg > 0))
        inf = xp.where(pos > 0, np.inf, -np.inf)
        out[special] = xp.where(nan, np.nan, inf).astype(fmt.dtype)
    if code.size and code.min() == 0:
        out[code == 0] = -0.0


def _decode_blocks(
    fmt: Format, words: Any, code: Any, out: Any, divisor: int, xp: Any, block: Any, small: bool | None
) -> None:
    """`decode` where every word is below 2^53 (``small``: below 2^51, for `_as_float`; None:
    the words are float64 already), BLOCK elements at a time: to float64 (hi 2^43 + lo for
    float64, one rounding), back to the element's scale (exact: a result below float64's
    normal range is a multiple of the smallest subnormal, so it fits), the mean's division,
    the cast to the dtype."""
    shift_block = block("exact-shift", np.dtype(np.int32))
    wide = block("exact-words", np.dtype(np.float64), fmt.words)
    with np.errstate(invalid="ignore", over="ignore"):
        for i, j in _blocks(out.size, xp):
            shift = _shifts(fmt, code[i:j], fmt.precision, xp, shift_block[: j - i], back=True)
            if small is None:
                value = words[:, i:j]
            elif small:
                value = [_as_float(word, xp) for word in words[:, i:j]]
            else:
                value = wide[:, : j - i]
                xp.copyto(value, words[:, i:j], casting="unsafe")
            value = value[0] if len(value) == 1 else _join(value[0], value[1], xp)
            if fmt.dtype == np.float64 and divisor == 1:
                xp.ldexp(value, shift, out=out[i:j])
                continue
            xp.ldexp(value, shift, out=value)
            if divisor != 1:
                value /= divisor
            xp.copyto(out[i:j], value, casting="unsafe")


def _join(high: Any, low: Any, xp: Any) -> Any:
    """high 2^43 + low, in high: one rounding where both are exact."""
    xp.multiply(high, 2.0**TWO_WORDS_LOW, out=high)
    return xp.add(high, low, out=high)


def _decode_big(fmt: Format, words: Any, code: Any, out: Any, divisor: int, xp: Any, block: Any) -> None:
    """`decode` where some sum may have more bits than float64 holds (an `ExactSum`'s, or one of
    over 2^10 ranks), over the whole array at once (rare: an `ExactSum`'s typical sums are small)."""
    n = out.size
    value = xp.empty(n, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if fmt.words == 1:
            total = words[0]
            xp.copyto(value, total, casting="unsafe")
            # |total| < 2^62 has more bits than float64 holds: round to odd on a grid 2^10
            # first (its last bit set where bits were dropped), which then rounds to the
            # dtype's 24 or fewer bits exactly as the integer itself would (round-to-odd
            # with >= 2 spare bits); only where |total| >= 2^53, else the cast is exact.
            big = xp.abs(total) >= (1 << 53)
            odd = (total[big] >> 10) | ((total[big] & 1023) != 0)
            value[big] = odd.astype(np.float64) * 1024.0
        else:
            hi, lo = words[0], words[1]
            carry = xp.right_shift(lo, TWO_WORDS_LOW)
            hi += carry
            xp.left_shift(carry, TWO_WORDS_LOW, out=carry)
            lo -= carry  # now 0 <= lo < 2^43
            # hi * 2^43 + lo exactly as a float64 sum of two exact terms: one rounding.
            xp.copyto(value, hi, casting="unsafe")
            rest = carry  # |hi| may pass 2^53: keep what the cast lost
            xp.copyto(rest, value, casting="unsafe")
            xp.subtract(hi, rest, out=rest)
            xp.left_shift(rest, TWO_WORDS_LOW, out=rest)
            rest += lo
            value *= 2.0**TWO_WORDS_LOW
            xp.add(value, rest, out=value, casting="unsafe")  # rest < 2^53: exact in float64
        shift = xp.empty(n, np.int32)
        _shifts(fmt, code, fmt.precision, xp, shift, back=True)
        xp.ldexp(value, shift, out=value)
        if divisor != 1:
            value /= divisor
        xp.copyto(out, value, casting="unsafe")


def n_big(total: Any, xp: Any) -> bool:
    """Whether some |total| needs more than float64's 53 bits (two reductions, no temporaries)."""
    return bool(total.max() >= (1 << 53)) or bool(total.min() <= -(1 << 53))


def run(
    ch: Any,
    reduce: Callable[[Any, str], None],
    parts: list[Any],
    dst: Any,
    op: str,
    accumulated: bool = False,
) -> None:
    """dst <- the reproducible sum (op "sum") or mean over every rank of the flat arrays ``parts``
    (this rank's contributions: one for `hpcring.allreduce`, any number for an `ExactSum`,
    ``accumulated``: every rank says the same, whatever its own count).

    ``reduce(buf, op)`` all-reduces ``buf`` in place over the ranks of ``ch`` ("max", then "sum":
    the call's algorithm, which the engine gives; `auto` chooses for the sizes that travel);
    with one rank there is nothing to exchange, and the same conversion runs, so the bits are
    those of any rank count.
    """
    xp, fmt, n = ch.xp, format_of(dst.dtype), dst.size
    # Reused across calls, like an algorithm's scratch: fresh pages cost more than the sum.
    code = ch.scratch("exact-code", n, fmt.code)
    words = ch.scratch("exact-words", fmt.words * n, np.dtype(np.int64)).reshape(n, fmt.words)
    block = _blocker(ch, n)

    if parts:
        codes(fmt, parts[0], xp, code, block)
    else:
        code.fill(0)  # no contribution here: the MAX's identity
    if len(parts) > 1:
        other = ch.scratch("exact-code-part", n, fmt.code)
        for part in parts[1:]:
            xp.maximum(code, codes(fmt, part, xp, other, block), out=code)
    if ch.size > 1 and n > 0:
        reduce(code, "max")
    if not parts:
        words.fill(0)
    # One contribution per rank on at most 2^10 ranks: every partial sum of the words is an
    # integer below 2^53 (|word| < 2^43), so float64 sums them exactly, in any order, and the
    # words travel as float64: the same 8 bytes, the same sums, and no conversion to int64 and
    # back (4 of the conversion's 17 NumPy passes in float32, 6 of 18 in float64). An
    # `ExactSum` (up to 2^20 contributions) sums int64.
    floats = not accumulated and ch.size <= 1 << 10
    for index, part in enumerate(parts):
        encode(fmt, part, code, words, xp, block, into=None if index == 0 else words, floats=floats)
    if ch.size > 1 and n > 0:
        flat = words.reshape(-1)
        if floats:
            flat = flat.view(np.float64)
        reduce(flat, "sum")
    terms = None if accumulated else ch.size  # an ExactSum's other ranks may hold more
    decode(fmt, words, code, dst, ch.size if op == "mean" else 1, xp, block, terms, floats)


def _blocker(ch: Any, n: int) -> Callable[..., Any]:
    """``block(name, dtype, rows=None)``: the conversions' reused temporaries of BLOCK elements
    (``rows`` of them), the channel's scratch."""
    xp = ch.xp

    def block(name: str, dtype: np.dtype, rows: int | None = None) -> Any:
        wide = ch.scratch("block-" + name, (rows or 1) * min(n, _step(n, xp)), dtype)
        return wide if rows is None else wide.reshape(rows, -1)

    return block


# ---- the reproducible sum inside the algorithm's own steps -------------------------------------
#
# `run` converts the whole array, all-reduces the words, and rounds the whole array: three passes
# over memory beside the algorithm's, and every word travels twice (reduce-scatter and all-gather).
# Where the algorithm comes in two phases (`hpcring.algorithms.base.Split`: the ring,
# Rabenseifner), `fused` runs the conversions inside its steps instead:
#
# 1. the agreed codes: the reduce-scatter with MAX of this rank's codes, each computed as its
#    segment is sent or reduced (`Agree`), then the all-gather of the codes;
# 2. the words: the reduce-scatter of this rank's fixed point, each piece converted as it is sent
#    or added to the words received (`Sum`); the owner of a segment rounds it as its last words
#    arrive (the ring) or right after (Rabenseifner), and the all-gather passes on the rounded
#    results, in the dtype: half (float64: a quarter) of the words' bytes.
#
# The words and their sums are `run`'s, so the bits are too: the same integer sums, rounded once.


def word_dtype(fmt: Format) -> np.dtype:
    """An element's words as one item (8 or 16 opaque bytes): what travels in the reduce-scatter."""
    return np.dtype(f"V{8 * fmt.words}")


def _index(piece: Any, whole: Any) -> int:
    """Where ``piece`` starts in ``whole`` (elements of whole's dtype): both arrays, or both `Sym`s
    of one recording (their made-up addresses differ as their offsets do)."""
    start = piece.__array_interface__["data"][0] - whole.__array_interface__["data"][0]
    return int(start) // whole.dtype.itemsize


def _words(array: Any, floats: bool) -> Any:
    """An array of words (`word_dtype`) as the numbers they are: float64 or int64, flat."""
    return array.reshape(-1).view(np.float64 if floats else np.int64)


class Agree:
    """The op of the codes' reduce-scatter (MAX): a piece of this rank's contribution ``x`` is
    turned into its codes where it is sent (`convert`) or reduced (`combine`); codes from the
    other ranks are taken as they come."""

    def __init__(self, fmt: Format, x: Any, block: Any) -> None:
        self.fmt, self.x, self.block = fmt, x, block

    def converts(self, piece: Any) -> bool:
        return piece.dtype == self.fmt.dtype

    def wire(self, piece: Any) -> tuple[int, np.dtype]:
        return piece.size, self.fmt.code

    def convert(self, xp: Any, piece: Any, into: Any) -> None:
        _codes(self.fmt, piece, xp, into, self.block)

    def combine(self, xp: Any, left: Any, right: Any, out: Any) -> None:
        if self.converts(left):
            left, right = right, left
        if self.converts(right):
            _codes(self.fmt, right, xp, out, self.block, into=left)
        else:
            xp.maximum(left, right, out=out)


class Sum:
    """The op of the words' reduce-scatter: a piece of this rank's contribution ``x`` (None: an
    `ExactSum`'s words are the contribution) is converted to words on the agreed grid where it is
    sent (`convert`) or added to the words received (`combine`). With ``finish`` (a `Split` whose
    reduce-scatter combines each owned element once), the combination of an owned element rounds
    it into ``dst`` at once instead of storing its words."""

    def __init__(
        self,
        fmt: Format,
        x: Any,
        code: Any,
        words: Any,
        dst: Any,
        block: Any,
        floats: bool,
        divisor: int,
        terms: int | None,
        finish: slice | None,
    ) -> None:
        self.fmt, self.x, self.code, self.words, self.dst = fmt, x, code, words, dst
        self.block, self.floats, self.divisor, self.terms, self.finish = block, floats, divisor, terms, finish

    def converts(self, piece: Any) -> bool:
        return piece.dtype == self.fmt.dtype

    def wire(self, piece: Any) -> tuple[int, np.dtype]:
        return piece.size, word_dtype(self.fmt)

    def convert(self, xp: Any, piece: Any, into: Any) -> None:
        start = _index(piece, self.x)
        code = self.code[start : start + piece.size]
        _encode(self.fmt, piece, code, None, into, xp, self.block, self.floats)

    def combine(self, xp: Any, left: Any, right: Any, out: Any) -> None:
        mine, theirs = (left, right) if self.converts(left) else (right, left)
        if not self.converts(mine):
            mine = None  # words and words (Rabenseifner's later steps, an ExactSum's)
        start = _index(out, self.words)
        stop = start + out.size
        code = self.code[start:stop]
        if self.finish is not None and self.finish.start <= start and stop <= self.finish.stop:
            if mine is None:
                _add_words(xp, left, right, out, self.floats)
                theirs = out
            self.round(xp, theirs, mine, start, stop)
        elif mine is None:
            _add_words(xp, left, right, out, self.floats)
        else:
            _encode(self.fmt, mine, code, theirs, out, xp, self.block, self.floats)

    def round(self, xp: Any, words: Any, mine: Any, start: int, stop: int) -> None:
        """dst[start:stop] <- the words (plus ``mine``'s fixed point) rounded once."""
        code, out = self.code[start:stop], self.dst[start:stop]
        _decode(self.fmt, words, mine, code, out, self.divisor, xp, self.block, self.terms, self.floats)


def _converting(ch: Any, op: Any) -> Any:
    """``ch`` sending this rank's contribution as ``op`` converts it: a `Converting` twin, or, where
    ``ch`` is a recording (`hpcring.program.Tape`), its own twin that writes the rows."""
    twin = getattr(ch, "converting", None)
    return twin(op) if twin is not None else Converting(ch, op)


class Converting(Channel):
    """The twin of a channel (the same communicator, scratch, schedules, byte counter and flight
    step) whose sends of a piece of this rank's contribution go as ``op`` converts it (its codes,
    its words): into a buffer of the channel's scratch (``exact-out-K``, one per send in flight),
    kept until the send completes, as `hpcring.wire.WireChannel` narrows into its pool.
    Everything else, receives included, is the channel's own."""

    def __init__(self, base: Channel, op: Any) -> None:
        self.__dict__.update(base.__dict__)
        self.base, self.op = base, op
        self._taken: set[int] = set()  # the K of the buffers in flight
        self._pending: dict[int, int] = {}  # id(request) -> its buffer's K

    @property  # type: ignore[override]
    def step(self) -> int:
        return self.base.step

    @step.setter
    def step(self, value: int) -> None:
        self.base.step = value

    def _out(self, piece: Any) -> tuple[Any, int]:
        """What goes on the wire for ``piece`` (itself, or its conversion) and its buffer's K (-1)."""
        if not self.op.converts(piece):
            return piece, -1
        count, dtype = self.op.wire(piece)
        k = next(k for k in range(len(self._taken) + 1) if k not in self._taken)
        self._taken.add(k)
        buf = self.scratch(f"exact-out-{k}", count, np.dtype(dtype))
        self.op.convert(self.xp, piece, buf)
        return buf, k

    def sendrecv(self, send: Any, dest: int, recv: Any, source: int) -> None:
        out, k = self._out(send)
        super().sendrecv(out, dest, recv, source)
        self._taken.discard(k)

    def send(self, send: Any, dest: int) -> None:
        out, k = self._out(send)
        super().send(out, dest)
        self._taken.discard(k)

    def isend(self, send: Any, dest: int, tag: int = 0) -> Any:
        out, k = self._out(send)
        request = super().isend(out, dest, tag)
        if k >= 0:
            self._pending[id(request)] = k
        return request

    def _finish(self, request: Any) -> None:
        self._taken.discard(self._pending.pop(id(request), -1))

    def wait(self, request: Any, nap: float = 0.0) -> None:
        super().wait(request, nap)
        self._finish(request)

    def waitall(self, requests: Any, nap: float = 0.0) -> None:
        pending = list(requests)
        super().waitall(pending, nap)
        for request in pending:
            self._finish(request)


def _add_words(xp: Any, left: Any, right: Any, out: Any, floats: bool) -> None:
    """out <- left + right, words as the numbers they are (int64 wraps; float64 is exact here)."""
    xp.add(_words(left, floats), _words(right, floats), out=_words(out, floats))


def _recording(xp: Any) -> bool:
    """Whether ``xp`` writes a step table (`hpcring.program`) instead of computing."""
    return getattr(xp, "records", False)


def _codes(fmt: Format, x: Any, xp: Any, out: Any, block: Any, into: Any = None) -> None:
    if _recording(xp):
        xp.exact_codes(x, into, out)
    else:
        codes(fmt, x, xp, out, block, into)


def _encode(fmt: Format, x: Any, code: Any, into: Any, out: Any, xp: Any, block: Any, floats: bool) -> None:
    if _recording(xp):
        xp.exact_encode(x, code, into, out, floats)
    else:
        encode(
            fmt,
            x,
            code,
            out.reshape(-1).view(np.int64).reshape(-1, fmt.words),
            xp,
            block,
            None if into is None else into.reshape(-1).view(np.int64).reshape(-1, fmt.words),
            floats,
        )


def _decode(
    fmt: Format,
    words: Any,
    mine: Any,
    code: Any,
    out: Any,
    divisor: int,
    xp: Any,
    block: Any,
    terms: int | None,
    floats: bool,
) -> None:
    if _recording(xp):
        xp.exact_decode(words, mine, code, out, divisor, terms, floats)
    else:
        flat = words.reshape(-1).view(np.int64).reshape(-1, fmt.words)
        decode(fmt, flat, code, out, divisor, xp, block, terms, floats, mine)


def fused(
    ch: Any,
    split: Any,
    parts: list[Any],
    dst: Any,
    op: str,
    accumulated: bool = False,
) -> None:
    """dst <- the reproducible sum (op "sum") or mean over every rank of ``parts`` (as in `run`),
    inside the steps of ``split`` (the algorithm's `Split` for dst.size elements on ``ch``, more
    than one rank). One contribution (``parts[0]`` may be ``dst``: in place) is converted inside
    the steps; several (an `ExactSum`'s) are summed into words first, once the codes are agreed.
    The same bits as `run`."""
    xp, fmt, n = ch.xp, format_of(dst.dtype), dst.size
    block = _blocker(ch, n)
    divisor = ch.size if op == "mean" else 1
    if split.owners is not None and gathers(ch.size, ch.topology().nodes):
        owners = split.owners()
        if not accumulated:
            _gathered(ch, split, owners, parts, [1] * ch.size, dst, fmt, block, divisor)
            return
        # An ExactSum's ranks may hold any number of contributions: each learns every rank's count
        # (one small all-gather), and all gather where the rows fit in the words' own scratch
        counts = [int(c) for c in ch.table([len(parts)])[:, 0]]
        if _gather_fits(owners, counts, fmt, n):
            _gathered(ch, split, owners, parts, counts, dst, fmt, block, divisor)
            return
    code = ch.scratch("exact-code", n, fmt.code)
    words = ch.scratch("exact-words", n, word_dtype(fmt))
    floats = not accumulated and ch.size <= 1 << 10  # as in `run`
    terms = None if accumulated else ch.size
    x = parts[0] if len(parts) == 1 else None
    if x is None:  # several contributions (or none): their codes' maximum, then their words' sum
        mine_code = ch.scratch("exact-code-part", n, fmt.code)
        if parts:
            codes(fmt, parts[0], xp, mine_code, block)
            for part in parts[1:]:
                codes(fmt, part, xp, mine_code, block, into=mine_code)
        else:
            mine_code.fill(0)  # the MAX's identity
    # 1. the agreed codes
    agree = Agree(fmt, x, block)
    split.reduce_scatter(
        _converting(ch, agree) if x is not None else ch, x if x is not None else mine_code, code, agree
    )
    split.all_gather(ch, code)
    # 2. the words, rounded where they are complete, and the results passed on
    if x is None:
        mine = ch.scratch("exact-local", n, word_dtype(fmt))
        flat = _words(mine, floats).view(np.int64).reshape(n, fmt.words)
        for index, part in enumerate(parts):
            encode(fmt, part, code, flat, xp, block, into=None if index == 0 else flat, floats=floats)
        if not parts:
            flat.fill(0)
    owned = split.owned
    total = Sum(fmt, x, code, words, dst, block, floats, divisor, terms, owned if split.once else None)
    split.reduce_scatter(
        _converting(ch, total) if x is not None else ch, x if x is not None else mine, words, total
    )
    if not split.once and owned.stop > owned.start:
        total.round(xp, words[owned], None, owned.start, owned.stop)
    split.all_gather(ch, dst)


def gathers(size: int, nodes: int) -> bool:
    """Whether `fused` gathers each segment's contributions to its owner as they are
    (`_gathered`) instead of reducing words along the algorithm's own steps: on one node, where
    every pair of ranks is as close as any, and on up to 3 ranks, where the pairs are the ring's
    neighbours. Across nodes the algorithm's own pattern (the ring's neighbours) is kept."""
    return nodes == 1 or size <= 3


def _gathered(
    ch: Any,
    split: Any,
    owners: Sequence[tuple[int, slice]],
    parts: list[Any],
    counts: list[int],
    dst: Any,
    fmt: Format,
    block: Any,
    divisor: int,
) -> None:
    """`fused` with its reduce-scatter as a gather: each rank sends every other rank that rank's
    ``owned`` part of each of its contributions as it is (a pairwise exchange: for one
    contribution per rank the plain reduce-scatter's bytes, not the 8-byte words of partial
    sums, and no agreement of codes beforehand), then the owner sums the contributions it holds
    (`gathered_sum`), and the all-gather passes the rounded results on. ``owners``: the split's
    (`Split.owners`); ``counts``: every rank's number of contributions (an `ExactSum`'s; else one
    each), at least two in all. The codes, words and rounding are `run`'s, so the bits are too."""
    xp, size, total = ch.xp, ch.size, sum(counts)
    position = next(p for p, (rank, _) in enumerate(owners) if rank == ch.rank)
    mine = owners[position][1]
    m = mine.stop - mine.start
    # the rows of every contribution to this rank's part but the one it passes as its own: its
    # other contributions first, then each sender's in turn
    rows = ch.scratch("exact-rows", (total - min(len(parts), 1)) * m, dst.dtype)
    at = 0
    for part in parts[1:]:
        rows[at : at + m] = part[mine]
        at += m
    for k in range(1, size):
        to, theirs = owners[(position + k) % size]
        source = owners[(position - k) % size][0]
        got = counts[source] * m
        ch.step += 1
        ch.sendrecv(_packed(ch, parts, theirs, dst), to, rows[at : at + got], source)
        at += got
    if m:
        own, others = (parts[0][mine], rows) if parts else (rows[:m], rows[m:])
        floats = total <= 1 << 10  # as in `run`
        gathered_sum(fmt, own, others, m, total - 1, dst[mine], divisor, xp, block, floats)
    split.all_gather(ch, dst)


def _packed(ch: Any, parts: list[Any], piece: slice, like: Any) -> Any:
    """This rank's contributions' ``piece`` one after another, as one message (the piece itself
    where there is one contribution; nothing where there is none)."""
    if len(parts) == 1:
        return parts[0][piece]
    length = piece.stop - piece.start
    pack = ch.scratch("exact-pack", len(parts) * length, like.dtype)
    for index, part in enumerate(parts):
        pack[index * length : (index + 1) * length] = part[piece]
    return pack


def _gather_fits(owners: Sequence[tuple[int, slice]], counts: list[int], fmt: Format, count: int) -> bool:
    """Whether an ExactSum's contributions are gathered: at least two in all, and every rank's rows
    and pack within the integer words that reducing along the steps holds (`words_held`: what
    the memory guard priced). The same answer
    on every rank: it depends only on what all of them know."""
    total = sum(counts)
    if not 2 <= total <= MAX_CONTRIBUTIONS:
        return False
    longest = max(part.stop - part.start for _, part in owners)
    words = words_held(fmt, count, accumulated=True)
    for rank, part in owners:
        rows = (total - min(counts[rank], 1)) * (part.stop - part.start)
        pack = counts[rank] * longest if counts[rank] > 1 else 0
        if (rows + pack) * fmt.dtype.itemsize > words:
            return False
    return True


def gathered_sum(
    fmt: Format,
    own: Any,
    rows: Any,
    stride: int,
    others: int,
    out: Any,
    divisor: int,
    xp: Any,
    block: Any,
    floats: bool,
) -> None:
    """out <- the reproducible sum (a mean: divided by ``divisor``) of ``own`` and ``others`` rows of
    ``rows`` (row k from k x ``stride`` elements on): the codes' maximum over them, their words'
    sum, rounded once, a block at a time so that the words stay in cache. The compiled kernel, one
    pass where it applies (float words), gives the same bits; recorded, it is one row of the
    table."""
    n = own.size
    if floats and others < 1 << 10:
        if _recording(xp):
            xp.exact_gather(own, rows, stride, others, out, divisor)
            return
        if xp is np and kernels.gather(own, rows, stride, others, out, divisor):
            return
    code, words = block("gather-code", fmt.code), block("gather-words", word_dtype(fmt))
    step = _step(n, xp)
    for start in range(0, n, step):
        stop = min(start + step, n)
        c, w = code[: stop - start], words[: stop - start]
        them = [rows[k * stride + start : k * stride + stop] for k in range(others)]
        mine = own[start:stop]
        _codes(fmt, mine, xp, c, block)
        for row in them:
            _codes(fmt, row, xp, c, block, into=c)
        for k, row in enumerate(them):
            _encode(fmt, row, c, None if k == 0 else w, w, xp, block, floats)
        _decode(fmt, w, mine, c, out[start:stop], divisor, xp, block, others + 1, floats)


def bytes_sent(
    sent: Callable[[int, int], int | None],
    count: int,
    dtype: np.dtype,
    phases: tuple[int, int] | None = None,
    gathered: bool = False,
) -> int | None:
    """Bytes this rank hands to MPI for one reproducible call, from the algorithm's formula
    ``sent(count, itemsize)``: the agreed integers plus the words (None where not visible). Where
    it runs inside the algorithm's two phases (`fused`), ``phases`` are the elements this rank
    sends in each (`hpcring.algorithms.base.Spec.split_sent`): the words in the reduce-scatter,
    the rounded results in the all-gather; ``gathered`` (`gathers`): the contribution itself in
    the reduce-scatter, the plain algorithm's bytes."""
    fmt = format_of(dtype)
    if phases is not None and gathered:
        return (phases[0] + phases[1]) * dtype.itemsize
    codes = sent(count, fmt.code.itemsize)
    if phases is not None:
        return None if codes is None else codes + phases[0] * 8 * fmt.words + phases[1] * dtype.itemsize
    words = sent(fmt.words * count, 8)
    return None if codes is None or words is None else codes + words


WORD_BYTES = {2: 9, 4: 9, 8: 18}  # by the float's itemsize: the int64 words and the agreed code per element


def scratch_bytes(
    ch: Any, dtype: np.dtype, count: int, scratch: Callable[[int, int], int], accumulated: bool = False
) -> int:
    """Scratch one reproducible call holds on ``ch`` (what `run` takes from ``ch.scratch``): the
    agreed codes and the integer words for ``count`` elements (an `ExactSum`'s, ``accumulated``,
    one more code array), the conversion's blocks, and the algorithm's own scratch for the larger
    of its two all-reduces (``scratch(count, itemsize)``: the algorithm's formula). The memory
    guard prices this before anything is allocated."""
    fmt = format_of(dtype)
    code = count * fmt.code.itemsize
    fused = ch.size > 1 and count > 0
    held = code * (2 if accumulated else 1) + words_held(fmt, count, accumulated, fused)
    held += min(count, _step(count, ch.xp)) * (
        fmt.uint.itemsize + 1 + fmt.code.itemsize + 4 + 8 * fmt.words
    )  # bits, flag, codes, shift, words
    if not fused:
        return held
    return held + max(scratch(fmt.words * count, 8), scratch(count, fmt.code.itemsize))


def words_held(fmt: Format, count: int, accumulated: bool, fused: bool = True) -> int:
    """The bytes of integer words a reproducible call of ``count`` elements holds: the words, and
    across ranks (`fused`) the converted pieces in flight (at most the whole contribution: a
    folded rank's) and an ExactSum's own words. Part of `scratch_bytes`; `_gather_fits` keeps
    the gathered rows within it."""
    copies = 1 + ((2 if accumulated else 1) if fused else 0)
    return copies * fmt.words * count * 8
