/* Wire narrowing and widening (hpcring/wire.py): float32/float64 <-> bfloat16/float16, bitwise
 * ml_dtypes' and NumPy's casts. ``on_grid`` (float32 -> bfloat16 only, as in wire.py): the values
 * are bfloat16s already, so truncating the low half is exact. */
#ifndef HPCRING_WIRE_H
#define HPCRING_WIRE_H

#include "reduce.h"

/* out (wire) <- src (wide); 0, or -1 for a pair it lacks. */
HR_CLONES static int hr_narrow(int from, int to, const void *src, void *out, size_t n, int on_grid) {
    uint16_t *o = out;
    if (from == HR_F32 && to == HR_BF16) {
        const uint32_t *s = src;
        if (on_grid) {
            for (size_t i = 0; i < n; i++) o[i] = (uint16_t)(s[i] >> 16);
        } else {
            for (size_t i = 0; i < n; i++) o[i] = hr_round_bf16(s[i]);
        }
    } else if (from == HR_F64 && to == HR_BF16) {
        const double *s = src;
        for (size_t i = 0; i < n; i++) o[i] = hr_double_to_bf16(s[i]);
    } else if (from == HR_F32 && to == HR_F16) {
        const float *s = src;
        for (size_t i = 0; i < n; i++) o[i] = hr_float_to_half(s[i]);
    } else if (from == HR_F64 && to == HR_F16) {
        const double *s = src;
        for (size_t i = 0; i < n; i++) o[i] = hr_double_to_half(s[i]);
    } else {
        return -1;
    }
    return 0;
}

/* out (wide) <- src (wire), exactly. */
HR_CLONES static int hr_widen(int from, int to, const void *src, void *out, size_t n) {
    const uint16_t *s = src;
    if (from == HR_BF16 && to == HR_F32) {
        uint32_t *o = out;
        for (size_t i = 0; i < n; i++) o[i] = (uint32_t)s[i] << 16;
    } else if (from == HR_BF16 && to == HR_F64) {
        double *o = out;
        for (size_t i = 0; i < n; i++) o[i] = hr_bf16_to_double(s[i]);
    } else if (from == HR_F16 && to == HR_F32) {
        float *o = out;
        for (size_t i = 0; i < n; i++) o[i] = hr_half_to_float(s[i]);
    } else if (from == HR_F16 && to == HR_F64) {
        double *o = out;
        for (size_t i = 0; i < n; i++) o[i] = hr_half_to_double(s[i]);
    } else {
        return -1;
    }
    return 0;
}

/* out (wide) <- widen(src) + other, or other + widen(src) (HR_WIDE_LEFT: the widened value is the
 * left operand, as the reduction that follows a receive names it): the widening and the sum in one
 * pass, no wide temporary. Bitwise hr_widen then hr_combine's sum (the same IEEE addition; of two
 * NaNs, which survives is the compiler's choice in both, as reduce.h says). ``out`` may be ``other``.
 * HR_WIDE_ROUND: the sum is then rounded to the wire and back (hr_round_trip: the owner's last sum,
 * kept as the others will receive it), its wire values stored in ``narrowed`` where given (what the
 * owner sends on). HR_WIDE_NARROW: the sum's wire values stored in ``narrowed`` (a partial sum the
 * next step sends), and with HR_WIDE_ONLY the wide sum not stored at all (nothing reads it). */
enum { HR_WIDE_LEFT = 1, HR_WIDE_ROUND = 2, HR_WIDE_NARROW = 4, HR_WIDE_ONLY = 8 };
#define HR_SUM(T, WIDEN) (left ? (T)WIDEN(s[i]) + b[i] : b[i] + (T)WIDEN(s[i]))
#define HR_WIDEN_ADD(T, WIDEN, NARROW)                                                            \
    {                                                                                             \
        const T *b = other;                                                                       \
        T *o = out;                                                                               \
        if (flags == 0 || flags == HR_WIDE_LEFT) {                                                \
            if (left) {                                                                           \
                for (size_t i = 0; i < n; i++) o[i] = (T)WIDEN(s[i]) + b[i];                      \
            } else {                                                                              \
                for (size_t i = 0; i < n; i++) o[i] = b[i] + (T)WIDEN(s[i]);                      \
            }                                                                                     \
        } else if ((flags & HR_WIDE_ROUND) && narrowed != NULL) {                                 \
            for (size_t i = 0; i < n; i++) {                                                      \
                uint16_t w = NARROW(HR_SUM(T, WIDEN));                                            \
                narrowed[i] = w;                                                                  \
                o[i] = (T)WIDEN(w);                                                               \
            }                                                                                     \
        } else if (flags & HR_WIDE_ROUND) {                                                       \
            for (size_t i = 0; i < n; i++) o[i] = (T)WIDEN(NARROW(HR_SUM(T, WIDEN)));             \
        } else if (flags & HR_WIDE_ONLY) {                                                        \
            for (size_t i = 0; i < n; i++) narrowed[i] = NARROW(HR_SUM(T, WIDEN));                \
        } else {                                                                                  \
            for (size_t i = 0; i < n; i++) {                                                      \
                T v = HR_SUM(T, WIDEN);                                                           \
                narrowed[i] = NARROW(v);                                                          \
                o[i] = v;                                                                         \
            }                                                                                     \
        }                                                                                         \
    }
