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

/* codes: the biased exponent; zeros and subnormals 1, and -0 0. ``out``: uint8 (uint16 for float64). */
HR_CLONES static void hr_codes(int dtype, const hr_format *f, const void *x, void *out, size_t n) {
    int shift = f->mantissa;
    uint64_t mask = (uint64_t)f->exponent_mask;
#define HR_CODES(D, T, C, VALUE)                                                                  \
    if (dtype == D) {                                                                             \
        const T *s = x;                                                                           \
        C *o = out;                                                                               \
        const T negative_zero = (T)((T)1 << (sizeof(T) * 8 - 1));                                 \
        for (size_t i = 0; i < n; i++) {                                                          \
            T u = s[i];                                                                           \
            T e = (T)((u >> shift) & mask);                                                       \
            o[i] = (C)hr_sel64(e == 0, u != negative_zero, e);                                    \
        }                                                                                         \
        return;                                                                                   \
    }
    HR_FORMATS(HR_CODES)
#undef HR_CODES
}

/* One format's main encode loop; ``first`` and ``floats`` are constants where it is inlined, so
 * each combination is its own branch-free loop. Returns whether some code is Inf/NaN's. */
#define HR_ENCODE_LOOP(D, T, C, VALUE)                                                            \
    HR_INLINE uint64_t hr_encode_loop_##T##_##C##_##VALUE(const hr_format *f, const T *restrict s, \
                                                         const C *restrict c, int64_t *restrict w0, \
                                                         int64_t *restrict w1, size_t n, const int first, \
                                                         const int floats) {                      \
        const uint64_t special = (uint64_t)f->exponent_mask;                                      \
        uint64_t any_special = 0;                                                                 \
        if (f->words == 1) {                                                                      \
            const int64_t base = HR_ONE_WORD + f->bias - 1;                                       \
            for (size_t i = 0; i < n; i++) {                                                      \
                uint64_t sp = c[i] == special;                                                    \
                any_special |= sp;                                                                \
                double t = hr_trunc(hr_ldexp(VALUE(s[i]), base - (int64_t)c[i]));                 \
                int64_t word = (int64_t)hr_sel64(sp, 0, (uint64_t)HR_WORD(t));                    \
                w0[i] = first ? word : (int64_t)((uint64_t)w0[i] + (uint64_t)word);               \
            }                                                                                     \
            return any_special;                                                                   \
        }                                                                                         \
        /* T = trunc(x 2^(85 - top)) as hi 2^43 + lo, from w = x 2^(42 - top) (exact.py) */       \
        const int64_t base = (HR_TWO_WORDS - HR_TWO_WORDS_LOW) + f->bias - 1;                     \
        for (size_t i = 0; i < n; i++) {                                                          \
            uint64_t sp = c[i] == special;                                                        \
            any_special |= sp;                                                                    \
            double w = hr_ldexp(VALUE(s[i]), base - (int64_t)c[i]);                               \
            double hi = hr_trunc(w);                                                              \
            double lo = hr_trunc((w - hi) * 0x1p43);                                              \
            int64_t a = (int64_t)hr_sel64(sp, 0, (uint64_t)HR_WORD(hi));                          \
            int64_t b = (int64_t)hr_sel64(sp, 0, (uint64_t)HR_WORD(lo));                          \
            w0[i] = first ? a : (int64_t)((uint64_t)w0[i] + (uint64_t)a);                         \
            w1[i] = first ? b : (int64_t)((uint64_t)w1[i] + (uint64_t)b);                         \
        }                                                                                         \
        return any_special;                                                                       \
    }
#define HR_WORD(t) (floats ? (int64_t)hr_bits64(t) : hr_as_int(t))
HR_FORMATS(HR_ENCODE_LOOP)
#undef HR_WORD

/* encode: words (fmt.words rows of n int64) += (or = where ``first``) the fixed point of x on the
 * grid ``code`` sets; ``floats`` (with ``first``): the integers stay float64 in the words' bytes.
 * The caller (kernels.c) has checked that the words lie apart from x and code. */
HR_CLONES static void hr_encode(int dtype, const hr_format *f, const void *x, const void *code,
                                int64_t *words, size_t n, int first, int floats) {
    int64_t *w0 = words, *w1 = f->words == 2 ? words + n : NULL;
#define HR_ENCODE(D, T, C, VALUE)                                                                 \
    if (dtype == D) {                                                                             \
        const T *s = x;                                                                           \
        const C *c = code;                                                                        \
        uint64_t any_special;                                                                     \
        if (first && floats) any_special = hr_encode_loop_##T##_##C##_##VALUE(f, s, c, w0, w1, n, 1, 1); \
        else if (first) any_special = hr_encode_loop_##T##_##C##_##VALUE(f, s, c, w0, w1, n, 1, 0); \
        else any_special = hr_encode_loop_##T##_##C##_##VALUE(f, s, c, w0, w1, n, 0, 0);          \
        if (any_special) { /* Inf and NaN: counted in the top word instead */                    \
            const C special = (C)f->exponent_mask;                                                \
            for (size_t i = 0; i < n; i++) {                                                      \
                if (c[i] != special) continue;                                                    \
                int64_t count = hr_special_count(VALUE(s[i]));                                    \
                if (first) w0[i] = floats ? (int64_t)hr_bits64((double)count) : count;            \
                else w0[i] = (int64_t)((uint64_t)w0[i] + (uint64_t)count);                        \
            }                                                                                     \
        }                                                                                         \
        return;                                                                                   \
    }
    HR_FORMATS(HR_ENCODE)
#undef HR_ENCODE
}

