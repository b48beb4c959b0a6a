/* The reproducible sum's conversions (hpcring/exact.py), one pass each way, bitwise the NumPy
 * reference: `codes` (the per-element exponent the ranks agree on), `encode` (floats to fixed-point
 * words on the agreed grid) and `decode` (the summed words rounded once to the dtype). exact.py's
 * docstrings say why each step is what it is; the comments here say where C differs in form.
 *
 * Form: the loops hold no branches, so they vectorize; elements whose agreed code is Inf/NaN's
 * (rare) get a zero word in the main loop and their counts in a second pass over those alone.
 */
#ifndef HPCRING_EXACT_H
#define HPCRING_EXACT_H

#include "reduce.h"

#define HR_HEADROOM 20
#define HR_ONE_WORD (62 - HR_HEADROOM)                /* 42 */
#define HR_TWO_WORDS_LOW (63 - HR_HEADROOM)           /* 43 */
#define HR_TWO_WORDS (HR_TWO_WORDS_LOW + HR_ONE_WORD) /* 85 */
#define HR_NAN_COUNT ((int64_t)1 << 42)
#define HR_NEG_INF_COUNT ((int64_t)1 << 21)
#define HR_MAGIC 0x1.8p52 /* 1.5 x 2^52 */

typedef struct {
    int mantissa, bias, exponent_mask, words;
} hr_format;

static inline int hr_format_of(int dtype, hr_format *f) {
    switch (dtype) {
    case HR_F16: *f = (hr_format){10, 15, 0x1f, 1}; return 0;
    case HR_BF16: *f = (hr_format){7, 127, 0xff, 1}; return 0;
    case HR_F32: *f = (hr_format){23, 127, 0xff, 1}; return 0;
    case HR_F64: *f = (hr_format){52, 1023, 0x7ff, 2}; return 0;
    default: return -1;
    }
}

/* exact.py's _as_int and _as_float, literally (for |v| < 2^51 they are the exact casts). */
static inline int64_t hr_as_int(double v) { return (int64_t)(hr_bits64(v + HR_MAGIC) - hr_bits64(HR_MAGIC)); }
static inline double hr_as_float(int64_t w) { return hr_float64((uint64_t)w + hr_bits64(HR_MAGIC)) - HR_MAGIC; }

/* Inf and NaN among the contributions, counted in bit fields (exact.py's _special_words). */
static inline int64_t hr_special_count(double v) {
    return (isnan(v) ? HR_NAN_COUNT : 0) + (v == -INFINITY ? HR_NEG_INF_COUNT : 0) + (v == INFINITY ? 1 : 0);
}

/* Loops over each float format: T its bits, VALUE(bits) its float64 (exact), CODE the code's type. */
#define HR_FORMATS(X)                                                                             \
    X(HR_F16, uint16_t, uint8_t, hr_half_to_double)                                              \
    X(HR_BF16, uint16_t, uint8_t, hr_bf16_to_double)                                             \
    X(HR_F32, uint32_t, uint8_t, hr_f32_value)                                                   \
    X(HR_F64, uint64_t, uint16_t, hr_float64)

static inline double hr_f32_value(uint32_t u) { return (double)hr_float32(u); }

/* c ? x : y in the element's own width (narrow lanes vectorize wider). */
#define HR_SEL_OF(T, c, x, y) (sizeof(T) == 8 ? (T)hr_sel64((c), (x), (y)) : (T)hr_sel32((c), (uint32_t)(x), (uint32_t)(y)))

/* codes: the biased exponent; zeros and subnormals 1, and -0 0. ``out``: uint8 (uint16 for float64).
 * With ``in`` (codes of the same type), out <- max(in, codes(x)): the MAX all-reduce's step with the
 * codes of this rank's contribution computed as they are reduced. */
