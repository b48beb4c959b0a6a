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
