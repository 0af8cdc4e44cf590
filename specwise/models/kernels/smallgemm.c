/*
 * y[k][out] = x[k][in] . w[out][in]^T (+ bias[out]) for the few rows (k = 1..32) of decoding and verification.
 *
 * BLAS libraries pack both operands for every call, which dominates when x has a handful of rows: on the
 * development machine MKL and OpenBLAS took 2-2.5x longer for 5 rows than for 1, although the weight (the
 * only large operand) is read once either way. This kernel streams each tile of 4 weight rows once from memory
 * and applies it to up to 3 rows of x at a time from cache, so the cost of k rows stays close to the cost of
 * reading the weight. AVX2, FMA and F16C only (each function carries the target attribute): the entry points run
 * on the library's one choice of path (specwise_q_isa) and refuse with SW_EISA, writing nothing, below AVX2.
 */
#if defined(__x86_64__) /* AVX2 + FMA intrinsics: x86-64 only; elsewhere the float kernels are absent */
#include <stddef.h>
#include <stdint.h>

#include "specwise.h"

#include "quant_internal.h" /* the target attributes */

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
TARGET_AVX2 static inline void block4(const float *x, size_t ldx, const float *w0, int in, float *y, size_t ldy, int R) {
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

/* One weight row against R rows of x (the last row when out is odd). */
TARGET_AVX2 static inline void block1(const float *x, size_t ldx, const float *w0, int in, float *y, size_t ldy, int R) {
    for (int r = 0; r < R; r++) {
        __m256 a = _mm256_setzero_ps();
        int c = 0;
        for (; c + 8 <= in; c += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + c), _mm256_loadu_ps(x + r * ldx + c), a);
        float s = hsum(a);
        for (int t = c; t < in; t++) s += w0[t] * x[r * ldx + t];
        y[r * ldy] = s;
    }
}

/* One weight row against R rows of x (R <= 6), two accumulators per row over 16-float steps: each thread reads
 * the weight as one contiguous stream. Faster than the 4-row tiles while the x block stays in L1. */
TARGET_AVX2 static inline void row_block(const float *x, size_t ldx, const float *w, int in, float *y, size_t ldy, int R) {
    __m256 a[6], b[6];
    for (int r = 0; r < R; r++) { a[r] = _mm256_setzero_ps(); b[r] = _mm256_setzero_ps(); }
    int c = 0;
    for (; c + 16 <= in; c += 16) {
        __m256 w0 = _mm256_loadu_ps(w + c), w1 = _mm256_loadu_ps(w + c + 8);
        for (int r = 0; r < R; r++) {
            a[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + c), a[r]);
            b[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * ldx + c + 8), b[r]);
        }
    }
    for (; c + 8 <= in; c += 8) {
        __m256 w0 = _mm256_loadu_ps(w + c);
        for (int r = 0; r < R; r++) a[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + c), a[r]);
    }
    for (int r = 0; r < R; r++) {
        float s = hsum(_mm256_add_ps(a[r], b[r]));
        for (int t = c; t < in; t++) s += w[t] * x[r * ldx + t];
        y[r * ldy] = s;
    }
}
/* Output rows o .. o + n - 1 (n <= 4) for all k rows of x. */
TARGET_AVX2 static inline void rows(const float *x, const float *w, float *y, int k, int in, int out, int o, int n) {
    const float *w0 = w + (size_t)o * in;
    for (int r0 = 0; r0 < k; r0 += 3) {
        int R = k - r0 < 3 ? k - r0 : 3;
        const float *xr = x + (size_t)r0 * in;
        float *yr = y + (size_t)r0 * out + o;
        if (n == 4) {
            switch (R) {
                case 3: block4(xr, in, w0, in, yr, out, 3); break;
                case 2: block4(xr, in, w0, in, yr, out, 2); break;
                default: block4(xr, in, w0, in, yr, out, 1); break;
            }
        } else {
            for (int j = 0; j < n; j++) block1(xr, in, w0 + (size_t)j * in, in, yr + j, out, R);
        }
    }
}