HR_CLONES static void hr_codes(int dtype, const hr_format *f, const void *x, const void *in, void *out, size_t n) {
    int shift = f->mantissa;
    uint64_t mask = (uint64_t)f->exponent_mask;
#define HR_CODES(D, T, C, VALUE)                                                                  \
    if (dtype == D) {                                                                             \
        const T *s = x;                                                                           \
        const C *c = in;                                                                          \
        C *o = out;                                                                               \
        const T negative_zero = (T)((T)1 << (sizeof(T) * 8 - 1));                                 \
        if (c == NULL) {                                                                          \
            for (size_t i = 0; i < n; i++) {                                                      \
                T u = s[i];                                                                       \
                T e = (T)((u >> shift) & mask);                                                   \
                o[i] = (C)HR_SEL_OF(T, e == 0, u != negative_zero, e);                            \
            }                                                                                     \
        } else {                                                                                  \
            for (size_t i = 0; i < n; i++) {                                                      \
                T u = s[i];                                                                       \
                T e = (T)((u >> shift) & mask);                                                   \
                C mine = (C)HR_SEL_OF(T, e == 0, u != negative_zero, e);                          \
                C theirs = c[i];                                                                  \
                o[i] = mine > theirs ? mine : theirs;                                             \
            }                                                                                     \
        }                                                                                         \
        return;                                                                                   \
    }
    HR_FORMATS(HR_CODES)
#undef HR_CODES
}

/* The words: ``f->words`` 8-byte words per element, side by side (element i's at 2i and 2i + 1 for
 * float64). ``floats``: each word is a float64 holding an integer below 2^53 (sums of at most 2^10
 * contributions: float64 adds them exactly, in any order); else an int64 (two's complement, wrapping
 * adds: only the final sum must fit). */

/* One element's fixed point on the grid its code sets, as float64 integers (exact.py's encode):
 * one word, t = trunc(x 2^(P - top)); two (float64), T = trunc(x 2^(85 - top)) as hi 2^43 + lo from
 * w = x 2^(42 - top): hi = trunc(w), lo = trunc((w - hi) 2^43), every step exact. */
HR_INLINE void hr_fixed(double v, int64_t scale, int two, double *hi, double *lo) {
    if (!two) { /* |scale| < 256: 2^scale is a normal float64 and the product exact */
        *hi = hr_trunc(v * hr_pow2(scale));
        *lo = 0.0;
        return;
    }
    double w = hr_ldexp(v, scale);
    double h = hr_trunc(w);
    *hi = h;
    *lo = hr_trunc((w - h) * 0x1p43);
}

