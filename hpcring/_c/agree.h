/* The agreement's collective, and the payload it may carry (hpcring/agreement.py says why).
 *
 * Every checked call starts with one MPI_Iallreduce of the same fixed shape on every rank: a
 * header of int64 words, [call number, row..., present, dtype, op, count, verdict] followed by its
 * negation (the verdict as it is), then a payload slot of a fixed number of bytes. The op takes
 * the maximum of the header words, so every rank learns max(row) and -min(row) at once: the
 * ranks agree exactly where the two meet (the call's columns and the verdict). The four payload
 * columns say what a rank put in the slot: present 1, and the payload's dtype, op and count
 * (a small `mpi` all-reduce), or present 0. Where every contribution agrees and carries the same
 * payload, the op reduces the payloads too: the data has moved by the time the ranks know they
 * agree, one collective instead of two. Where any rank carries none (or another), every rank
 * sees it in the header, nobody reads the slot, and the data moves after, as it would have.
 *
 * The payload reductions are bitwise commutative (b op a has the bits of a op b), so every rank
 * gets the same bits whichever tree MPI's all-reduce takes: sums and products are IEEE's (where
 * both operands are NaN, the one with the larger bits, quieted); maximum and minimum treat NaN as
 * winning (the larger bits among two) and order -0 below +0. No MPI in here: tested through the
 * Python reference (hpcring.agreement.combine_payload).
 */
#ifndef HPCRING_AGREE_H
#define HPCRING_AGREE_H

#include <stddef.h>
#include <stdint.h>

#include "reduce.h"

#define HR_PAYLOAD_COLUMNS 4 /* present, dtype, op, count: just before the verdict */
#define HR_TAG_AGREE 32002      /* two ranks' agreement message (hpcring.agreement.TAG_AGREE) */
#define HR_TAG_AGREE_DATA 32003 /* the rest of its payload, past HR_PAIR_INLINE (TAG_AGREE_DATA) */
#define HR_TAG_AHEAD 32004      /* an all-to-all's blocks, sent ahead of its agreement (TAG_AHEAD) */
#define HR_PAIR_INLINE 3584     /* the first bytes of payload, inside the header's message (PAIR_INLINE) */

/* 1 where every column of [first, last) holds one value (max equals min) in the header
 * (``width`` words of maxima, then ``width`` of negated minima). */
static inline int hr_one_value(const int64_t *h, int width, int first, int last) {
    for (int k = first; k < last; k++)
        if (h[k] != -h[width + k]) return 0;
    return 1;
}

/* 1 where the ranks in the header agree: one call, one row, no verdict. */
static inline int hr_agreed(const int64_t *h, int width) {
    return hr_one_value(h, width, 0, width - 1 - HR_PAYLOAD_COLUMNS) && h[width - 1] == 0 && h[2 * width - 1] == 0;
}

/* 1 where every rank in the header put the same payload in the slot. */
static inline int hr_carried(const int64_t *h, int width) {
    return hr_one_value(h, width, width - 1 - HR_PAYLOAD_COLUMNS, width - 1) && h[width - 1 - HR_PAYLOAD_COLUMNS] == 1;
}

/* The payload bytes that travel with a contribution of header ``h`` in an exchange (at most
 * ``slot``): those of one payload every rank in it agrees on and carries, else 0
 * (hpcring.agreement._riding). */
static inline size_t hr_riding(const int64_t *h, int width, size_t slot) {
    if (!hr_agreed(h, width) || !hr_carried(h, width)) return 0;
    int64_t code = h[width - 4], count = h[width - 2];
    if (code < 0 || code >= HR_NDTYPES || count <= 0 || (uint64_t)count > slot) return 0;
    size_t n = (size_t)count * (size_t)hr_itemsize[code];
    return n <= slot ? n : 0;
}

/* The flags an exchange's message carries after the header's maxima (hpcring.agreement._uniform):
 * 1 where the rows are one (and the call number), 2 where the payload columns are. */