/* x: [k, in] row-major; w: [out, in] row-major; bias: [out] or NULL; y: [k, out] row-major. */
TARGET_AVX2 static void small_gemm_avx2(const float *x, const float *w, const float *bias, float *y, int k, int in,
                                        int out, int threads) {
    if ((size_t)in * (k < 6 ? k : 6) * sizeof(float) <= 16384) {  /* the x block fits in L1: stream row by row */
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int o = 0; o < out; o++) {
            const float *wo = w + (size_t)o * in;
            for (int r0 = 0; r0 < k; r0 += 6) {
                int R = k - r0 < 6 ? k - r0 : 6;
                const float *xr = x + (size_t)r0 * in;
                float *yr = y + (size_t)r0 * out + o;
                switch (R) {
                    case 6: row_block(xr, in, wo, in, yr, out, 6); break;
                    case 5: row_block(xr, in, wo, in, yr, out, 5); break;
                    case 4: row_block(xr, in, wo, in, yr, out, 4); break;
                    case 3: row_block(xr, in, wo, in, yr, out, 3); break;
                    case 2: row_block(xr, in, wo, in, yr, out, 2); break;
                    default: row_block(xr, in, wo, in, yr, out, 1); break;
                }
            }
        }
    } else {
        int tiles = (out + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int t = 0; t < tiles; t++) rows(x, w, y, k, in, out, 4 * t, out - 4 * t < 4 ? out - 4 * t : 4);
    }
    if (bias) {
        for (int r = 0; r < k; r++)
            for (int o = 0; o < out; o++) y[(size_t)r * out + o] += bias[o];
    }
}

/* As row_block, with a float16 weight row converted to float32 as it is read (F16C): half the bytes to stream. */
TARGET_AVX2 static inline void row_block_h(const float *x, size_t ldx, const uint16_t *w, int in, float *y, size_t ldy, int R) {
    __m256 a[6], b[6];
    for (int r = 0; r < R; r++) { a[r] = _mm256_setzero_ps(); b[r] = _mm256_setzero_ps(); }
    int c = 0;
    for (; c + 16 <= in; c += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + c)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + c + 8)));
        for (int r = 0; r < R; r++) {
            a[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + c), a[r]);
            b[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * ldx + c + 8), b[r]);
        }
    }
    for (; c + 8 <= in; c += 8) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + c)));
        for (int r = 0; r < R; r++) a[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + c), a[r]);
    }
    for (int r = 0; r < R; r++) {
        float s = hsum(_mm256_add_ps(a[r], b[r]));
        for (int t = c; t < in; t++) s += _cvtsh_ss(w[t]) * x[r * ldx + t];
        y[r * ldy] = s;
    }
}

/* y = x . w^T (+ bias) with w stored as float16 [out][in]; x, bias and y float32 (layouts as above). */
TARGET_AVX2 static void small_gemm_f16_avx2(const float *x, const uint16_t *w, const float *bias, float *y, int k,
                                            int in, int out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int o = 0; o < out; o++) {
        const uint16_t *wo = w + (size_t)o * in;
        for (int r0 = 0; r0 < k; r0 += 6) {
            int R = k - r0 < 6 ? k - r0 : 6;
            const float *xr = x + (size_t)r0 * in;
            float *yr = y + (size_t)r0 * out + o;
            switch (R) {
                case 6: row_block_h(xr, in, wo, in, yr, out, 6); break;
                case 5: row_block_h(xr, in, wo, in, yr, out, 5); break;
                case 4: row_block_h(xr, in, wo, in, yr, out, 4); break;
                case 3: row_block_h(xr, in, wo, in, yr, out, 3); break;
                case 2: row_block_h(xr, in, wo, in, yr, out, 2); break;
                default: row_block_h(xr, in, wo, in, yr, out, 1); break;
            }
        }
    }
    if (bias) {
        for (int r = 0; r < k; r++)
            for (int o = 0; o < out; o++) y[(size_t)r * out + o] += bias[o];
    }
}
/* The entry points: the products on the AVX2 path or above, else SW_EISA. */
int specwise_small_gemm(const float *x, const float *w, const float *bias, float *y, int k, int in, int out,
                        int threads) {
    if (specwise_q_isa() < ISA_AVX2) return SW_EISA;
    small_gemm_avx2(x, w, bias, y, k, in, out, threads);
    return SW_OK;
}

int specwise_small_gemm_f16(const float *x, const uint16_t *w, const float *bias, float *y, int k, int in, int out,
                            int threads) {
    if (specwise_q_isa() < ISA_AVX2) return SW_EISA;
    small_gemm_f16_avx2(x, w, bias, y, k, in, out, threads);
    return SW_OK;
}
#endif /* __x86_64__ */