HR_CLONES static int hr_widen_add(int from, int to, const void *src, const void *other, void *out, size_t n,
                                  int flags, uint16_t *narrowed) {
    const uint16_t *s = src;
    const int left = flags & HR_WIDE_LEFT;
    if ((flags & (HR_WIDE_NARROW | HR_WIDE_ONLY)) && narrowed == NULL) return -1;
    if (from == HR_BF16 && to == HR_F32) HR_WIDEN_ADD(float, hr_bf16_to_float, hr_float_to_bf16)
    else if (from == HR_BF16 && to == HR_F64) HR_WIDEN_ADD(double, hr_bf16_to_double, hr_double_to_bf16)
    else if (from == HR_F16 && to == HR_F32) HR_WIDEN_ADD(float, hr_half_to_float, hr_float_to_half)
    else if (from == HR_F16 && to == HR_F64) HR_WIDEN_ADD(double, hr_half_to_double, hr_double_to_half)
    else return -1;
    return 0;
}
#undef HR_WIDEN_ADD
#undef HR_SUM

/* array <- widen(narrow(array)) in place, and narrow(array) into ``narrowed``: the owner's rounding
 * and the wire values it sends on, in one pass. */
#define HR_ROUND_INTO(T, WIDEN, NARROW)                                                           \
    {                                                                                             \
        T *a = array;                                                                             \
        for (size_t i = 0; i < n; i++) {                                                          \
            uint16_t w = NARROW(a[i]);                                                            \
            narrowed[i] = w;                                                                      \
            a[i] = (T)WIDEN(w);                                                                   \
        }                                                                                         \
    }
__attribute__((unused)) HR_CLONES static int hr_round_into(int dtype, int wire, void *array, uint16_t *narrowed, size_t n) {
    if (dtype == HR_F32 && wire == HR_BF16) HR_ROUND_INTO(float, hr_bf16_to_float, hr_float_to_bf16)
    else if (dtype == HR_F64 && wire == HR_BF16) HR_ROUND_INTO(double, hr_bf16_to_double, hr_double_to_bf16)
    else if (dtype == HR_F32 && wire == HR_F16) HR_ROUND_INTO(float, hr_half_to_float, hr_float_to_half)
    else if (dtype == HR_F64 && wire == HR_F16) HR_ROUND_INTO(double, hr_half_to_double, hr_double_to_half)
    else return -1;
    return 0;
}
#undef HR_ROUND_INTO

/* array <- widen(narrow(array)), in place, in one pass. */
HR_CLONES static int hr_round_trip(int dtype, int wire, void *array, size_t n) {
    if (dtype == HR_F32 && wire == HR_BF16) {
        uint32_t *a = array;
        for (size_t i = 0; i < n; i++) a[i] = (uint32_t)hr_round_bf16(a[i]) << 16;
    } else if (dtype == HR_F64 && wire == HR_BF16) {
        double *a = array;
        for (size_t i = 0; i < n; i++) a[i] = hr_bf16_to_double(hr_double_to_bf16(a[i]));
    } else if (dtype == HR_F32 && wire == HR_F16) {
        float *a = array;
        for (size_t i = 0; i < n; i++) a[i] = hr_half_to_float(hr_float_to_half(a[i]));
    } else if (dtype == HR_F64 && wire == HR_F16) {
        double *a = array;
        for (size_t i = 0; i < n; i++) a[i] = hr_half_to_double(hr_double_to_half(a[i]));
    } else {
        return -1;
    }
    return 0;
}

#endif