static inline int64_t hr_uniform(const int64_t *h, int width) {
    return hr_one_value(h, width, 0, width - 1 - HR_PAYLOAD_COLUMNS) |
           2 * hr_one_value(h, width, width - 1 - HR_PAYLOAD_COLUMNS, width - 1);
}

/* The whole header of a contribution from its message (hpcring.agreement._unpack), received so that
 * the maxima fill words width - 1 .. 2 width - 2 and the flags the last: the maxima moved to the
 * front, the minima made from them (exact where a column group held one value; else one minimum
 * one less than its maximum, which keeps it apart as the true minimum would). */
static inline void hr_unpack(int64_t *h, int width) {
    int64_t flags = h[2 * width - 1];
    memmove(h, h + width - 1, (size_t)width * sizeof(int64_t));
    for (int k = 0; k < width - 1; k++) h[width + k] = -h[k];
    h[2 * width - 1] = h[width - 1];
    if (!(flags & 1)) h[width] += 1;
    if (!(flags & 2)) h[width + width - 1 - HR_PAYLOAD_COLUMNS] += 1;
}

/* The steps of an exchange (hpcring.agreement.steps): recursive doubling for ``rank`` of ``size``,
 * as kinds and peers; their number (at most 2 + 31). */
enum { HR_GIVE, HR_TAKE, HR_SWAP, HR_RESULT };
static inline int hr_steps(int rank, int size, int *kinds, int *peers) {
    int p = 1, n = 0;
    while (2 * p <= size) p *= 2;
    int extra = size - p;
    if (rank < 2 * extra && rank % 2) {
        kinds[0] = HR_GIVE, peers[0] = rank - 1;
        kinds[1] = HR_RESULT, peers[1] = rank - 1;
        return 2;
    }
    int index = rank < 2 * extra ? rank / 2 : rank - extra;
    if (rank < 2 * extra) kinds[n] = HR_TAKE, peers[n++] = rank + 1;
    for (int mask = 1; mask < p; mask <<= 1) {
        int other = index ^ mask;
        kinds[n] = HR_SWAP, peers[n++] = other < extra ? 2 * other : other + extra;
    }
    if (rank < 2 * extra) kinds[n] = HR_GIVE, peers[n++] = rank + 1;
    return n;
}

#define HR_PAYLOAD_FLOAT(NAME, T, U, BITS, FROM, QUIET, SIGN)                                     \
    static void NAME##_each(int op, const T *a, const T *b, T *out, size_t n) {                  \
        for (size_t i = 0; i < n; i++) {                                                          \
            T x = a[i], y = b[i];                                                                 \
            U ux = BITS(x), uy = BITS(y);                                                         \
            int nx = x != x, ny = y != y;                                                         \
            if (nx && ny) { /* two NaNs: the larger bits (quieted where arithmetic) */            \
                U m = ux > uy ? ux : uy;                                                          \
                out[i] = FROM((op == HR_SUM || op == HR_PROD) ? (m | QUIET) : m);                 \
                continue;                                                                         \
            }                                                                                     \
            switch (op) {                                                                         \
            case HR_SUM: out[i] = x + y; break;                                                   \
            case HR_PROD: out[i] = x * y; break;                                                  \
            case HR_MAX:                                                                          \
                out[i] = nx ? x : ny ? y : x == y ? ((ux & SIGN) ? y : x) : x > y ? x : y;        \
                break;                                                                            \
            case HR_MIN:                                                                          \
                out[i] = nx ? x : ny ? y : x == y ? ((ux & SIGN) ? x : y) : x < y ? x : y;        \
                break;                                                                            \
            }                                                                                     \
        }                                                                                         \
    }

/* Sums and products in one branchless pass, vectorized (and cloned for AVX2 and AVX-512, as the
 * kernels are): IEEE's op, except where both operands are NaN, where the larger bits, quieted.
 * One read of each operand: on a buffer just received, a separate pass looking for two NaNs
 * took the cache misses, and a two-rank plan's sum of 64 KiB took twice NumPy's add. */
