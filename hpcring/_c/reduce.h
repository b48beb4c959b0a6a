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

/* Each kernel's entry is compiled three times on x86-64 Linux with GCC (x86-64-v4: AVX-512 with its
 * byte, word, doubleword and quadword forms; AVX2; baseline), and the loader picks one (the same
 * IEEE operations either way: -ffp-contract=off, so no FMA but the complex multiply's own). AVX-512F
 * alone would leave the conversions between doubles and 64-bit integers, and the byte lanes of the
 * reproducible sum's codes, to narrower vectors. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define HR_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
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

#define HR_INLINE static inline __attribute__((always_inline))

/* One element-wise kernel NAME over T, ``STEP`` values per element, whose BODY reads L[k] and
 * R[k] and writes O[k] (k in [STEP i, STEP i + STEP)) after its reads. kernels.c guarantees that
 * out is left, or right, or lies apart from each; so each case gets its own loop whose pointers
 * do not alias (restrict), and compilers vectorize it without run-time overlap checks (which fail,
 * hence a scalar loop, exactly for the in-place reductions the algorithms do). */
#define HR_KERNEL(NAME, T, STEP, BODY)                                                            \
    HR_INLINE void NAME##_apart(const T *restrict L, const T *restrict R, T *restrict O, size_t n) { \
        for (size_t i = 0; i < n; i++) { BODY }                                                   \
    }                                                                                             \
    HR_INLINE void NAME##_left(T *restrict O, const T *restrict R, size_t n) {                    \
        const T *L = O;                                                                           \
        for (size_t i = 0; i < n; i++) { BODY }                                                   \
    }                                                                                             \
    HR_INLINE void NAME##_right(const T *restrict L, T *restrict O, size_t n) {                   \
        const T *R = O;                                                                           \
        for (size_t i = 0; i < n; i++) { BODY }                                                   \
    }                                                                                             \
    HR_INLINE void NAME##_self(T *O, size_t n) {                                                  \
        const T *L = O, *R = O;                                                                   \
        for (size_t i = 0; i < n; i++) { BODY }                                                   \
    }                                                                                             \
    HR_INLINE void NAME(const void *l, const void *r, void *o, size_t n) {                        \
        if (o == l && o == r) NAME##_self(o, n);                                                  \
        else if (o == l) NAME##_left(o, r, n);                                                    \
        else if (o == r) NAME##_right(l, o, n);                                                   \
        else NAME##_apart(l, r, o, n);                                                            \
    }