enum hr_decode_mode { HR_DECODE_FLOATS, HR_DECODE_SMALL, HR_DECODE_CAST, HR_DECODE_BIG };

/* exact.py's decode chooses its path from ``terms`` (-1: unknown) and, for one word, from the
 * words themselves; the same choice here, so that the same roundings happen on every input. */
static inline int hr_decode_mode(const hr_format *f, const int64_t *words, size_t n, int64_t terms, int floats) {
    if (floats) return HR_DECODE_FLOATS;
    if (f->words == 1) {
        if ((terms < 0 || terms >= ((int64_t)1 << 11)) && n) { /* terms << 42 >= 2^53 */
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
static inline double hr_sum_of(int mode, int two, int64_t a, int64_t b) {
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

/* out <- the summed words rounded once to out's dtype (divided by ``divisor`` first for a mean);
 * the words are only read (exact.py overwrites them). */
HR_CLONES static void hr_decode(int dtype, const hr_format *f, const int64_t *words, const void *code,
                                void *out, size_t n, int64_t divisor, int mode) {
    const int64_t *w0 = words, *w1 = f->words == 2 ? words + n : words;
    const uint64_t special = (uint64_t)f->exponent_mask;
    const int64_t base = (f->words == 1 ? HR_ONE_WORD : HR_TWO_WORDS) + f->bias - 1;
    const double div = (double)divisor;
    uint64_t any_special = 0;
#define HR_STORE(D, v) (D == HR_F16 ? hr_double_to_half(v) : D == HR_BF16 ? hr_double_to_bf16(v) : 0)
#define HR_DECODE_LOOP(D, T, MODE)                                                                \
    if (divisor == 1) {                                                                           \
        HR_DECODE_EACH(D, MODE, 0)                                                                \
    } else {                                                                                      \
        HR_DECODE_EACH(D, MODE, 1)                                                                \
    }
#define HR_DECODE_EACH(D, MODE, DIVIDE)                                                           \
    for (size_t i = 0; i < n; i++) {                                                              \
        uint64_t sp = c[i] == special;                                                            \
        any_special |= sp;                                                                        \
        double v = hr_ldexp(hr_sum_of(MODE, D == HR_F64, w0[i], w1[i]), (int64_t)c[i] - base);    \
        if (DIVIDE) v /= div;                                                                     \
        v = hr_seld(c[i] == 0, -0.0, v); /* every contribution was -0 */                          \
        if (D == HR_F32) ((float *)o)[i] = (float)v;                                              \
        else if (D == HR_F64) ((double *)o)[i] = v;                                               \
        else ((uint16_t *)o)[i] = HR_STORE(D, v);                                                 \
    }
#define HR_DECODE(D, T, C, VALUE)                                                                 \
    if (dtype == D) {                                                                             \
        const C *c = code;                                                                        \
        void *o = out;                                                                            \
        switch (mode) {                                                                           \
        case HR_DECODE_FLOATS: HR_DECODE_LOOP(D, T, HR_DECODE_FLOATS) break;                      \
        case HR_DECODE_SMALL: HR_DECODE_LOOP(D, T, HR_DECODE_SMALL) break;                        \
        case HR_DECODE_CAST: HR_DECODE_LOOP(D, T, HR_DECODE_CAST) break;                          \
        default: HR_DECODE_LOOP(D, T, HR_DECODE_BIG) break;                                       \
        }                                                                                         \
        if (any_special) {                                                                        \
            for (size_t i = 0; i < n; i++) {                                                      \
                if (c[i] != special) continue;                                                    \
                int64_t count = mode == HR_DECODE_FLOATS ? (int64_t)hr_float64((uint64_t)w0[i]) : w0[i]; \
                int64_t pos = count & (HR_NEG_INF_COUNT - 1), neg = (count >> 21) & (HR_NEG_INF_COUNT - 1); \
                double v = ((count >> 42) > 0 || (pos > 0 && neg > 0)) ? NAN : pos > 0 ? INFINITY : -INFINITY; \
                if (D == HR_F32) ((float *)o)[i] = (float)v;                                      \
                else if (D == HR_F64) ((double *)o)[i] = v;                                       \
                else ((uint16_t *)o)[i] = HR_STORE(D, v);                                         \
            }                                                                                     \
        }                                                                                         \
        return;                                                                                   \
    }
    HR_FORMATS(HR_DECODE)
#undef HR_DECODE
#undef HR_DECODE_LOOP
#undef HR_DECODE_EACH
#undef HR_STORE
}

#endif
