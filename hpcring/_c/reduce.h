/* The reductions: out <- left (op) right, element-wise, bitwise what NumPy (and ml_dtypes, for
 * bfloat16) give for np.add / maximum / minimum / multiply on contiguous arrays, ``out`` equal to
 * ``left`` or ``right`` or apart from both. Static inline, so the MPI-linked core's step loops can
 * reduce without going through Python.
 *
 * NaN rules, as those libraries' loops return them on contiguous arrays:
 * - maximum/minimum return one operand unchanged (no quieting): float32/float64 and bfloat16
 *   keep ``left`` where it is NaN, else ``left > right ? left : right`` (so max(+0, -0) is -0);
 *   float16 keeps ``left`` where ``left >= right`` or ``left`` is NaN (so max(+0, -0) is +0).
 * - add/multiply return a NaN operand quieted: float32/float64 the left one first (NumPy's SIMD
 *   loop; its remainder loop takes the right one where both are NaN, so there, and there only,
 *   NumPy's own bits depend on the position); float16 and bfloat16 in the order the installed
 *   NumPy and ml_dtypes use, measured once at load (hr_quirks).
 * - complex multiply: NumPy's formula, fused (fma) where its SIMD loop fuses (measured at load).
 */
#ifndef HPCRING_REDUCE_H
#define HPCRING_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "floatbits.h"

enum hr_dtype { HR_F16, HR_BF16, HR_F32, HR_F64, HR_I32, HR_I64, HR_C64, HR_C128, HR_U8, HR_U16, HR_NDTYPES };
enum hr_op { HR_SUM, HR_MAX, HR_MIN, HR_PROD, HR_NOPS };

static const int hr_itemsize[HR_NDTYPES] = {2, 2, 4, 8, 4, 8, 8, 16, 1, 2};

/* Each kernel's entry is compiled twice on x86-64 Linux with GCC, for AVX2 and for the baseline,
 * and the loader picks one (the same IEEE operations either way: no FMA is enabled). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define HR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HR_CLONES
#endif

/* What the installed NumPy and ml_dtypes do where IEEE leaves a choice (measured at load). */
typedef struct {
    int half_nan_right;  /* float16 add/multiply of two NaNs: the right one */
    int bf16_nan_right;  /* bfloat16 likewise (only the sign survives the narrowing) */
    int complex_fused;   /* complex multiply through fma, as NumPy's SIMD loop on FMA hardware */
} hr_quirks;

/* r, or the NaN operand quieted where there is one (``right_first``: b's where both are). In
 * integer selects, so the loops vectorize. */
static inline float hr_pick_nan_f(float a, float b, float r, int right_first) {
    uint32_t ua = hr_bits32(a), ub = hr_bits32(b);
    uint32_t na = (ua & 0x7fffffffu) > 0x7f800000u, nb = (ub & 0x7fffffffu) > 0x7f800000u;
    uint32_t first = right_first ? hr_sel32(nb, ub, ua) : hr_sel32(na, ua, ub);
    return hr_float32(hr_sel32(na | nb, first | 0x00400000u, hr_bits32(r)));
}