/* float32, float64: IEEE in the type itself; maximum/minimum as NumPy's SIMD loops select. */
#define HR_IEEE(P, T, PICK)                                                                       \
    HR_KERNEL(P##_sum, T, 1, T a = L[i]; T b = R[i]; O[i] = PICK(a, b, a + b);)                   \
    HR_KERNEL(P##_prod, T, 1, T a = L[i]; T b = R[i]; O[i] = PICK(a, b, a * b);)                  \
    HR_KERNEL(P##_max, T, 1, T a = L[i]; T b = R[i]; O[i] = (isnan(a) || a > b) ? a : b;)         \
    HR_KERNEL(P##_min, T, 1, T a = L[i]; T b = R[i]; O[i] = (isnan(a) || a < b) ? a : b;)

/* The hardware's sum or product of a NaN and a number is that NaN quieted, as NumPy's is. Of two
 * NaNs it is the first source operand's, and which that is the compiler decides: so does NumPy's
 * (its SIMD body and remainder loops differ), and no rule is kept there. */
#define HR_AS_IS(a, b, r) (r)
HR_IEEE(hr_f32, float, HR_AS_IS)
HR_IEEE(hr_f64, double, HR_AS_IS)
#define HR_NAN_F(a, b, r) hr_pick_nan_f(a, b, r, 0)
#define HR_NAN_D(a, b, r) hr_pick_nan_d(a, b, r)

/* int32, int64: two's complement wraps, as NumPy's do (unsigned arithmetic: no UB). */
#define HR_INTEGER(P, T, U)                                                                       \
    HR_KERNEL(P##_sum, T, 1, O[i] = (T)((U)L[i] + (U)R[i]);)                                      \
    HR_KERNEL(P##_prod, T, 1, O[i] = (T)((U)L[i] * (U)R[i]);)                                     \
    HR_KERNEL(P##_max, T, 1, T a = L[i]; T b = R[i]; O[i] = a > b ? a : b;)                       \
    HR_KERNEL(P##_min, T, 1, T a = L[i]; T b = R[i]; O[i] = a < b ? a : b;)

HR_INTEGER(hr_i32, int32_t, uint32_t)
HR_INTEGER(hr_i64, int64_t, uint64_t)
/* uint8, uint16: the reproducible sum's agreed codes (a MAX all-reduce in the compiled step loop;
 * hpcring._kernels leaves these words to NumPy). */
HR_INTEGER(hr_u8, uint8_t, uint32_t)
HR_INTEGER(hr_u16, uint16_t, uint32_t)

/* float16: NumPy widens both to float32, computes there, narrows (HALF_add and friends), and
 * keeps left where (left >= right || isnan(left)) for maximum; bfloat16: ml_dtypes computes in
 * float32 too and keeps left where (isnan(left) || left > right). */
#define HR_NARROW_ARITH(P, TO_F, FROM_F, RIGHT)                                                   \
    HR_KERNEL(P##_sum, uint16_t, 1, float a = TO_F(L[i]); float b = TO_F(R[i]);                   \
              O[i] = FROM_F(hr_pick_nan_f(a, b, a + b, RIGHT));)                                  \
    HR_KERNEL(P##_prod, uint16_t, 1, float a = TO_F(L[i]); float b = TO_F(R[i]);                  \
              O[i] = FROM_F(hr_pick_nan_f(a, b, a * b, RIGHT));)

HR_NARROW_ARITH(hr_f16_left_nan, hr_half_to_float, hr_float_to_half, 0)
HR_NARROW_ARITH(hr_f16_right_nan, hr_half_to_float, hr_float_to_half, 1)
HR_NARROW_ARITH(hr_bf16_left_nan, hr_bf16_to_float, hr_float_to_bf16, 0)
HR_NARROW_ARITH(hr_bf16_right_nan, hr_bf16_to_float, hr_float_to_bf16, 1)
HR_KERNEL(hr_f16_max, uint16_t, 1, float a = hr_half_to_float(L[i]); float b = hr_half_to_float(R[i]);
          O[i] = (uint16_t)hr_sel32((uint32_t)(a >= b) | (uint32_t)(a != a), L[i], R[i]);)
HR_KERNEL(hr_f16_min, uint16_t, 1, float a = hr_half_to_float(L[i]); float b = hr_half_to_float(R[i]);
          O[i] = (uint16_t)hr_sel32((uint32_t)(a <= b) | (uint32_t)(a != a), L[i], R[i]);)
HR_KERNEL(hr_bf16_max, uint16_t, 1, float a = hr_bf16_to_float(L[i]); float b = hr_bf16_to_float(R[i]);
          O[i] = (uint16_t)hr_sel32((uint32_t)(a > b) | (uint32_t)(a != a), L[i], R[i]);)
HR_KERNEL(hr_bf16_min, uint16_t, 1, float a = hr_bf16_to_float(L[i]); float b = hr_bf16_to_float(R[i]);
          O[i] = (uint16_t)hr_sel32((uint32_t)(a < b) | (uint32_t)(a != a), L[i], R[i]);)

/* complex: add is two float adds; multiply is NumPy's (ar br - ai bi) + i (ar bi + ai br), which its
 * SIMD loop computes as fma(ar, br, -(ai bi)) and fma(ar, bi, ai br) on FMA hardware (muladdsub).
 * A NaN result takes the first NaN among (ar, br, ai bi), resp. (ar, bi, ai br), quieted and with
 * its own sign, as the hardware's multiply-add-subtract returns it (negating a NaN operand, as
 * fma(.., -c) would, flips its sign); inside ai bi and ai br, NumPy's loop takes b's NaN first. */
#define HR_FIRST_NAN(PICK, x, y, z, r)                                                           \
    (isnan(x) ? PICK(x, x, r) : isnan(y) ? PICK(y, y, r) : isnan(z) ? PICK(z, z, r) : r)
#define HR_COMPLEX(P, T, PICK)                                                                    \
    HR_KERNEL(P##_sum, T, 1, O[2 * i] = PICK(L[2 * i], R[2 * i], L[2 * i] + R[2 * i]);            \
              O[2 * i + 1] = PICK(L[2 * i + 1], R[2 * i + 1], L[2 * i + 1] + R[2 * i + 1]);)      \
    HR_KERNEL(P##_prod_fused, T, 1, T ar = L[2 * i]; T ai = L[2 * i + 1]; T br = R[2 * i];         \
              T bi = R[2 * i + 1]; T c = PICK(bi, ai, ai * bi); T d = PICK(br, ai, ai * br);      \
              T re = HR_FMA_##T(ar, br, -c); T im = HR_FMA_##T(ar, bi, d);                        \
              O[2 * i] = isnan(re) ? HR_FIRST_NAN(PICK, ar, br, c, re) : re;                      \
              O[2 * i + 1] = isnan(im) ? HR_FIRST_NAN(PICK, ar, bi, d, im) : im;)                  \
    HR_KERNEL(P##_prod_plain, T, 1, T ar = L[2 * i]; T ai = L[2 * i + 1]; T br = R[2 * i];         \
              T bi = R[2 * i + 1]; T c = PICK(bi, ai, ai * bi); T d = PICK(br, ai, ai * br);      \
              T re = ar * br - c; T im = ar * bi + d;                                             \
              O[2 * i] = isnan(re) ? HR_FIRST_NAN(PICK, ar, br, c, re) : re;                      \
              O[2 * i + 1] = isnan(im) ? HR_FIRST_NAN(PICK, ar, bi, d, im) : im;)

#define HR_FMA_float fmaf
#define HR_FMA_double fma
HR_COMPLEX(hr_c64, float, HR_NAN_F)
HR_COMPLEX(hr_c128, double, HR_NAN_D)

/* out <- left (op) right for ``n`` elements of ``dtype``; 0, or -1 for a dtype/op it lacks. */
HR_CLONES static int hr_combine(int dtype, int op, const void *l, const void *r, void *o, size_t n,
                                const hr_quirks *q) {
#define HR_OPS(P)                                                                                 \
    switch (op) {                                                                                 \
    case HR_SUM: P##_sum(l, r, o, n); return 0;                                                   \
    case HR_PROD: P##_prod(l, r, o, n); return 0;                                                 \
    case HR_MAX: P##_max(l, r, o, n); return 0;                                                   \
    case HR_MIN: P##_min(l, r, o, n); return 0;                                                   \
    default: return -1;                                                                           \
    }
    switch (dtype) {
    case HR_F32: HR_OPS(hr_f32)
    case HR_F64: HR_OPS(hr_f64)
    case HR_I32: HR_OPS(hr_i32)
    case HR_I64: HR_OPS(hr_i64)
    case HR_U8: HR_OPS(hr_u8)
    case HR_U16: HR_OPS(hr_u16)
    case HR_F16:
    case HR_BF16: {
        int half = dtype == HR_F16, right = half ? q->half_nan_right : q->bf16_nan_right;
        if (op == HR_MAX) half ? hr_f16_max(l, r, o, n) : hr_bf16_max(l, r, o, n);
        else if (op == HR_MIN) half ? hr_f16_min(l, r, o, n) : hr_bf16_min(l, r, o, n);
        else if (op == HR_SUM && half) right ? hr_f16_right_nan_sum(l, r, o, n) : hr_f16_left_nan_sum(l, r, o, n);
        else if (op == HR_SUM) right ? hr_bf16_right_nan_sum(l, r, o, n) : hr_bf16_left_nan_sum(l, r, o, n);
        else if (op == HR_PROD && half) right ? hr_f16_right_nan_prod(l, r, o, n) : hr_f16_left_nan_prod(l, r, o, n);
        else if (op == HR_PROD) right ? hr_bf16_right_nan_prod(l, r, o, n) : hr_bf16_left_nan_prod(l, r, o, n);
        else return -1;
        return 0;
    }
    case HR_C64:
    case HR_C128: {
        int wide = dtype == HR_C128;
        if (op == HR_SUM) wide ? hr_c128_sum(l, r, o, n) : hr_c64_sum(l, r, o, n);
        else if (op == HR_PROD && q->complex_fused) wide ? hr_c128_prod_fused(l, r, o, n) : hr_c64_prod_fused(l, r, o, n);
        else if (op == HR_PROD) wide ? hr_c128_prod_plain(l, r, o, n) : hr_c64_prod_plain(l, r, o, n);
        else return -1; /* complex numbers have no order */
        return 0;
    }
    default:
        return -1;
    }
#undef HR_OPS
}

#endif
