/*
 * The products of float rows (KIND_ROWS of quant.h: float32 or float16 weights [out][in] as they are, any in) for
 * the few rows (k = 1..32) of decoding and verification: the float32 models' matrices in the one decoder layer
 * (qllama.c) and specwise's small products of float weights, reached through specwise_q_gemm.
 *
 * BLAS libraries pack both operands for every call, which dominates when x has a handful of rows: MKL and OpenBLAS
 * took 2-2.5x longer for 5 rows than for 1, although the weight (the only large operand) is read once either way.
 * These loops stream each weight row once from memory and apply it to up to 6 rows of x from cache (while those
 * rows fit in L1; else tiles of 4 weight rows against 3 rows of x), so the cost of k rows stays close to the cost of
 * reading the weight. quant_gemm.c's driver shares the outputs out between threads.
 *
 * Each output is one chain per lane of eight: fused multiply-adds over the inputs in steps of eight (while the x
 * block fits in L1, two chains, the second over the second eight of every sixteen), the lanes added pairwise, then
 * the inputs past the last multiple of eight one by one. The portable loops compute the same operations in the same
 * order, so every path gives the same bits.
 */
#include <stddef.h>
#include <stdint.h>

#include "specwise.h"

#include "quant_internal.h"

/* while this many rows of x fit in L1 (16 KB) a weight row is applied to up to 6 rows at a time, else tiles of 4 */
static inline int streams(int in, int k) { return (size_t)in * (k < 6 ? k : 6) * sizeof(float) <= 16384; }

/* ---- portable: the vector loops' operations, lane by lane ----------------------------------------------------- */

/* ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)): the vector loops' sum of eight lanes */
static inline float lanes_sum(const float *v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

static inline float weight_at(const qmat *w, size_t i) {
    return w->half ? half_to_float(((const uint16_t *)w->q)[i]) : ((const float *)w->q)[i];
}

/* one output of one row: two chains over sixteen inputs (two = 1), or one over eight (two = 0) */
static float dot_portable(const qmat *w, size_t at, const float *x, int in, int two) {
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int c = 0;
    if (two)
        for (; c + 16 <= in; c += 16)
            for (int l = 0; l < 8; l++) {
                a[l] = fmaf(weight_at(w, at + c + l), x[c + l], a[l]);
                b[l] = fmaf(weight_at(w, at + c + 8 + l), x[c + 8 + l], b[l]);
            }
    for (; c + 8 <= in; c += 8)
        for (int l = 0; l < 8; l++) a[l] = fmaf(weight_at(w, at + c + l), x[c + l], a[l]);
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = two ? a[l] + b[l] : a[l];
    float s = lanes_sum(v);
    for (; c < in; c++) s += weight_at(w, at + c) * x[c];
    return s;
}

void rows_portable(const qmat *w, int o0, int o1, const float *x, int k, float *y, int ldy) {
    const int in = w->in, two = w->half || streams(in, k);
    for (int o = o0; o < o1; o++)
        for (int r = 0; r < k; r++) y[(size_t)r * ldy + o] = dot_portable(w, (size_t)o * in, x + (size_t)r * in, in, two);
}

/* ---- AVX2 ------------------------------------------------------------------------------------------------------ */
#ifdef SPECWISE_X86

TARGET_AVX2 static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 shuf = _mm_movehdup_ps(lo);
    __m128 sums = _mm_add_ps(lo, shuf);
    shuf = _mm_movehl_ps(shuf, sums);
    sums = _mm_add_ss(sums, shuf);
    return _mm_cvtss_f32(sums);
}

/* Four weight rows against R rows of x (R = 1..3): x loaded once per chunk, each weight vector used R times. */
TARGET_AVX2 static inline void block4(const float *x, size_t ldx, const float *w0, int in, float *y, size_t ldy,
                                      int R) {
    __m256 acc[4][3];
    for (int j = 0; j < 4; j++)
        for (int r = 0; r < R; r++) acc[j][r] = _mm256_setzero_ps();
    int c = 0;
    for (; c + 8 <= in; c += 8) {
        __m256 xv[3];
        for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + r * ldx + c);
        for (int j = 0; j < 4; j++) {
            __m256 wv = _mm256_loadu_ps(w0 + (size_t)j * in + c);
            for (int r = 0; r < R; r++) acc[j][r] = _mm256_fmadd_ps(wv, xv[r], acc[j][r]);
        }
    }
    for (int j = 0; j < 4; j++) {
        const float *wj = w0 + (size_t)j * in;
        for (int r = 0; r < R; r++) {
            float s = hsum(acc[j][r]);
            for (int t = c; t < in; t++) s += wj[t] * x[r * ldx + t];
            y[r * ldy + j] = s;
        }
    }
}