#define HR_PAYLOAD_FAST(NAME, T, U, BITS, FROM, QUIET)                                           \
    HR_CLONES static void NAME##_sum(const T *a, const T *b, T *out, size_t n) {                \
        for (size_t i = 0; i < n; i++) {                                                          \
            T x = a[i], y = b[i];                                                                 \
            U ux = BITS(x), uy = BITS(y), r = BITS(x + y);                                        \
            U nan = (U)0 - (U)((x != x) & (y != y)); /* all ones where both are NaN */            \
            out[i] = FROM((r & ~nan) | (((ux > uy ? ux : uy) | QUIET) & nan));                    \
        }                                                                                         \
    }                                                                                             \
    HR_CLONES static void NAME##_prod(const T *a, const T *b, T *out, size_t n) {               \
        for (size_t i = 0; i < n; i++) {                                                          \
            T x = a[i], y = b[i];                                                                 \
            U ux = BITS(x), uy = BITS(y), r = BITS(x * y);                                        \
            U nan = (U)0 - (U)((x != x) & (y != y));                                              \
            out[i] = FROM((r & ~nan) | (((ux > uy ? ux : uy) | QUIET) & nan));                    \
        }                                                                                         \
    }                                                                                             \
    static void NAME(int op, const T *a, const T *b, T *out, size_t n) {                         \
        if (op == HR_SUM)                                                                         \
            NAME##_sum(a, b, out, n);                                                             \
        else if (op == HR_PROD)                                                                   \
            NAME##_prod(a, b, out, n);                                                            \
        else                                                                                      \
            NAME##_each(op, a, b, out, n);                                                        \
    }

HR_PAYLOAD_FLOAT(hr_payload_f32, float, uint32_t, hr_bits32, hr_float32, 0x00400000u, 0x80000000u)
HR_PAYLOAD_FLOAT(hr_payload_f64, double, uint64_t, hr_bits64, hr_float64, 0x0008000000000000ull,
                 0x8000000000000000ull)
HR_PAYLOAD_FAST(hr_payload_f32, float, uint32_t, hr_bits32, hr_float32, 0x00400000u)
HR_PAYLOAD_FAST(hr_payload_f64, double, uint64_t, hr_bits64, hr_float64, 0x0008000000000000ull)

/* The (dtype, op) pairs a payload may carry: those whose reduction is bitwise commutative here. */
static inline int hr_payload_ok(int dtype, int op) {
    switch (dtype) {
    case HR_F32:
    case HR_F64:
    case HR_I32:
    case HR_I64: return op >= 0 && op < HR_NOPS;
    case HR_C64:
    case HR_C128: return op == HR_SUM; /* a complex product's NaNs depend on the operands' order */
    default: return 0;
    }
}

/* out <- a (op) b for ``n`` elements of ``dtype`` (``out`` may be ``b``); 0, or -1 for a pair
 * hr_payload_ok refuses. */
static int hr_payload_combine3(int dtype, int op, const void *a, const void *b, void *out, size_t n,
                               const hr_quirks *q) {
    if (!hr_payload_ok(dtype, op)) return -1;
    switch (dtype) {
    case HR_F32: hr_payload_f32(op, a, b, out, n); return 0;
    case HR_F64: hr_payload_f64(op, a, b, out, n); return 0;
    case HR_C64: hr_payload_f32(op, a, b, out, 2 * n); return 0;
    case HR_C128: hr_payload_f64(op, a, b, out, 2 * n); return 0;
    default: return hr_combine(dtype, op, a, b, out, n, q); /* integers: exact, and they commute */
    }
}

/* b <- a (op) b (hpcring.agreement.combine_payload). */
static int hr_payload_combine(int dtype, int op, const void *a, void *b, size_t n, const hr_quirks *q) {
    return hr_payload_combine3(dtype, op, a, b, b, n, q);
}

#endif