/* ``a + b`` on two words, and a float64 integer as a word, in the words' arithmetic. */
#define HR_ADD(floats, a, b)                                                                      \
    ((floats) ? (int64_t)hr_bits64(hr_float64((uint64_t)(a)) + hr_float64((uint64_t)(b)))          \
              : (int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define HR_WORD(floats, t) ((floats) ? (int64_t)hr_bits64(t) : hr_as_int(t))

/* One format's encode loop; ``accumulate`` and ``floats`` are constants where it is inlined, so each
 * combination is its own branch-free loop. out <- (in +) the fixed point of x. Returns whether some
 * code is Inf/NaN's (those elements' words are left for a second pass). */
#define HR_ENCODE_LOOP(D, T, C, VALUE)                                                            \
    HR_INLINE uint64_t hr_encode_##T##_##C##_##VALUE(const hr_format *f, const T *restrict s,      \
                                                     const C *restrict c, const int64_t *in, \
                                                     int64_t *out, size_t n, const int accumulate, \
                                                     const int floats) {                          \
        const uint64_t special = (uint64_t)f->exponent_mask;                                      \
        const int two = sizeof(T) == 8; /* float64: two words (a constant: one loop per format) */ \
        const int64_t base = (two ? HR_TWO_WORDS - HR_TWO_WORDS_LOW : HR_ONE_WORD) + f->bias - 1; \
        uint64_t any_special = 0;                                                                 \
        for (size_t i = 0; i < n; i++) {                                                          \
            uint64_t sp = c[i] == special;                                                        \
            any_special |= sp;                                                                    \
            double hi, lo;                                                                        \
            hr_fixed(VALUE(s[i]), base - (int64_t)c[i], two, &hi, &lo);                           \
            int64_t a = (int64_t)hr_sel64(sp, 0, (uint64_t)HR_WORD(floats, hi));                  \
            /* accumulate 2: into ``out`` itself (one pointer: a second one equal to it would */ \
            /* fail the compiler's overlap check, and the two-word loop run unvectorized) */      \
            if (two) {                                                                            \
                int64_t b = (int64_t)hr_sel64(sp, 0, (uint64_t)HR_WORD(floats, lo));              \
                out[2 * i] = accumulate == 2 ? HR_ADD(floats, out[2 * i], a)                      \
                             : accumulate ? HR_ADD(floats, in[2 * i], a) : a;                     \
                out[2 * i + 1] = accumulate == 2 ? HR_ADD(floats, out[2 * i + 1], b)              \
                                 : accumulate ? HR_ADD(floats, in[2 * i + 1], b) : b;             \
            } else {                                                                              \
                out[i] = accumulate == 2 ? HR_ADD(floats, out[i], a)                              \
                         : accumulate ? HR_ADD(floats, in[i], a) : a;                             \
            }                                                                                     \
        }                                                                                         \
        return any_special;                                                                       \
    }
HR_FORMATS(HR_ENCODE_LOOP)

/* An Inf or NaN among the contributions is counted in the top word instead (exact.py's
 * _special_words), the other words zero: where element i's code is Inf/NaN's, its words <- (in +)
 * x[i]'s count. */
#define HR_SPECIAL_WORDS(VALUE, s, c, in, out, words, accumulate, floats)                         \
    for (size_t i = 0; i < n; i++) {                                                              \
        if (c[i] != special) continue;                                                            \
        int64_t count = hr_special_count(VALUE(s[i]));                                            \
        int64_t word = HR_WORD(floats, (double)count);                                            \
        out[words * i] = accumulate ? HR_ADD(floats, in[words * i], word) : word;                 \
        if (words == 2) out[2 * i + 1] = accumulate ? in[2 * i + 1] : 0;                          \
    }

/* encode: out <- the fixed point of x on the grid ``code`` sets, plus ``in`` where given (the words
 * received: a reduction step with this rank's contribution converted as it is added). ``out`` may be
 * ``in``; both lie apart from x and code (the callers check). */
HR_CLONES static void hr_encode(int dtype, const hr_format *f, const void *x, const void *code, const int64_t *in,
                                int64_t *out, size_t n, int floats) {
#define HR_ENCODE(D, T, C, VALUE)                                                                 \
    if (dtype == D) {                                                                             \
        const T *s = x;                                                                           \
        const C *c = code;                                                                        \
        const C special = (C)f->exponent_mask;                                                    \
        const int words = f->words;                                                               \
        uint64_t any;                                                                             \
        if (in == NULL && floats) any = hr_encode_##T##_##C##_##VALUE(f, s, c, NULL, out, n, 0, 1); \
        else if (in == NULL) any = hr_encode_##T##_##C##_##VALUE(f, s, c, NULL, out, n, 0, 0);     \
        else if (in == out && floats) any = hr_encode_##T##_##C##_##VALUE(f, s, c, NULL, out, n, 2, 1); \
        else if (in == out) any = hr_encode_##T##_##C##_##VALUE(f, s, c, NULL, out, n, 2, 0);      \
        else if (floats) any = hr_encode_##T##_##C##_##VALUE(f, s, c, in, out, n, 1, 1);            \
        else any = hr_encode_##T##_##C##_##VALUE(f, s, c, in, out, n, 1, 0);                       \
        if (any) {                                                                                \
            int accumulate = in != NULL;                                                          \
            HR_SPECIAL_WORDS(VALUE, s, c, in, out, words, accumulate, floats)                     \
        }                                                                                         \
        return;                                                                                   \
    }
    HR_FORMATS(HR_ENCODE)
#undef HR_ENCODE
}

enum hr_decode_mode { HR_DECODE_FLOATS, HR_DECODE_SMALL, HR_DECODE_CAST, HR_DECODE_BIG };

/* exact.py's decode chooses its path from ``terms`` (-1: unknown) and, for one word, from the
 * words themselves; the same choice here, so that the same roundings happen on every input (every
 * path rounds the exact integer once: they differ in speed, not in bits). */
static inline int hr_decode_mode(const hr_format *f, const int64_t *words, size_t n, int64_t terms, int floats) {
    if (floats) return HR_DECODE_FLOATS;
    if (f->words == 1) {
        if ((terms < 0 || terms >= ((int64_t)1 << 11)) && n) { /* terms << 42 >= 2^53 */
            if (words == NULL) return HR_DECODE_BIG;
            const int64_t limit = (int64_t)1 << 53;
            int64_t low = 0, high = 0;
            for (size_t i = 0; i < n; i++) {
                low = words[i] < low ? words[i] : low;
                high = words[i] > high ? words[i] : high;
            }
            if (high >= limit || low <= -limit) return HR_DECODE_BIG;
        }
        return terms >= 0 && terms <= 512 ? HR_DECODE_SMALL : HR_DECODE_CAST; /* << 42 <= 2^51 */
    }
    if (terms < 0 || terms > 1024) return HR_DECODE_BIG;
    return terms <= 128 ? HR_DECODE_SMALL : HR_DECODE_CAST; /* terms << 44 <= 2^51 */
}

/* The sum one element's words hold, as float64 (before the scaling back to the element's grid). */
HR_INLINE double hr_sum_of(int mode, int two, int64_t a, int64_t b) {
    if (mode == HR_DECODE_BIG) {
        if (!two) {
            /* |a| >= 2^53: round to odd on a grid of 2^10 first, then the one rounding is exact
             * (abs(INT64_MIN) is negative in NumPy: not big there either) */
            const int64_t limit = (int64_t)1 << 53;
            int64_t odd = (a >> 10) | (int64_t)((a & 1023) != 0);
            uint64_t big = (uint64_t)(a >= limit) | (uint64_t)(a <= -limit && a != INT64_MIN);
            return hr_seld(big, (double)odd * 1024.0, (double)a);
        }
        uint64_t hi = (uint64_t)a, lo = (uint64_t)b;
        uint64_t carry = (uint64_t)((int64_t)lo >> HR_TWO_WORDS_LOW);
        hi += carry;
        lo -= carry << HR_TWO_WORDS_LOW;
        double value = (double)(int64_t)hi;
        uint64_t rest = ((hi - (uint64_t)(int64_t)value) << HR_TWO_WORDS_LOW) + lo;
        return value * 0x1p43 + (double)(int64_t)rest;
    }
    double x, y;
    if (mode == HR_DECODE_FLOATS) {
        x = hr_float64((uint64_t)a), y = hr_float64((uint64_t)b);
    } else if (mode == HR_DECODE_SMALL) {
        x = hr_as_float(a), y = hr_as_float(b);
    } else {
        x = (double)a, y = (double)b;
    }
    return two ? x * 0x1p43 + y : x;
}

/* out <- the summed words rounded once to out's dtype (divided by ``divisor`` first for a mean).
 * With ``x`` (the dtype of out), the words summed are ``words`` plus x's fixed point, never stored:
 * a reduction's last step, that rounds as it adds this rank's contribution. The words are only read
 * (exact.py overwrites them); ``mode``: hr_decode_mode's, for the summed words. */
HR_CLONES static void hr_decode(int dtype, const hr_format *f, const int64_t *words, const void *x, const void *code,
                                void *out, size_t n, int64_t divisor, int mode) {
    const uint64_t special = (uint64_t)f->exponent_mask;
    const int floats = mode == HR_DECODE_FLOATS;
    const int64_t base1 = HR_ONE_WORD + f->bias - 1, base2 = HR_TWO_WORDS + f->bias - 1;
    const int64_t scale1 = base1, scale2 = HR_TWO_WORDS - HR_TWO_WORDS_LOW + f->bias - 1;
    const double div = (double)divisor;
    uint64_t any_special = 0;
#define HR_STORE(D, v) (D == HR_F16 ? hr_double_to_half(v) : D == HR_BF16 ? hr_double_to_bf16(v) : 0)
#define HR_PUT(D, i, v)                                                                           \
    if (D == HR_F32) ((float *)o)[i] = (float)(v);                                                \
    else if (D == HR_F64) ((double *)o)[i] = (v);                                                 \
    else ((uint16_t *)o)[i] = HR_STORE(D, v);
#define HR_DECODE_LOOP(D, T, VALUE, MODE)                                                         \
    if (divisor == 1 && s == NULL) {                                                              \
        HR_DECODE_EACH(D, T, VALUE, MODE, 0, 0)                                                   \
    } else if (s == NULL) {                                                                       \
        HR_DECODE_EACH(D, T, VALUE, MODE, 1, 0)                                                   \
    } else if (divisor == 1) {                                                                    \
        HR_DECODE_EACH(D, T, VALUE, MODE, 0, 1)                                                   \
    } else {                                                                                      \
        HR_DECODE_EACH(D, T, VALUE, MODE, 1, 1)                                                   \
    }
#define HR_DECODE_EACH(D, T, VALUE, MODE, DIVIDE, MINE)                                           \
    for (size_t i = 0; i < n; i++) {                                                              \
        uint64_t sp = c[i] == special;                                                            \
        any_special |= sp;                                                                        \
        const int two = D == HR_F64; /* a constant: one loop per format */                       \
        int64_t a = w[two ? 2 * i : i], b = two ? w[2 * i + 1] : 0;                               \
        double value = 0.0;                                                                       \
        if (MINE) {                                                                               \
            double hi, lo;                                                                        \
            value = VALUE(s[i]);                                                                  \
            hr_fixed(value, (two ? scale2 : scale1) - (int64_t)c[i], two, &hi, &lo);              \
            const int fl = MODE == HR_DECODE_FLOATS;                                              \
            a = HR_ADD(fl, a, (int64_t)hr_sel64(sp, 0, (uint64_t)HR_WORD(fl, hi)));               \
            if (two) b = HR_ADD(fl, b, (int64_t)hr_sel64(sp, 0, (uint64_t)HR_WORD(fl, lo)));       \
        }                                                                                         \
        double sum = hr_sum_of(MODE, two, a, b);                                                  \
        /* one word: |code - base| < 256, so one exact multiplication scales back */              \
        double v = two ? hr_ldexp(sum, (int64_t)c[i] - base2) : sum * hr_pow2((int64_t)c[i] - base1); \
        if (DIVIDE) v /= div;                                                                     \
        v = hr_seld(c[i] == 0, -0.0, v); /* every contribution was -0 */                          \
        /* Inf/NaN's: x's own value kept for the second pass (out may be x itself) */            \
        if (MINE) v = hr_seld(sp, value, v);                                                      \
        HR_PUT(D, i, v)                                                                           \
    }
#define HR_DECODE(D, T, C, VALUE)                                                                 \
    if (dtype == D) {                                                                             \
        const C *c = code;                                                                        \
        const T *s = x;                                                                           \
        const int64_t *w = words;                                                                 \
        void *o = out;                                                                            \
        switch (mode) {                                                                           \
        case HR_DECODE_FLOATS: HR_DECODE_LOOP(D, T, VALUE, HR_DECODE_FLOATS) break;               \
        case HR_DECODE_SMALL: HR_DECODE_LOOP(D, T, VALUE, HR_DECODE_SMALL) break;                 \
        case HR_DECODE_CAST: HR_DECODE_LOOP(D, T, VALUE, HR_DECODE_CAST) break;                   \
        default: HR_DECODE_LOOP(D, T, VALUE, HR_DECODE_BIG) break;                                \
        }                                                                                         \
        if (any_special) {                                                                        \
            for (size_t i = 0; i < n; i++) {                                                      \
                if (c[i] != special) continue;                                                    \
                int64_t word = w[D == HR_F64 ? 2 * i : i];                                        \
                int64_t count = floats ? (int64_t)hr_float64((uint64_t)word) : word;              \
                if (s != NULL) count += hr_special_count(VALUE(s[i]));                            \
                int64_t pos = count & (HR_NEG_INF_COUNT - 1), neg = (count >> 21) & (HR_NEG_INF_COUNT - 1); \
                double v = ((count >> 42) > 0 || (pos > 0 && neg > 0)) ? NAN : pos > 0 ? INFINITY : -INFINITY; \
                HR_PUT(D, i, v)                                                                   \
            }                                                                                     \
        }                                                                                         \
        return;                                                                                   \
    }
    HR_FORMATS(HR_DECODE)
#undef HR_DECODE
#undef HR_DECODE_LOOP
#undef HR_DECODE_EACH
#undef HR_PUT
#undef HR_STORE
}

#define HR_GATHER_BLOCK 1024 /* elements a pass of hr_gather holds in cache */
#define HR_GATHER_MOST 1024  /* contributions at most: float words hold their sum */

/* The three kernels (codes, encode, decode) for element i of a gathered sum, whose own value
 * ``o[i]`` still holds: the elements the one-pass sum leaves (hr_gather). */
HR_INLINE void hr_gather_one(int dtype, const hr_format *f, const void *rows, size_t stride, int others, void *out,
                             size_t i, int64_t divisor) {
    const size_t size = (size_t)hr_itemsize[dtype];
    uint64_t vals[HR_GATHER_MOST]; /* the others' values, packed in the dtype */
    uint16_t code;                 /* uint8 or uint16, as hr_codes writes it */
    int64_t words[2];
    char *o = (char *)out + i * size;
    for (int r = 0; r < others; r++)
        memcpy((char *)vals + r * size, (const char *)rows + ((size_t)r * stride + i) * size, size);
    hr_codes(dtype, f, o, NULL, &code, 1);
    for (int r = 0; r < others; r++) hr_codes(dtype, f, (char *)vals + r * size, &code, &code, 1);
    hr_encode(dtype, f, vals, &code, NULL, words, 1, 1);
    for (int r = 1; r < others; r++) hr_encode(dtype, f, (char *)vals + r * size, &code, words, words, 1, 1);
    hr_decode(dtype, f, words, o, &code, o, 1, divisor, HR_DECODE_FLOATS);
}

/* gather: ``out`` <- the reproducible sum (a mean: divided by ``divisor``) of 1 + ``others``
 * contributions of n elements of a one-word format, ``own`` and the rows of ``rows`` (row k at k x
 * ``stride`` elements), the words float64: bitwise hr_codes, hr_encode and hr_decode in turn
 * (exact.py's _gathered, where an owner holds every contribution of its segment). Where no
 * contribution is truncated on the agreed grid (each is zero or at most P - 1 - mantissa binades
 * below the top), each word is the value itself on the grid, so the words' sum is the exact sum of
 * the values, which float64 holds (under 2^(P + 11) grid steps for up to 2^10 contributions): the
 * scaled sum is that sum, and the same division and rounding follow. The other elements (one
 * contribution truncated, or an Inf or NaN) go through the three kernels, one at a time: they are
 * rare in gradients. ``out`` may be ``own``. Returns -1 where it does not apply (then nothing is
 * written): more than 2^10 contributions. float64: hr_gather_f64. */
#define HR_GATHER(D, T, C, VALUE)                                                                 \
    if (dtype == D) {                                                                             \
        const T *x0 = own;                                                                        \
        const T *xr = rows;                                                                       \
        T *o = out;                                                                               \
        const uint32_t mask = (uint32_t)f->exponent_mask, shift = (uint32_t)f->mantissa;           \
        const uint32_t span = (uint32_t)(HR_ONE_WORD - 1 - f->mantissa);                          \
        const T magnitude = (T)(((T)1 << (sizeof(T) * 8 - 1)) - 1);                               \
        double acc[HR_GATHER_BLOCK];                                                              \
        uint32_t top[HR_GATHER_BLOCK], low[HR_GATHER_BLOCK];                                      \
        for (size_t s = 0; s < n; s += HR_GATHER_BLOCK) {                                         \
            size_t m = n - s < HR_GATHER_BLOCK ? n - s : HR_GATHER_BLOCK;                         \
            for (size_t i = 0; i < m; i++) {                                                      \
                T u = x0[s + i];                                                                  \
                uint32_t e = (uint32_t)(u >> shift) & mask;                                       \
                top[i] = e;                                                                       \
                low[i] = hr_sel32((u & magnitude) != 0, e > 1 ? e : 1, 0xffffu);                  \
                acc[i] = VALUE(u);                                                                \
            }                                                                                     \
            for (int r = 0; r < others; r++) {                                                    \
                const T *x = xr + (size_t)r * stride + s;                                         \
                for (size_t i = 0; i < m; i++) {                                                  \
                    T u = x[i];                                                                   \
                    uint32_t e = (uint32_t)(u >> shift) & mask;                                   \
                    uint32_t l = hr_sel32((u & magnitude) != 0, e > 1 ? e : 1, 0xffffu);          \
                    top[i] = e > top[i] ? e : top[i];                                             \
                    low[i] = l < low[i] ? l : low[i];                                             \
                    acc[i] += VALUE(u);                                                           \
                }                                                                                 \
            }                                                                                     \
            uint32_t any = 0;                                                                     \
            for (size_t i = 0; i < m; i++) {                                                      \
                uint32_t t = top[i] > 1 ? top[i] : 1;                                             \
                uint32_t slow = (top[i] == mask) | (low[i] + span < t);                           \
                any |= slow;                                                                      \
                double v = divisor == 1 ? acc[i] : acc[i] / div;                                  \
                T rounded = HR_GATHER_STORE(D, T, v);                                             \
                o[s + i] = (T)hr_sel32(slow, x0[s + i], rounded); /* kept for the pass below */  \
            }                                                                                     \
            if (!any) continue;                                                                   \
            for (size_t i = 0; i < m; i++) {                                                      \
                uint32_t t = top[i] > 1 ? top[i] : 1;                                             \
                if (!((top[i] == mask) | (low[i] + span < t))) continue;                          \
                hr_gather_one(D, f, xr + s, stride, others, o + s, i, divisor);                   \
            }                                                                                     \
        }                                                                                         \
        return 0;                                                                                 \
    }
#define HR_GATHER_STORE(D, T, v)                                                                  \
    (D == HR_F32 ? (T)hr_bits32((float)(v)) : D == HR_F16 ? (T)hr_double_to_half(v) : (T)hr_double_to_bf16(v))
#define HR_ONE_WORD_FORMATS(X)                                                                    \
    X(HR_F16, uint16_t, uint8_t, hr_half_to_double)                                              \
    X(HR_BF16, uint16_t, uint8_t, hr_bf16_to_double)                                             \
    X(HR_F32, uint32_t, uint8_t, hr_f32_value)

/* Whether a float64 element takes the three kernels (hr_gather_f64): an Inf or NaN, a truncated term,
 * a sum that may underflow or overflow (``zeros``: every contribution a zero). */
#define HR_GATHER_F64_SLOW(top, low, span, zeros)                                                 \
    (((top) == 0x7ffu) | ((low) + (span) < ((top) > 1 ? (top) : 1)) |                           \
     ((((top) > 1 ? (top) : 1) < 33) & !(zeros)) | ((top) > 2035))

/* float64: where nothing is truncated, every contribution is a multiple of the grid step g = 2^(top -
 * 1107) and the exact sum S fits in 2 x 53 bits: a cascade of error-free additions (TwoSum) leaves s
 * (the rounded running sum) and e (the sum of the exact errors, itself exact: under 2^(33 + 2 log2 G)
 * steps), and s + e rounds S once, as the words' hi 2^43 + lo does. Where S may be subnormal, g >=
 * 2^-1074 keeps it exact (top >= 33: smaller tops go the three kernels' way), and where a running
 * sum may overflow (top > 2035: up to 2^10 terms below 2^(top - 1022)) they do too; all-zero elements
 * take the plain sum (IEEE's signed zero, as the words keep it). Two contributions (the most common
 * owner: 2 ranks) in one loop, more a row at a time. */
HR_INLINE void hr_gather_f64(const hr_format *f, const uint64_t *x0, const uint64_t *xr, size_t stride, int others,
                             uint64_t *o, size_t n, int64_t divisor, const int DIVIDE) {
    const uint32_t span = (uint32_t)(HR_TWO_WORDS - 1 - f->mantissa);
    const uint64_t magnitude = 0x7fffffffffffffffull;
    const double div = (double)divisor;
    double sum[HR_GATHER_BLOCK], err[HR_GATHER_BLOCK];
    uint32_t top[HR_GATHER_BLOCK], low[HR_GATHER_BLOCK];
    uint8_t slow[HR_GATHER_BLOCK];
    for (size_t s = 0; s < n; s += HR_GATHER_BLOCK) {
        size_t m = n - s < HR_GATHER_BLOCK ? n - s : HR_GATHER_BLOCK;
        uint32_t any = 0;
        if (others == 1) {
            for (size_t i = 0; i < m; i++) {
                uint64_t u = x0[s + i], w = xr[s + i];
                uint32_t eu = (uint32_t)(u >> 52) & 0x7ffu, ew = (uint32_t)(w >> 52) & 0x7ffu;
                uint32_t lu = hr_sel32((u & magnitude) != 0, eu > 1 ? eu : 1, 0xffffu);
                uint32_t lw = hr_sel32((w & magnitude) != 0, ew > 1 ? ew : 1, 0xffffu);
                uint32_t t = eu > ew ? eu : ew, l = lu < lw ? lu : lw, zeros = l == 0xffffu;
                uint32_t bad = HR_GATHER_F64_SLOW(t, l, span, zeros);
                double a = hr_float64(u), b = hr_float64(w), v = a + b, bp = v - a;
                double e = (a - (v - bp)) + (b - bp);
                v = hr_seld(zeros, v, v + e);
                if (DIVIDE) v /= div;
                slow[i] = (uint8_t)bad;
                any |= bad;
                o[s + i] = hr_sel64(bad, u, hr_bits64(v)); /* own's value kept for the pass below */
            }
        } else {
            for (size_t i = 0; i < m; i++) {
                uint64_t u = x0[s + i];
                uint32_t e = (uint32_t)(u >> 52) & 0x7ffu;
                top[i] = e;
                low[i] = hr_sel32((u & magnitude) != 0, e > 1 ? e : 1, 0xffffu);
                sum[i] = hr_float64(u);
                err[i] = 0.0;
            }
            for (int r = 0; r < others; r++) {
                const uint64_t *x = xr + (size_t)r * stride + s;
                for (size_t i = 0; i < m; i++) {
                    uint64_t u = x[i];
                    uint32_t e = (uint32_t)(u >> 52) & 0x7ffu;
                    uint32_t l = hr_sel32((u & magnitude) != 0, e > 1 ? e : 1, 0xffffu);
                    top[i] = e > top[i] ? e : top[i];
                    low[i] = l < low[i] ? l : low[i];
                    double a = sum[i], b = hr_float64(u), t = a + b, bp = t - a;
                    err[i] += (a - (t - bp)) + (b - bp);
                    sum[i] = t;
                }
            }
            for (size_t i = 0; i < m; i++) {
                uint32_t zeros = low[i] == 0xffffu, bad = HR_GATHER_F64_SLOW(top[i], low[i], span, zeros);
                double v = hr_seld(zeros, sum[i], sum[i] + err[i]);
                if (DIVIDE) v /= div;
                slow[i] = (uint8_t)bad;
                any |= bad;
                o[s + i] = hr_sel64(bad, x0[s + i], hr_bits64(v)); /* own's value kept for the pass below */
            }
        }
        if (!any) continue;
        for (size_t i = 0; i < m; i++)
            if (slow[i]) hr_gather_one(HR_F64, f, xr + s, stride, others, o + s, i, divisor);
    }
}

HR_CLONES static int hr_gather(int dtype, const hr_format *f, const void *own, const void *rows, size_t stride,
                               int others, void *out, size_t n, int64_t divisor) {
    if (others < 1 || others + 1 > HR_GATHER_MOST) return -1;
    if (dtype == HR_F64) { /* a constant DIVIDE: a division in the loop would cost every sum */
        if (divisor == 1) hr_gather_f64(f, own, rows, stride, others, out, n, 1, 0);
        else hr_gather_f64(f, own, rows, stride, others, out, n, divisor, 1);
        return 0;
    }
    const double div = (double)divisor;
    HR_ONE_WORD_FORMATS(HR_GATHER)
    return -1;
}
#undef HR_GATHER
#undef HR_GATHER_STORE
#undef HR_ONE_WORD_FORMATS

#endif