/* One weight row against R rows of x (fewer than four weight rows left): block4's operations. */
TARGET_AVX2 static inline void block1(const float *x, size_t ldx, const float *w0, int in, float *y, size_t ldy,
                                      int R) {
    for (int r = 0; r < R; r++) {
        __m256 a = _mm256_setzero_ps();
        int c = 0;
        for (; c + 8 <= in; c += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + c), _mm256_loadu_ps(x + r * ldx + c), a);
        float s = hsum(a);
        for (int t = c; t < in; t++) s += w0[t] * x[r * ldx + t];
        y[r * ldy] = s;
    }
}

/* One weight row (float32, or float16 converted as it is read: F16C, half the bytes to stream) against R rows of x
 * (R <= 6), two accumulators per row over 16-float steps: each thread reads the weight as one contiguous stream. */
#define ROW_BLOCK(NAME, T, LOAD8, ONE)                                                                            \
    TARGET_AVX2 static inline void NAME(const float *x, size_t ldx, const T *w, int in, float *y, size_t ldy,      \
                                        int R) {                                                                  \
        __m256 a[6], b[6];                                                                                        \
        for (int r = 0; r < R; r++) {                                                                             \
            a[r] = _mm256_setzero_ps();                                                                           \
            b[r] = _mm256_setzero_ps();                                                                           \
        }                                                                                                         \
        int c = 0;                                                                                                \
        for (; c + 16 <= in; c += 16) {                                                                           \
            __m256 w0 = LOAD8(w + c), w1 = LOAD8(w + c + 8);                                                      \
            for (int r = 0; r < R; r++) {                                                                         \
                a[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + c), a[r]);                               \
                b[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * ldx + c + 8), b[r]);                           \
            }                                                                                                     \
        }                                                                                                         \
        for (; c + 8 <= in; c += 8) {                                                                             \
            __m256 w0 = LOAD8(w + c);                                                                             \
            for (int r = 0; r < R; r++) a[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + c), a[r]);       \
        }                                                                                                         \
        for (int r = 0; r < R; r++) {                                                                             \
            float s = hsum(_mm256_add_ps(a[r], b[r]));                                                            \
            for (int t = c; t < in; t++) s += ONE(w[t]) * x[r * ldx + t];                                         \
            y[r * ldy] = s;                                                                                       \
        }                                                                                                         \
    }
#define F32_8(p) _mm256_loadu_ps(p)
#define F16_8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define F32_1(v) (v)
#define F16_1(v) _cvtsh_ss(v)
ROW_BLOCK(row_block, float, F32_8, F32_1)
ROW_BLOCK(row_block_h, uint16_t, F16_8, F16_1)
#undef ROW_BLOCK

/* Weight rows o0 .. o1 - 1 streamed one at a time, each against every row of x, 6 rows at a time (R a constant in
 * each call, so the accumulators stay in registers). */
#define STREAM(BLOCK, T)                                                                                          \
    for (int o = o0; o < o1; o++) {                                                                               \
        const T *wo = (const T *)w->q + (size_t)o * in;                                                           \
        for (int r0 = 0; r0 < k; r0 += 6) {                                                                       \
            const float *xr = x + (size_t)r0 * in;                                                                \
            float *yr = y + (size_t)r0 * ldy + o;                                                                 \
            switch (k - r0 < 6 ? k - r0 : 6) {                                                                    \
                case 6: BLOCK(xr, in, wo, in, yr, ldy, 6); break;                                                  \
                case 5: BLOCK(xr, in, wo, in, yr, ldy, 5); break;                                                  \
                case 4: BLOCK(xr, in, wo, in, yr, ldy, 4); break;                                                  \
                case 3: BLOCK(xr, in, wo, in, yr, ldy, 3); break;                                                  \
                case 2: BLOCK(xr, in, wo, in, yr, ldy, 2); break;                                                  \
                default: BLOCK(xr, in, wo, in, yr, ldy, 1); break;                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }

TARGET_AVX2 void rows_avx2(const qmat *w, int o0, int o1, const float *x, int k, float *y, int ldy) {
    const int in = w->in;
    if (w->half) {
        STREAM(row_block_h, uint16_t)
        return;
    }
    if (streams(in, k)) {
        STREAM(row_block, float)
        return;
    }
    /* tiles of four weight rows, each against three rows of x at a time */
    for (int o = o0; o < o1; o += 4) {
        const int n = o1 - o < 4 ? o1 - o : 4;
        const float *w0 = (const float *)w->q + (size_t)o * in;
        for (int r0 = 0; r0 < k; r0 += 3) {
            const int R = k - r0 < 3 ? k - r0 : 3;
            const float *xr = x + (size_t)r0 * in;
            float *yr = y + (size_t)r0 * ldy + o;
            if (n == 4) {
                switch (R) {
                    case 3: block4(xr, in, w0, in, yr, ldy, 3); break;
                    case 2: block4(xr, in, w0, in, yr, ldy, 2); break;
                    default: block4(xr, in, w0, in, yr, ldy, 1); break;
                }
            } else {
                for (int j = 0; j < n; j++) block1(xr, in, w0 + (size_t)j * in, in, yr + j, ldy, R);
            }
        }
    }
}
#undef STREAM
#endif /* SPECWISE_X86 */
