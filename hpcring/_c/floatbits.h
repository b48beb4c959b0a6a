/* Bit-level float conversions, each giving the very bits hpcring's Python path gets from NumPy
 * (float16) and ml_dtypes (bfloat16): correct rounding to nearest even, and the NaN rules those
 * libraries follow (checked bit for bit by tests/test_kernels.py).
 *
 * Written for -ffp-contract=off and without -ffast-math: every operation below must round as
 * written (the magic-number roundings and the round-to-odd step depend on it).
 */
#ifndef HPCRING_FLOATBITS_H
#define HPCRING_FLOATBITS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t hr_bits32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float hr_float32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint64_t hr_bits64(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static inline double hr_float64(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }

/* c ? x : y for c in {0, 1}, as masks: compilers vectorize these where a ?: would stay a branch. */
static inline uint32_t hr_sel32(uint32_t c, uint32_t x, uint32_t y) { uint32_t m = 0u - c; return (x & m) | (y & ~m); }
static inline uint64_t hr_sel64(uint64_t c, uint64_t x, uint64_t y) { uint64_t m = 0u - c; return (x & m) | (y & ~m); }
static inline double hr_seld(uint64_t c, double x, double y) { return hr_float64(hr_sel64(c, hr_bits64(x), hr_bits64(y))); }

/* --- float16 (NumPy's rules: exact widening that keeps a NaN's payload and signalling bit;
 * narrowing rounds to nearest even, a NaN keeps its sign and top payload bits, made nonzero) --- */

/* Written without branches, so that the loops around them vectorize. */
static inline float hr_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
    /* exponent rebiased from 15 to 127; Inf/NaN (all ones) once more, the payload kept */
    uint32_t normal = (em << 13) + 0x38000000u + (uint32_t)(em >= 0x7c00u) * 0x38000000u;
    uint32_t tiny = hr_bits32((float)(int32_t)em * 0x1p-24f); /* zero or subnormal: em x 2^-24 */
    return hr_float32(sign | hr_sel32(em < 0x0400u, tiny, normal));
}

static inline double hr_half_to_double(uint16_t h) {
    uint64_t sign = (uint64_t)(h & 0x8000u) << 48, em = h & 0x7fffu;
    uint64_t normal = (em << 42) + 0x3f00000000000000ull + (uint64_t)(em >= 0x7c00u) * 0x3f00000000000000ull;
    uint64_t tiny = hr_bits64((double)(int32_t)em * 0x1p-24);
    return hr_float64(sign | hr_sel64(em < 0x0400u, tiny, normal));
}

static inline uint16_t hr_float_to_half(float f) {
    uint32_t u = hr_bits32(f), a = u & 0x7fffffffu;
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t r = a - 0x38000000u; /* a normal float16 (exponent rebiased from 127 to 15), or Inf */
    r = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
    r = hr_sel32(r < 0x7c00u, r, 0x7c00u);
    /* subnormal or zero: a x 2^24 rounded to an integer, to nearest even, by float addition */
    uint32_t tiny = hr_bits32(hr_float32(a) * 0x1p24f + 0x1p23f) - 0x4b000000u;
    uint32_t payload = (a >> 13) & 0x3ffu;
    uint32_t nan = 0x7c00u | payload | (uint32_t)(payload == 0); /* NaN stays NaN */
    r = hr_sel32(a < 0x38800000u, tiny, r);
    return (uint16_t)(sign | hr_sel32(a > 0x7f800000u, nan, r));
}

static inline uint16_t hr_double_to_half(double d) {
    uint64_t u = hr_bits64(d), a = u & 0x7fffffffffffffffull;
    uint64_t sign = (u >> 48) & 0x8000u;
    uint64_t r = a - 0x3f00000000000000ull; /* exponent rebiased from 1023 to 15 */
    r = (r + 0x1ffffffffffull + ((r >> 42) & 1u)) >> 42;
    r = hr_sel64(r < 0x7c00u && a < 0x40f0000000000000ull, r, 0x7c00u); /* >= 2^16 overflows */
    uint64_t tiny = hr_bits64(hr_float64(a) * 0x1p24 + 0x1p52) - 0x4330000000000000ull;
    uint64_t payload = (a >> 42) & 0x3ffu;
    uint64_t nan = 0x7c00u | payload | (uint64_t)(payload == 0);
    r = hr_sel64(a < 0x3f10000000000000ull, tiny, r);
    return (uint16_t)(sign | hr_sel64(a > 0x7ff0000000000000ull, nan, r));
}

/* --- bfloat16 (ml_dtypes' rules: widening is exact, the bits are a float32's high half; every
 * NaN narrows to the quiet NaN of its sign; float64 rounds once, not through float32) --- */

static inline float hr_bf16_to_float(uint16_t b) { return hr_float32((uint32_t)b << 16); }

/* float64 of a bfloat16 goes through float32 as ml_dtypes' cast does: a signalling NaN comes
 * back quiet, as the hardware's float -> double conversion makes it. */
static inline double hr_bf16_to_double(uint16_t b) { return (double)hr_bf16_to_float(b); }

static inline uint16_t hr_round_bf16(uint32_t u) {
    uint32_t nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)hr_sel32((u & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

static inline uint16_t hr_float_to_bf16(float f) { return hr_round_bf16(hr_bits32(f)); }

/* Rounded once: to float32 by rounding to odd (24 bits, >= 8 + 2, so the next rounding is the
 * correct one, subnormals and overflow included), then to bfloat16 to nearest even. */
static inline uint16_t hr_double_to_bf16(double d) {
    float f = (float)d;
    double back = (double)f;
    uint32_t u = hr_bits32(f);
    u -= (uint32_t)(fabs(back) > fabs(d)); /* toward zero: the magnitude is the low 31 bits */
    u |= (uint32_t)(back != d);
    uint32_t nan = (uint32_t)((hr_bits64(d) >> 48) & 0x8000u) | 0x7fc0u;
    return (uint16_t)hr_sel32(isnan(d) != 0, nan, hr_round_bf16(u));
}

/* --- exact helpers for the reproducible sums (hpcring/exact.py) --- */

/* trunc(v), bitwise NumPy's (-0 kept): the C library's, which GCC turns into one rounding
 * instruction per vector where the clone has one (SSE4.1 and up) and no FP trap must be kept
 * exact (-fno-trapping-math, setup.py); the baseline clone calls the library. */
static inline double hr_trunc(double v) { return __builtin_trunc(v); }

/* 2^e for -1022 <= e <= 1023, from its bits. */
static inline double hr_pow2(int64_t e) { return hr_float64((uint64_t)(e + 1023) << 52); }

/* ldexp(v, e) for -2044 <= e <= 2046 as two multiplications, the first to within float64's
 * normal exponents and exact where it is used here (an upward scaling that cannot overflow, or a
 * downward one of an integer), the second rounding once where the result is subnormal, as
 * ldexp does. */
static inline double hr_ldexp(double v, int64_t e) {
    int64_t first = e < -1022 ? -1022 : e > 1023 ? 1023 : e;
    return v * hr_pow2(first) * hr_pow2(e - first);
}

#endif