static inline double hr_pick_nan_d(double a, double b, double r) {
    uint64_t ua = hr_bits64(a), ub = hr_bits64(b);
    uint64_t na = (ua & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    uint64_t nb = (ub & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    return hr_float64(hr_sel64(na | nb, hr_sel64(na, ua, ub) | 0x0008000000000000ull, hr_bits64(r)));
}

#define HR_FLOAT_LOOP(T, NAN_OF, NAN_ARGS)                                                        \
    switch (op) {                                                                                 \
    case HR_SUM:                                                                                  \
        for (size_t i = 0; i < n; i++) { T a = l[i], b = r[i]; o[i] = NAN_OF(a, b, a + b NAN_ARGS); } \
        break;                                                                                    \
    case HR_PROD:                                                                                 \
        for (size_t i = 0; i < n; i++) { T a = l[i], b = r[i]; o[i] = NAN_OF(a, b, a * b NAN_ARGS); } \
        break;                                                                                    \
    case HR_MAX:                                                                                  \
        for (size_t i = 0; i < n; i++) { T a = l[i], b = r[i]; o[i] = (isnan(a) || a > b) ? a : b; } \
        break;                                                                                    \
    case HR_MIN:                                                                                  \
        for (size_t i = 0; i < n; i++) { T a = l[i], b = r[i]; o[i] = (isnan(a) || a < b) ? a : b; } \
        break;                                                                                    \
    default:                                                                                      \
        break;                                                                                    \
    }

#define HR_NAN_F(a, b, r) hr_pick_nan_f(a, b, r, 0)
#define HR_NAN_D(a, b, r) hr_pick_nan_d(a, b, r)
#define HR_NO_ARGS

static inline void hr_combine_f32(int op, const float *l, const float *r, float *o, size_t n) {
    HR_FLOAT_LOOP(float, HR_NAN_F, HR_NO_ARGS)
}

static inline void hr_combine_f64(int op, const double *l, const double *r, double *o, size_t n) {
    HR_FLOAT_LOOP(double, HR_NAN_D, HR_NO_ARGS)
}

#define HR_INT_LOOP(T, U)                                                                         \
    switch (op) {                                                                                 \
    case HR_SUM: /* two's complement wraps, as NumPy's do: unsigned arithmetic, no UB */           \
        for (size_t i = 0; i < n; i++) o[i] = (T)((U)l[i] + (U)r[i]);                             \
        break;                                                                                    \
    case HR_PROD:                                                                                 \
        for (size_t i = 0; i < n; i++) o[i] = (T)((U)l[i] * (U)r[i]);                             \
        break;                                                                                    \
    case HR_MAX:                                                                                  \
        for (size_t i = 0; i < n; i++) o[i] = l[i] > r[i] ? l[i] : r[i];                          \
        break;                                                                                    \
    case HR_MIN:                                                                                  \
        for (size_t i = 0; i < n; i++) o[i] = l[i] < r[i] ? l[i] : r[i];                          \
        break;                                                                                    \
    default:                                                                                      \
        break;                                                                                    \
    }

static inline void hr_combine_i32(int op, const int32_t *l, const int32_t *r, int32_t *o, size_t n) {
    HR_INT_LOOP(int32_t, uint32_t)
}

static inline void hr_combine_i64(int op, const int64_t *l, const int64_t *r, int64_t *o, size_t n) {
    HR_INT_LOOP(int64_t, uint64_t)
}

/* float16: NumPy widens both to float32, computes there, narrows (HALF_add and friends);
 * bfloat16: ml_dtypes does the same with its own conversions, and compares in float32 too. */
#define HR_NARROW_LOOP(TO_F, FROM_F, RIGHT)                                                       \
    switch (op) {                                                                                 \
    case HR_SUM:                                                                                  \
        for (size_t i = 0; i < n; i++) {                                                          \
            float a = TO_F(l[i]), b = TO_F(r[i]);                                                 \
            o[i] = FROM_F(hr_pick_nan_f(a, b, a + b, RIGHT));                                     \
        }                                                                                         \
        break;                                                                                    \
    case HR_PROD:                                                                                 \
        for (size_t i = 0; i < n; i++) {                                                          \
            float a = TO_F(l[i]), b = TO_F(r[i]);                                                 \
            o[i] = FROM_F(hr_pick_nan_f(a, b, a * b, RIGHT));                                     \
        }                                                                                         \
        break;                                                                                    \
    default:                                                                                      \
        break;                                                                                    \
    }

static inline void hr_combine_f16(int op, const uint16_t *l, const uint16_t *r, uint16_t *o, size_t n,
                                  const hr_quirks *q) {
    if (op == HR_MAX) { /* NumPy: (left >= right || isnan(left)) ? left : right */
        for (size_t i = 0; i < n; i++) {
            float a = hr_half_to_float(l[i]), b = hr_half_to_float(r[i]);
            o[i] = (uint16_t)hr_sel32((uint32_t)(a >= b) | (uint32_t)(a != a), l[i], r[i]);
        }
        return;
    }
    if (op == HR_MIN) {
        for (size_t i = 0; i < n; i++) {
            float a = hr_half_to_float(l[i]), b = hr_half_to_float(r[i]);
            o[i] = (uint16_t)hr_sel32((uint32_t)(a <= b) | (uint32_t)(a != a), l[i], r[i]);
        }
        return;
    }
    if (q->half_nan_right) {
        HR_NARROW_LOOP(hr_half_to_float, hr_float_to_half, 1)
    } else {
        HR_NARROW_LOOP(hr_half_to_float, hr_float_to_half, 0)
    }
}

static inline void hr_combine_bf16(int op, const uint16_t *l, const uint16_t *r, uint16_t *o, size_t n,
                                   const hr_quirks *q) {
    if (op == HR_MAX) { /* ml_dtypes: (isnan(left) || left > right) ? left : right */
        for (size_t i = 0; i < n; i++) {
            float a = hr_bf16_to_float(l[i]), b = hr_bf16_to_float(r[i]);
            o[i] = (uint16_t)hr_sel32((uint32_t)(a > b) | (uint32_t)(a != a), l[i], r[i]);
        }
        return;
    }
    if (op == HR_MIN) {
        for (size_t i = 0; i < n; i++) {
            float a = hr_bf16_to_float(l[i]), b = hr_bf16_to_float(r[i]);
            o[i] = (uint16_t)hr_sel32((uint32_t)(a < b) | (uint32_t)(a != a), l[i], r[i]);
        }
        return;
    }
    if (q->bf16_nan_right) {
        HR_NARROW_LOOP(hr_bf16_to_float, hr_float_to_bf16, 1)
    } else {
        HR_NARROW_LOOP(hr_bf16_to_float, hr_float_to_bf16, 0)
    }
}

/* complex: add is two float adds; multiply is NumPy's (ar br - ai bi) + i (ar bi + ai br), which its
 * SIMD loop computes as fma(ar, br, -(ai bi)) and fma(ar, bi, ai br) on FMA hardware (muladdsub).
 * A NaN result takes the first NaN among (ar, br, ai bi), resp. (ar, bi, ai br), quieted and with
 * its own sign, as the hardware's multiply-add-subtract returns it (negating a NaN operand, as
 * fma(.., -c) would, flips its sign); inside ai bi and ai br, NumPy's loop takes b's NaN first. */
#define HR_COMPLEX(NAME, T, FMA, NAN_OF)                                                          \
    static inline T NAME##_first_nan(T x, T y, T z, T r) {                                        \
        return isnan(x) ? NAN_OF(x, x, r) : isnan(y) ? NAN_OF(y, y, r) : isnan(z) ? NAN_OF(z, z, r) : r; \
    }                                                                                             \
    static inline void NAME(int op, const T *l, const T *r, T *o, size_t n, const hr_quirks *q) {        \
        if (op == HR_SUM) {                                                                       \
            for (size_t i = 0; i < 2 * n; i++) { T a = l[i], b = r[i]; o[i] = NAN_OF(a, b, a + b); } \
            return;                                                                               \
        }                                                                                         \
        if (op != HR_PROD) return;                                                                \
        int fused = q->complex_fused;                                                             \
        for (size_t i = 0; i < n; i++) {                                                          \
            T ar = l[2 * i], ai = l[2 * i + 1], br = r[2 * i], bi = r[2 * i + 1];                 \
            T c = NAN_OF(bi, ai, ai * bi), d = NAN_OF(br, ai, ai * br); /* NumPy's order */       \
            T re = fused ? FMA(ar, br, -c) : ar * br - c;                                         \
            T im = fused ? FMA(ar, bi, d) : ar * bi + d;                                          \
            if (isnan(re)) re = NAME##_first_nan(ar, br, c, re);                                  \
            if (isnan(im)) im = NAME##_first_nan(ar, bi, d, im);                                  \
            o[2 * i] = re;                                                                        \
            o[2 * i + 1] = im;                                                                    \
        }                                                                                         \
    }

HR_COMPLEX(hr_combine_c64, float, fmaf, HR_NAN_F)
HR_COMPLEX(hr_combine_c128, double, fma, HR_NAN_D)

/* out <- left (op) right for ``n`` elements of ``dtype``; 0, or -1 for a dtype/op it lacks. */
HR_CLONES static int hr_combine(int dtype, int op, const void *l, const void *r, void *o, size_t n,
                             const hr_quirks *q) {
    switch (dtype) {
    case HR_F16: hr_combine_f16(op, l, r, o, n, q); return 0;
    case HR_BF16: hr_combine_bf16(op, l, r, o, n, q); return 0;
    case HR_F32: hr_combine_f32(op, l, r, o, n); return 0;
    case HR_F64: hr_combine_f64(op, l, r, o, n); return 0;
    case HR_I32: hr_combine_i32(op, l, r, o, n); return 0;
    case HR_I64: hr_combine_i64(op, l, r, o, n); return 0;
    case HR_C64: if (op == HR_MAX || op == HR_MIN) return -1; hr_combine_c64(op, l, r, o, n, q); return 0;
    case HR_C128: if (op == HR_MAX || op == HR_MIN) return -1; hr_combine_c128(op, l, r, o, n, q); return 0;
    default: return -1;
    }
}

#endif
