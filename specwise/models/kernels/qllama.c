/*
 * The decoder layers of the Llama family over quantized weights (quant.h), for the few rows (k = 1..32) of
 * decoding and verification, in one call:
 *   RMSNorm -> Q, K, V products (one parallel pass over the three) -> rotary + cache write -> causal attention
 *   over the cache -> output product + residual -> RMSNorm -> gate and up products (one pass) -> SiLU(gate) * up
 *   -> down product + residual.
 *
 * Layouts (row-major, contiguous; float32 unless said):
 *   x        [k, hidden]                     the residual stream, updated in place
 *   k_cache  [layers, n_kv, capacity, hd]    one per sequence (float32, or float16 with kv_half); row r writes
 *                                            position pos[r] of its own sequence's cache (v_cache alike)
 *   cos, sin [capacity, hd]                  rotary tables with the rotate-half sign folded into sin
 *   weights  7 per layer: q, k, v, o, gate, up, down
 *
 * The entry points take their arguments in the structs of specwise.h (the shape, the weights, a pass's rows, the
 * work buffers, the run options), every count and size 64-bit, and check them against each other before anything
 * is written (layers_check, rows_check).
 *
 * Everything here is plain C compiled for several instruction sets (target_clones picks one at load time); the
 * products are quant_gemm.c's. A row's result depends only on its own inputs and position, never on k.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "specwise.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

CLONES static void rms_norm_rows(const float *x, const float *w, float *y, int k, int n, float eps) {
    for (int r = 0; r < k; r++) {
        const float *xr = x + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        double part[4] = {0.0, 0.0, 0.0, 0.0}; /* four chains; n is a multiple of 4 for every model here */
        int i = 0;
        for (; i + 4 <= n; i += 4)
            for (int l = 0; l < 4; l++) part[l] += (double)xr[i + l] * xr[i + l];
        double ss = (part[0] + part[1]) + (part[2] + part[3]);
        for (; i < n; i++) ss += (double)xr[i] * xr[i];
        const float inv = 1.0f / sqrtf((float)(ss / n) + eps);
        for (int i = 0; i < n; i++) yr[i] = (xr[i] * inv) * w[i];
    }
}

#define GELU_K1 (-1.5957691216057308f)   /* -2 sqrt(2 / pi) */
#define GELU_K3 (-0.07135481627159871f) /* -2 sqrt(2 / pi) 0.044715 */

/* e^x to about 2 ulp (Cody-Waite reduction, degree-7 Taylor polynomial on [-ln2/2, ln2/2]); 0 below -87. The
 * vector versions below compute the same operations lane by lane. */
static inline float exp_approx(float x) {
    const float c = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = floorf(fmaf(c, 1.44269504088896341f, 0.5f));
    float r = fmaf(n, -0.693145751953125f, c);
    r = fmaf(n, -1.428606765330187e-06f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    union {
        int32_t i;
        float f;
    } scale = {((int32_t)n + 127) << 23};
    return x < -87.0f ? 0.0f : p * scale.f;
}

#if defined(__x86_64__)
#include <immintrin.h>
#define T256 __attribute__((target("avx2,fma,f16c")))

T256 static inline __m256 exp256(__m256 x) {
    const __m256 c = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(c, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), c);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    return _mm256_andnot_ps(low, y);
}


T256 static int softmax_exp8(float *sc, int len, float mx, float *a, int isa) {
    (void)isa;
    __m256 acc = _mm256_setzero_ps(), m = _mm256_set1_ps(mx);
    int j = 0;
    for (; j + 8 <= len; j += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + j), m));
        _mm256_storeu_ps(sc + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(a, acc);
    return j;
}

#define T512 __attribute__((target("avx512f,avx512vl,avx2,fma,f16c")))
T256 static int silu_mul8(const float *gate, const float *up, float *act, int n) {
    int i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(act + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    return i;
}

/* GeGLU's activation, eight lanes at a time: the same operations as gelu_tanh_mul's scalar loop */
T256 static int gelu_mul8(const float *gate, const float *up, float *act, int n) {
    int i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), k1 = _mm256_set1_ps(GELU_K1), k3 = _mm256_set1_ps(GELU_K3);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 z = _mm256_mul_ps(g, _mm256_fmadd_ps(k3, _mm256_mul_ps(g, g), k1));
        const __m256 e = exp256(z);
        _mm256_storeu_ps(act + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    return i;
}

T256 static inline float hsum8(__m256 acc) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

T256 static int store_half8(uint16_t *dst, const float *src, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}

/* Attention's two inner loops over a cache of floats (T float, no suffix) or of float16 bits (T uint16_t, suffix
 * _h), LOADn(p) giving n floats from p: the same operations in the same order for both. */
#define F32_8(p) _mm256_loadu_ps(p)
#define F16_8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define F32_16(p) _mm512_loadu_ps(p)
#define F16_16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define ATTENTION_X86(SUFFIX, T, LOAD8, LOAD16)                                                                    \
    /* sc[j] = (q . keys[j]) * scale for j < len: eight lanes per key, added in the portable order; four keys at a \
     * time so that four chains of multiply-adds run side by side */                                           \
    T256 static void key_scores##SUFFIX##256(const float *q, const T *keys, int len, int hd, float scale,         \
                                               float *sc) {                                                     \
        int j = 0;                                                                                               \
        for (; j + 8 <= len; j += 8) {                                                                           \
            const T *k0 = keys + (size_t)j * hd;                                                                 \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;     \
            for (int d = 0; d < hd; d += 8) {                                                                    \
                const __m256 qv = _mm256_loadu_ps(q + d);                                                        \
                a0 = _mm256_fmadd_ps(qv, LOAD8(k0 + d), a0);                                                     \
                a1 = _mm256_fmadd_ps(qv, LOAD8(k0 + hd + d), a1);                                                \
                a2 = _mm256_fmadd_ps(qv, LOAD8(k0 + 2 * hd + d), a2);                                            \
                a3 = _mm256_fmadd_ps(qv, LOAD8(k0 + 3 * hd + d), a3);                                            \
                a4 = _mm256_fmadd_ps(qv, LOAD8(k0 + 4 * hd + d), a4);                                            \
                a5 = _mm256_fmadd_ps(qv, LOAD8(k0 + 5 * hd + d), a5);                                            \
                a6 = _mm256_fmadd_ps(qv, LOAD8(k0 + 6 * hd + d), a6);                                            \
                a7 = _mm256_fmadd_ps(qv, LOAD8(k0 + 7 * hd + d), a7);                                            \
            }                                                                                                    \
            sc[j] = hsum8(a0) * scale;                                                                           \
            sc[j + 1] = hsum8(a1) * scale;                                                                       \
            sc[j + 2] = hsum8(a2) * scale;                                                                       \
            sc[j + 3] = hsum8(a3) * scale;                                                                       \
            sc[j + 4] = hsum8(a4) * scale;                                                                       \
            sc[j + 5] = hsum8(a5) * scale;                                                                       \
            sc[j + 6] = hsum8(a6) * scale;                                                                       \
            sc[j + 7] = hsum8(a7) * scale;                                                                       \
        }                                                                                                        \
        for (; j < len; j++) {                                                                                   \
            const T *kj = keys + (size_t)j * hd;                                                                 \
            __m256 acc = _mm256_setzero_ps();                                                                    \
            for (int d = 0; d < hd; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), LOAD8(kj + d), acc);   \
            sc[j] = hsum8(acc) * scale;                                                                          \
        }                                                                                                        \
    }                                                                                                            \
    /* out[d] = sum_j p[j] v[j][d]: one chain of multiply-adds per output element, in increasing j */            \
    T256 static void weighted_values##SUFFIX##256(const float *p, const T *vals, int len, int hd, float *out) {   \
        __m256 acc[32];                                                                                          \
        const int nv = hd / 8;                                                                                   \
        for (int u = 0; u < nv; u++) acc[u] = _mm256_setzero_ps();                                              \
        for (int j = 0; j < len; j++) {                                                                          \
            const __m256 pj = _mm256_set1_ps(p[j]);                                                              \
            const T *v = vals + (size_t)j * hd;                                                                  \
            for (int u = 0; u < nv; u++) acc[u] = _mm256_fmadd_ps(pj, LOAD8(v + 8 * u), acc[u]);                 \
        }                                                                                                        \
        for (int u = 0; u < nv; u++) _mm256_storeu_ps(out + 8 * u, acc[u]);                                     \
    }                                                                                                            \
    /* the same with 16 lanes, NV registers of them (a constant: the accumulators stay in registers) */          \
    T512 static void weighted_values##SUFFIX##512_4(const float *p, const T *vals, int len, float *out) {         \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                             \
        for (int j = 0; j < len; j++) {                                                                          \
            const __m512 pj = _mm512_set1_ps(p[j]);                                                              \
            const T *v = vals + (size_t)j * 64;                                                                  \
            a0 = _mm512_fmadd_ps(pj, LOAD16(v), a0);                                                             \
            a1 = _mm512_fmadd_ps(pj, LOAD16(v + 16), a1);                                                        \
            a2 = _mm512_fmadd_ps(pj, LOAD16(v + 32), a2);                                                        \
            a3 = _mm512_fmadd_ps(pj, LOAD16(v + 48), a3);                                                        \
        }                                                                                                        \
        _mm512_storeu_ps(out, a0);                                                                               \
        _mm512_storeu_ps(out + 16, a1);                                                                          \
        _mm512_storeu_ps(out + 32, a2);                                                                          \
        _mm512_storeu_ps(out + 48, a3);                                                                          \
    }                                                                                                            \
    T512 static void weighted_values##SUFFIX##512_8(const float *p, const T *vals, int len, float *out) {         \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;         \
        for (int j = 0; j < len; j++) {                                                                          \
            const __m512 pj = _mm512_set1_ps(p[j]);                                                              \
            const T *v = vals + (size_t)j * 128;                                                                 \
            a0 = _mm512_fmadd_ps(pj, LOAD16(v), a0);                                                             \
            a1 = _mm512_fmadd_ps(pj, LOAD16(v + 16), a1);                                                        \
            a2 = _mm512_fmadd_ps(pj, LOAD16(v + 32), a2);                                                        \
            a3 = _mm512_fmadd_ps(pj, LOAD16(v + 48), a3);                                                        \
            a4 = _mm512_fmadd_ps(pj, LOAD16(v + 64), a4);                                                        \
            a5 = _mm512_fmadd_ps(pj, LOAD16(v + 80), a5);                                                        \
            a6 = _mm512_fmadd_ps(pj, LOAD16(v + 96), a6);                                                        \
            a7 = _mm512_fmadd_ps(pj, LOAD16(v + 112), a7);                                                       \
        }                                                                                                        \
        _mm512_storeu_ps(out, a0);                                                                               \
        _mm512_storeu_ps(out + 16, a1);                                                                          \
        _mm512_storeu_ps(out + 32, a2);                                                                          \
        _mm512_storeu_ps(out + 48, a3);                                                                          \
        _mm512_storeu_ps(out + 64, a4);                                                                          \
        _mm512_storeu_ps(out + 80, a5);                                                                          \
        _mm512_storeu_ps(out + 96, a6);                                                                          \
        _mm512_storeu_ps(out + 112, a7);                                                                         \
    }                                                                                                            \
    /* the same with 16 lanes: each output element is the same chain of multiply-adds */                         \
    T512 static void weighted_values##SUFFIX##512(const float *p, const T *vals, int len, int hd, float *out) {   \
        if (hd == 64) {                                                                                          \
            weighted_values##SUFFIX##512_4(p, vals, len, out);                                                   \
            return;                                                                                              \
        }                                                                                                        \
        if (hd == 128) {                                                                                         \
            weighted_values##SUFFIX##512_8(p, vals, len, out);                                                   \
            return;                                                                                              \
        }                                                                                                        \
        __m512 acc[16];                                                                                          \
        const int nv = hd / 16;                                                                                  \
        for (int u = 0; u < nv; u++) acc[u] = _mm512_setzero_ps();                                              \
        for (int j = 0; j < len; j++) {                                                                          \
            const __m512 pj = _mm512_set1_ps(p[j]);                                                              \
            const T *v = vals + (size_t)j * hd;                                                                  \
            for (int u = 0; u < nv; u++) acc[u] = _mm512_fmadd_ps(pj, LOAD16(v + 16 * u), acc[u]);               \
        }                                                                                                        \
        for (int u = 0; u < nv; u++) _mm512_storeu_ps(out + 16 * u, acc[u]);                                    \
    }
ATTENTION_X86(, float, F32_8, F32_16)
ATTENTION_X86(_h, uint16_t, F16_8, F16_16)
#undef ATTENTION_X86

/* sc[h * ld + j] = (q_h . keys[j]) * scale for NH query heads q_h (q + 64 h) of 64 and every key j, KB keys at a
 * time, each key loaded once for all heads: every score is key_scores256's chain (the same multiply-adds in the same
 * order). KB = 4 for AVX-512's 32 registers, 2 for AVX2's 16. */
#define JOINT_SCORES(NAME, TARGET, T, LOAD8, NH, KB)                                                               \
    TARGET static void NAME(const float *q, const T *keys, int len, float scale, float *sc, size_t ld) {          \
        int j = 0;                                                                                               \
        for (; j + KB <= len; j += KB) {                                                                         \
            const T *k0 = keys + (size_t)j * 64;                                                                 \
            __m256 a[NH][KB];                                                                                    \
            for (int h = 0; h < NH; h++)                                                                         \
                for (int i = 0; i < KB; i++) a[h][i] = _mm256_setzero_ps();                                      \
            for (int d = 0; d < 64; d += 8) {                                                                    \
                __m256 x[KB];                                                                                    \
                for (int i = 0; i < KB; i++) x[i] = LOAD8(k0 + 64 * i + d);                                      \
                for (int h = 0; h < NH; h++) {                                                                   \
                    const __m256 qv = _mm256_loadu_ps(q + 64 * h + d);                                           \
                    for (int i = 0; i < KB; i++) a[h][i] = _mm256_fmadd_ps(qv, x[i], a[h][i]);                   \
                }                                                                                                \
            }                                                                                                    \
            for (int h = 0; h < NH; h++)                                                                         \
                for (int i = 0; i < KB; i++) sc[h * ld + j + i] = hsum8(a[h][i]) * scale;                        \
        }                                                                                                        \
        for (; j < len; j++) {                                                                                   \
            const T *kj = keys + (size_t)j * 64;                                                                 \
            for (int h = 0; h < NH; h++) {                                                                       \
                __m256 acc = _mm256_setzero_ps();                                                                \
                for (int d = 0; d < 64; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 64 * h + d), LOAD8(kj + d), acc); \
                sc[h * ld + j] = hsum8(acc) * scale;                                                             \
            }                                                                                                    \
        }                                                                                                        \
    }

/* NH query heads that share a key-value head (head size 64), each key and value read once for all of them: every
 * head's numbers are those of key_scores / weighted_values above (the same chains in the same order). */
#define JOINT(SUFFIX, T, LOAD8, LOAD16, NH)                                                                        \
    JOINT_SCORES(key_scores##SUFFIX##_j##NH, T512, T, LOAD8, NH, 4)                                             \
    T512 static void weighted_values##SUFFIX##_j##NH(const float *p, size_t ld, const T *vals, int len, float *out) { \
        __m512 a[NH][4];                                                                                         \
        for (int h = 0; h < NH; h++)                                                                             \
            for (int u = 0; u < 4; u++) a[h][u] = _mm512_setzero_ps();                                           \
        for (int j = 0; j < len; j++) {                                                                          \
            const T *v = vals + (size_t)j * 64;                                                                  \
            const __m512 v0 = LOAD16(v), v1 = LOAD16(v + 16), v2 = LOAD16(v + 32), v3 = LOAD16(v + 48);           \
            for (int h = 0; h < NH; h++) {                                                                       \
                const __m512 pj = _mm512_set1_ps(p[h * ld + j]);                                                 \
                a[h][0] = _mm512_fmadd_ps(pj, v0, a[h][0]);                                                      \
                a[h][1] = _mm512_fmadd_ps(pj, v1, a[h][1]);                                                      \
                a[h][2] = _mm512_fmadd_ps(pj, v2, a[h][2]);                                                      \
                a[h][3] = _mm512_fmadd_ps(pj, v3, a[h][3]);                                                      \
            }                                                                                                    \
        }                                                                                                        \
        for (int h = 0; h < NH; h++)                                                                             \
            for (int u = 0; u < 4; u++) _mm512_storeu_ps(out + 64 * h + 16 * u, a[h][u]);                       \
    }
JOINT(, float, F32_8, F32_16, 2)
JOINT(, float, F32_8, F32_16, 3)
JOINT(_h, uint16_t, F16_8, F16_16, 2)
JOINT(_h, uint16_t, F16_8, F16_16, 3)
#undef JOINT
#define HAVE_JOINT 1

/* The same for AVX2 (16 registers): two keys at a time for the scores, and the values a quarter of each row (one
 * cache line) at a time, so that every head's accumulators stay in registers; each element is still the same chain
 * of multiply-adds in the same order as weighted_values256. */
#define JOINT256(SUFFIX, T, LOAD8, NH)                                                                             \
    JOINT_SCORES(key_scores##SUFFIX##256_j##NH, T256, T, LOAD8, NH, 2)                                          \
    T256 static void weighted_values##SUFFIX##256_j##NH(const float *p, size_t ld, const T *vals, int len,        \
                                                         float *out) {                                           \
        for (int u = 0; u < 64; u += 16) {                                                                       \
            __m256 a[NH][2];                                                                                     \
            for (int h = 0; h < NH; h++) a[h][0] = a[h][1] = _mm256_setzero_ps();                                \
            for (int j = 0; j < len; j++) {                                                                      \
                const T *v = vals + (size_t)j * 64 + u;                                                          \
                const __m256 v0 = LOAD8(v), v1 = LOAD8(v + 8);                                                   \
                for (int h = 0; h < NH; h++) {                                                                   \
                    const __m256 pj = _mm256_set1_ps(p[h * ld + j]);                                             \
                    a[h][0] = _mm256_fmadd_ps(pj, v0, a[h][0]);                                                  \
                    a[h][1] = _mm256_fmadd_ps(pj, v1, a[h][1]);                                                  \
                }                                                                                                \
            }                                                                                                    \
            for (int h = 0; h < NH; h++) {                                                                       \
                _mm256_storeu_ps(out + 64 * h + u, a[h][0]);                                                     \
                _mm256_storeu_ps(out + 64 * h + u + 8, a[h][1]);                                                 \
            }                                                                                                    \
        }                                                                                                        \
    }
JOINT256(, float, F32_8, 2)
JOINT256(, float, F32_8, 3)
JOINT256(_h, uint16_t, F16_8, 2)
JOINT256(_h, uint16_t, F16_8, 3)
#undef JOINT256
#undef JOINT_SCORES

#endif

/* Scores to unnormalised probabilities in place; returns their sum (eight partial sums, added pairwise). */
#if defined(__x86_64__)
/* the largest of sc[0 .. len - 1] (NaN skipped, as the portable comparison skips it); a max in any order */
T256 static float max8(const float *sc, int len) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= len; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(sc + j), m);
    float lanes[8], mx = -INFINITY;
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; l++) mx = lanes[l] > mx ? lanes[l] : mx;
    for (; j < len; j++) mx = sc[j] > mx ? sc[j] : mx;
    return mx;
}
#endif

static float softmax_unnormalised(float *sc, int len, int isa) {
    float mx = -INFINITY;
#if defined(__x86_64__)
    if (isa >= ISA_AVX2)
        mx = max8(sc, len);
    else
#endif
        for (int j = 0; j < len; j++) mx = sc[j] > mx ? sc[j] : mx;
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0;
#if defined(__x86_64__)
    if (isa >= ISA_AVX2) {
        j = softmax_exp8(sc, len, mx, a, isa);
    }
#endif
    (void)isa;
    for (; j + 8 <= len; j += 8)
        for (int l = 0; l < 8; l++) {
            sc[j + l] = exp_approx(sc[j + l] - mx);
            a[l] += sc[j + l];
        }
    float sum = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
    for (; j < len; j++) {
        sc[j] = exp_approx(sc[j] - mx);
        sum += sc[j];
    }
    return sum;
}

/* ---- a float16 cache (MODE_Q8 with kv_half): keys and values rounded to float16 when written, read back exactly -- */


static void store_half(uint16_t *dst, const float *src, int n, int isa) {
    int i = 0;
#if defined(__x86_64__)
    if (isa >= ISA_AVX2) i = store_half8(dst, src, n);
#endif
    (void)isa;
    for (; i < n; i++) dst[i] = f2h(src[i]);
}

/* The portable loops and the choice of path, for both caches (see ATTENTION_X86); LOAD1(p) gives the float at p. */
#define F32_1(p) (*(p))
#define F16_1(p) half_to_float(*(p))
#if defined(__x86_64__)
#define VECTOR_PATHS(SUFFIX)                                                                                     \
    if (isa >= ISA_AVX2 && hd % 8 == 0) {                                                                        \
        key_scores##SUFFIX##256(q, keys, len, hd, scale, sc);                                                   \
        return;                                                                                                  \
    }
#define VECTOR_VALUES(SUFFIX)                                                                                    \
    if (isa >= ISA_AVX512 && hd % 16 == 0 && hd <= 256) {                                                        \
        weighted_values##SUFFIX##512(p, vals, len, hd, out);                                                     \
        return;                                                                                                  \
    }                                                                                                            \
    if (isa >= ISA_AVX2 && hd % 8 == 0 && hd <= 256) {                                                           \
        weighted_values##SUFFIX##256(p, vals, len, hd, out);                                                     \
        return;                                                                                                  \
    }
#else
#define VECTOR_PATHS(SUFFIX)
#define VECTOR_VALUES(SUFFIX)
#endif
#define ATTENTION(SUFFIX, T, LOAD1)                                                                                \
    /* sc[j] = (q . keys[j]) * scale: eight lanes accumulated with fused multiply-adds, then added pairwise */    \
    static void key_scores##SUFFIX(const float *q, const T *keys, int len, int hd, float scale, float *sc,       \
                                   int isa) {                                                                    \
        VECTOR_PATHS(SUFFIX)                                                                                     \
        (void)isa;                                                                                               \
        for (int j = 0; j < len; j++) {                                                                          \
            const T *kj = keys + (size_t)j * hd;                                                                 \
            float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                               \
            for (int d = 0; d < hd; d += 8)                                                                      \
                for (int l = 0; l < 8; l++) a[l] = fmaf(q[d + l], LOAD1(kj + d + l), a[l]);                       \
            float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];                        \
            t0 = t0 + t2;                                                                                        \
            t1 = t1 + t3;                                                                                        \
            sc[j] = (t0 + t1) * scale;                                                                           \
        }                                                                                                        \
    }                                                                                                            \
    /* out[d] = sum_j p[j] v[j][d] in increasing j, from zero */                                                  \
    static void weighted_values##SUFFIX(const float *p, const T *vals, int len, int hd, float *out, int isa) {    \
        VECTOR_VALUES(SUFFIX)                                                                                    \
        (void)isa;                                                                                               \
        for (int d = 0; d < hd; d++) out[d] = 0.0f;                                                              \
        for (int j = 0; j < len; j++) {                                                                          \
            const float pj = p[j];                                                                               \
            const T *v = vals + (size_t)j * hd;                                                                  \
            for (int d = 0; d < hd; d++) out[d] = fmaf(pj, LOAD1(v + d), out[d]);                                \
        }                                                                                                        \
    }
ATTENTION(, float, F32_1)
ATTENTION(_h, uint16_t, F16_1)
#undef ATTENTION
#undef VECTOR_PATHS
#undef VECTOR_VALUES

/* act = SiLU(gate) * up */
static void silu_mul(const float *gate, const float *up, float *act, int n, int isa) {
    int i = 0;
#if defined(__x86_64__)
    if (isa >= ISA_AVX2) i = silu_mul8(gate, up, act, n);
#endif
    (void)isa;
    for (; i < n; i++) act[i] = gate[i] / (1.0f + exp_approx(-gate[i])) * up[i];
}

/* GeGLU's activation: act = gelu(gate) * up with the tanh approximation of GELU (Gemma's gelu_pytorch_tanh),
 * 0.5 g (1 + tanh(u)) = g / (1 + e^(-2u)) with u = sqrt(2 / pi) (g + 0.044715 g^3): -2u = g (K1 + K3 g^2). */
static void gelu_tanh_mul(const float *gate, const float *up, float *act, int n, int isa) {
    int i = 0;
#if defined(__x86_64__)
    if (isa >= ISA_AVX2) i = gelu_mul8(gate, up, act, n);
#endif
    (void)isa;
    for (; i < n; i++) {
        const float g = gate[i];
        act[i] = g / (1.0f + exp_approx(g * fmaf(GELU_K3, g * g, GELU_K1))) * up[i];
    }
}

/* Rotate-half rotary embedding of one head in place: y[d] = x[d] cos[d] + x[(d + hd/2) % hd] sin[d]. */
static void rotary(float *v, const float *c, const float *s, int hd) {
    float tmp[512];
    const int half = hd / 2;
    memcpy(tmp, v, (size_t)hd * sizeof(float));
    for (int d = 0; d < half; d++) v[d] = tmp[d] * c[d] + tmp[d + half] * s[d];
    for (int d = half; d < hd; d++) v[d] = tmp[d] * c[d] + tmp[d - half] * s[d];
}

/* Optional per-part timings (seconds, summed over calls): products, attention, the rest. Off unless enabled. */
enum { PART_PRODUCTS = 0, PART_ATTENTION = 1, PART_REST = 2, N_PARTS = 3 };
static int g_timing = 0;
static double g_parts[N_PARTS];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Enable (1) or disable (0) the timings; copies the sums so far into out[3] (if not NULL) and resets them. */
void specwise_qllama_timings(int enable, double *out) {
    if (out)
        for (int i = 0; i < N_PARTS; i++) out[i] = g_parts[i];
    for (int i = 0; i < N_PARTS; i++) g_parts[i] = 0.0;
    g_timing = enable;
}

#define MARK(part)                                   \
    do {                                             \
        if (g_timing) {                              \
            double t_ = now_s();                     \
            g_parts[part] += t_ - t_mark;            \
            t_mark = t_;                             \
        }                                            \
    } while (0)

/* a * b, or -1 when either is negative or the product does not fit in 64 bits */
static int64_t mul64(int64_t a, int64_t b) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return -1;
    return r;
}

/* a + b of two results of mul64, or -1 when either is -1 or the sum does not fit */
static int64_t add64(int64_t a, int64_t b) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return -1;
    return r;
}

int64_t specwise_qllama_scratch_floats(const qshape *shape, int64_t rows) {
    if (!shape || rows < 0 || rows > QL_MAX_ROWS) return -1;
    const int64_t dims[5] = {shape->hidden, shape->heads, shape->kv_heads, shape->head_dim, shape->inter};
    for (int i = 0; i < 5; i++)
        if (dims[i] < 1 || dims[i] > QMAX_DIM) return -1;
    const int64_t qkv = mul64(add64(shape->heads, mul64(2, shape->kv_heads)), shape->head_dim);
    const int64_t per_row = add64(add64(mul64(2, shape->hidden), qkv),
                                  add64(mul64(shape->heads, shape->head_dim), mul64(3, shape->inter)));
    return mul64(rows, per_row);
}

/* Whether a matrix is there, with `in` inputs (and `out` outputs when out > 0): its tiles' own checks are quant.c's */
static int mat_fits(const qmat *w, int64_t out, int64_t in) {
    return w && w->q && w->out >= 1 && w->in == in && (out <= 0 || w->out == out);
}

/* Whether the model's shape and weights fit together: a shape with heads in whole groups and an even head width
 * (every width inside what the tiles index), and every layer's norms and seven matrices of the shapes it gives
 * (q, k, v, o, gate, up, down, in tiles the kernels read). Returns 0, or QL_EHEAD / QL_EFIT. */
static int layers_check(const qshape *shape, const qlayers *layers) {
    if (!shape || !layers) return QL_EFIT;
    if (shape->head_dim > 512) return QL_EHEAD;
    if (specwise_qllama_scratch_floats(shape, 1) < 0 || shape->layers < 1 || shape->layers > QMAX_DIM ||
        shape->hidden < 32 || shape->heads % shape->kv_heads || shape->head_dim < 2 || shape->head_dim % 2 ||
        (shape->heads + 2 * shape->kv_heads) * shape->head_dim > QMAX_DIM)
        return QL_EFIT;
    if (!layers->weights || !layers->attn_norm || !layers->mlp_norm || layers->n_weights != 7 * shape->layers)
        return QL_EFIT;
    const qarch *arch = layers->arch;
    if (arch && (arch->act < ACT_SILU || arch->act > ACT_GELU_TANH)) return QL_EFIT;
    const int64_t hidden = shape->hidden, q = shape->heads * shape->head_dim, kv = shape->kv_heads * shape->head_dim;
    const int64_t outs[7] = {q, kv, kv, hidden, shape->inter, shape->inter, hidden};
    const int64_t ins[7] = {hidden, hidden, hidden, q, hidden, hidden, shape->inter};
    for (int64_t l = 0; l < shape->layers; l++) {
        if (!layers->attn_norm[l] || !layers->mlp_norm[l]) return QL_EFIT;
        for (int j = 0; j < 7; j++)
            if (!mat_fits(layers->weights + 7 * l + j, outs[j], ins[j])) return QL_EFIT;
    }
    return QL_OK;
}

/* Whether a pass's rows, work buffers and options fit the (checked) shape: every row's cache there and its
 * position inside it and inside the rotary tables, and x, scratch and scores large enough. Returns 0, or QL_EFIT,
 * QL_EWORK, QL_EBUFFER. */
static int rows_check(const qshape *shape, const qrows *rows, const qwork *work, const qrun *run) {
    if (!rows || !work || !run) return QL_EFIT;
    if (rows->rows < 0 || rows->rows > QL_MAX_ROWS || run->threads < 1 || run->threads > 4096 ||
        (run->mode != MODE_EXACT && run->mode != MODE_Q8) || (rows->kv_half != 0 && rows->kv_half != 1))
        return QL_EFIT;
    const int64_t k = rows->rows;
    if (k == 0) return QL_OK;
    if (!rows->x || !rows->k_rows || !rows->v_rows || !rows->cap || !rows->pos || !rows->cos || !rows->sin ||
        !rows->cos_local != !rows->sin_local || !work->scratch || !work->scores)
        return QL_EFIT;
    int64_t end = 0;
    for (int64_t r = 0; r < k; r++) {
        if (!rows->k_rows[r] || !rows->v_rows[r] || rows->cap[r] < 1 || rows->cap[r] > QMAX_DIM || rows->pos[r] < 0 ||
            rows->pos[r] >= rows->cap[r])
            return QL_EFIT;
        end = rows->pos[r] + 1 > end ? rows->pos[r] + 1 : end;
    }
    if (end > rows->table_rows) return QL_EBUFFER;
    if (rows->x_floats < k * shape->hidden) return QL_EBUFFER;
    const int64_t scores = mul64(mul64(shape->heads, k), end);
    if (work->scratch_floats < specwise_qllama_scratch_floats(shape, k) || scores < 0 || work->scores_floats < scores)
        return QL_EWORK;
    return QL_OK;
}

/* The layers over a pass's rows, each with its own cache and position: row r is at position pos[r] of the
 * sequence whose caches start at k_rows[r] / v_rows[r] ([layers, n_kv, cap[r], hd]); it attends to positions
 * 0 .. pos[r] of that cache (kv_half: the caches hold float16, written rounded to nearest even, read back exactly).
 * The rows of one sequence come in order of position, and a row's earlier positions are in its cache or among the
 * rows before it in this pass: one pass scores several sequences' rows (a batch, ragged) and a row's result is the
 * same as in a pass of its own. The arguments are checked (layers_check, rows_check). */
static void layers_run(const qshape *shape, const qlayers *layers, const qrows *rows, const qwork *work,
                       const qrun *run) {
    const int n_layers = (int)shape->layers, hidden = (int)shape->hidden, n_kv = (int)shape->kv_heads;
    const int inter = (int)shape->inter, k = (int)rows->rows, threads = (int)run->threads, mode = run->mode;
    const int kv_half = rows->kv_half;
    const float eps = shape->eps;
    const float *const *attn_norm = layers->attn_norm, *const *qkv_b = layers->qkv_bias;
    const float *const *mlp_norm = layers->mlp_norm;
    const qmat *weights = layers->weights;
    float *const *k_rows = rows->k_rows, *const *v_rows = rows->v_rows;
    const int64_t *cap = rows->cap, *pos = rows->pos;
    const float *cos_t = rows->cos, *sin_t = rows->sin;
    float *x = rows->x, *scratch = work->scratch, *scores = work->scores;
    const qarch llama = {0};
    const qarch *a = layers->arch ? layers->arch : &llama;
    const int isa = specwise_q_isa();
    const int hd = (int)shape->head_dim, nq = (int)shape->heads, group = nq / n_kv;
    const int n_qkv = (nq + 2 * n_kv) * hd, n_attn = nq * hd;
    int end = 0;
    for (int r = 0; r < k; r++) end = (int)pos[r] + 1 > end ? (int)pos[r] + 1 : end;
    const float scale = a->attn_scale > 0.0f ? a->attn_scale : 1.0f / sqrtf((float)hd);
    float *h = scratch;                      /* [k, hidden] */
    float *tmp = h + (size_t)k * hidden;     /* [k, hidden] */
    float *qkv = tmp + (size_t)k * hidden;   /* [k, n_qkv] */
    float *attn = qkv + (size_t)k * n_qkv;   /* [k, n_attn] */
    float *gu = attn + (size_t)k * n_attn;   /* [k, 2 * inter] */
    float *act = gu + (size_t)k * 2 * inter; /* [k, inter] */

    double t_mark = g_timing ? now_s() : 0.0;
    for (int l = 0; l < n_layers; l++) {
        const qmat *w = weights + (size_t)7 * l;
        rms_norm_rows(x, attn_norm[l], h, k, hidden, eps);
        MARK(PART_REST);
        specwise_q_gemm(w, 3, h, qkv_b ? qkv_b[l] : NULL, qkv, k, mode, threads);
        MARK(PART_PRODUCTS);
        for (int r = 0; r < k; r++) {
            const int p = (int)pos[r];
            const size_t layer = (size_t)l * n_kv * cap[r] * hd;
            float *kc = k_rows[r] + layer, *vc = v_rows[r] + layer;
            uint16_t *kh = (uint16_t *)k_rows[r] + layer, *vh = (uint16_t *)v_rows[r] + layer;
            float *row = qkv + (size_t)r * n_qkv;
            const int local = a->window && a->window[l] > 0 && rows->cos_local;
            const float *c = (local ? rows->cos_local : cos_t) + (size_t)p * hd;
            const float *s = (local ? rows->sin_local : sin_t) + (size_t)p * hd;
            for (int j = 0; a->q_norm && j < nq; j++)
                rms_norm_rows(row + (size_t)j * hd, a->q_norm[l], row + (size_t)j * hd, 1, hd, eps);
            for (int j = nq; a->k_norm && j < nq + n_kv; j++)
                rms_norm_rows(row + (size_t)j * hd, a->k_norm[l], row + (size_t)j * hd, 1, hd, eps);
            for (int j = 0; j < nq + n_kv; j++) rotary(row + (size_t)j * hd, c, s, hd);
            for (int g = 0; g < n_kv; g++) {
                const size_t at = ((size_t)g * cap[r] + p) * hd;
                const float *key = row + (size_t)(nq + g) * hd, *val = row + (size_t)(nq + n_kv + g) * hd;
                if (kv_half) {
                    store_half(kh + at, key, hd, isa);
                    store_half(vh + at, val, hd, isa);
                } else {
                    memcpy(kc + at, key, (size_t)hd * 4);
                    memcpy(vc + at, val, (size_t)hd * 4);
                }
            }
        }
        MARK(PART_REST);
        /* tasks ordered by key-value head, then row, then query head, and split in contiguous ranges: a thread runs
         * the tasks that read the same keys and values one after the other, while they are in its cache; on AVX2 and
         * AVX-512 with heads of 64, up to three of its heads that share a key-value head and a row read them once */
#pragma omp parallel num_threads(threads)
        {
#ifdef _OPENMP
            const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
#else
            const int tid = 0, nth = 1;
#endif
            const int total = nq * k, lo = (int)((long long)total * tid / nth);
            const int hi = (int)((long long)total * (tid + 1) / nth);
            for (int t = lo; t < hi;) {
                const int g = t / (k * group), r = (t / group) % k, head = g * group + t % group;
                const int window = a->window ? a->window[l] : 0;
                const int p = (int)pos[r], first = window > 0 && p + 1 > window ? p + 1 - window : 0, len = p + 1 - first;
                int nh = 1;
#ifdef HAVE_JOINT
                if (isa >= ISA_AVX2 && hd == 64) {
                    nh = group - t % group;
                    nh = nh < hi - t ? nh : hi - t;
                    nh = nh < 3 ? nh : 3;
                }
#endif
                const size_t layer = (size_t)l * n_kv * cap[r] * hd;
                const float *q = qkv + (size_t)r * n_qkv + (size_t)head * hd;
                const size_t at = layer + ((size_t)g * cap[r] + first) * hd;
                const float *keys = k_rows[r] + at, *vals = v_rows[r] + at;
                const uint16_t *keys_h = (const uint16_t *)k_rows[r] + at, *vals_h = (const uint16_t *)v_rows[r] + at;
                float *sc = scores + (size_t)t * end;
                float *out = attn + (size_t)r * n_attn + (size_t)head * hd;
#ifdef HAVE_JOINT
                if (nh > 1 && isa >= ISA_AVX512) {
                    if (kv_half) {
                        if (nh == 3) key_scores_h_j3(q, keys_h, len, scale, sc, end);
                        else key_scores_h_j2(q, keys_h, len, scale, sc, end);
                    } else {
                        if (nh == 3) key_scores_j3(q, keys, len, scale, sc, end);
                        else key_scores_j2(q, keys, len, scale, sc, end);
                    }
                } else if (nh > 1) {
                    if (kv_half) {
                        if (nh == 3) key_scores_h256_j3(q, keys_h, len, scale, sc, end);
                        else key_scores_h256_j2(q, keys_h, len, scale, sc, end);
                    } else {
                        if (nh == 3) key_scores256_j3(q, keys, len, scale, sc, end);
                        else key_scores256_j2(q, keys, len, scale, sc, end);
                    }
                }
#endif
                float sums[3];
                for (int h = 0; h < nh; h++) {
                    if (nh == 1) {
                        if (kv_half)
                            key_scores_h(q, keys_h, len, hd, scale, sc, isa);
                        else
                            key_scores(q, keys, len, hd, scale, sc, isa);
                    }
                    sums[h] = softmax_unnormalised(sc + (size_t)h * end, len, isa);
                }
#ifdef HAVE_JOINT
                if (nh > 1 && isa >= ISA_AVX512) {
                    if (kv_half) {
                        if (nh == 3) weighted_values_h_j3(sc, end, vals_h, len, out);
                        else weighted_values_h_j2(sc, end, vals_h, len, out);
                    } else {
                        if (nh == 3) weighted_values_j3(sc, end, vals, len, out);
                        else weighted_values_j2(sc, end, vals, len, out);
                    }
                } else if (nh > 1) {
                    if (kv_half) {
                        if (nh == 3) weighted_values_h256_j3(sc, end, vals_h, len, out);
                        else weighted_values_h256_j2(sc, end, vals_h, len, out);
                    } else {
                        if (nh == 3) weighted_values256_j3(sc, end, vals, len, out);
                        else weighted_values256_j2(sc, end, vals, len, out);
                    }
                }
#endif
                if (nh == 1) {
                    if (kv_half)
                        weighted_values_h(sc, vals_h, len, hd, out, isa);
                    else
                        weighted_values(sc, vals, len, hd, out, isa);
                }
                for (int h = 0; h < nh; h++) {
                    const float inv = 1.0f / sums[h];
                    for (int d = 0; d < hd; d++) out[(size_t)h * hd + d] *= inv;
                }
                t += nh;
            }
        }
        MARK(PART_ATTENTION);
        specwise_q_gemm(w + 3, 1, attn, NULL, tmp, k, mode, threads);
        MARK(PART_PRODUCTS);
        if (a->post_attn_norm) rms_norm_rows(tmp, a->post_attn_norm[l], tmp, k, hidden, eps);
        for (size_t i = 0; i < (size_t)k * hidden; i++) x[i] += tmp[i];
        rms_norm_rows(x, mlp_norm[l], h, k, hidden, eps);
        MARK(PART_REST);
        specwise_q_gemm(w + 4, 2, h, NULL, gu, k, mode, threads);
        MARK(PART_PRODUCTS);
        for (int r = 0; r < k; r++) {
            const float *gr = gu + (size_t)r * 2 * inter;
            if (a->act == ACT_GELU_TANH)
                gelu_tanh_mul(gr, gr + inter, act + (size_t)r * inter, inter, isa);
            else
                silu_mul(gr, gr + inter, act + (size_t)r * inter, inter, isa);
        }
        MARK(PART_REST);
        specwise_q_gemm(w + 6, 1, act, NULL, tmp, k, mode, threads);
        MARK(PART_PRODUCTS);
        if (a->post_mlp_norm) rms_norm_rows(tmp, a->post_mlp_norm[l], tmp, k, hidden, eps);
        for (size_t i = 0; i < (size_t)k * hidden; i++) x[i] += tmp[i];
    }
    MARK(PART_REST);
}

/* The layers over a pass's rows (layers_run). Returns 0, or a status of specwise.h (1, 5, 6, 7), checked before
 * anything is written. */
int specwise_qllama_rows(const qshape *shape, const qlayers *layers, const qrows *rows, const qwork *work,
                         const qrun *run) {
    int status = layers_check(shape, layers);
    if (status == QL_OK) status = rows_check(shape, rows, work, run);
    if (status != QL_OK) return status;
    if (rows->rows > 0) layers_run(shape, layers, rows, work, run);
    return QL_OK;
}

/* The RMS norm of k rows of n (the layers' own): the final norm of both the single-sequence pass below and a batch's
 * pass (quantized.py), so that a row's logits do not depend on which of the two computed them. */
void specwise_rms_norm_rows(const float *x, const float *w, float *y, int k, int n, float eps) {
    rms_norm_rows(x, w, y, k, n, eps);
}

/* One sequence's whole pass in one call, so that nothing of the interpreter's runs between its parts (after the
 * weights have gone through the caches, every interpreted operation starts cold): the embedding rows of the pass's
 * ids into rows->x, the layers (specwise_qllama_rows), the final norm (of every row into pass->features when it is
 * not NULL, else of the last `keep` rows only) and the output layer over the last `keep` rows into
 * pass->logits [keep][head->out]. Returns 0, or a status of specwise.h: 1, 5, 6, 7 as specwise_qllama_rows (and 5
 * for an embedding of another width or a keep outside 0 .. rows, 7 for features or logits smaller than they
 * need), 2 when an id is outside the embedding (or it is not a readable matrix), 4 when the output layer is not;
 * all but 4 are found before anything is written. */
int specwise_qllama_forward(const qshape *shape, const qlayers *layers, const qrows *rows, const qwork *work,
                            const qrun *run, const qmodel *model, const qpass *pass) {
    int status = layers_check(shape, layers);
    if (status == QL_OK) status = rows_check(shape, rows, work, run);
    if (status != QL_OK) return status;
    if (!model || !pass || !model->final_norm || !mat_fits(model->embed, 0, shape->hidden)) return QL_EFIT;
    const int64_t k = rows->rows, keep = pass->keep, hidden = shape->hidden;
    if (keep < 0 || keep > k || (k && !pass->ids)) return QL_EFIT;
    if (keep > 0 && !mat_fits(model->head, 0, hidden)) return QL_EOUTPUT;
    if (pass->features && pass->features_floats < k * hidden) return QL_EBUFFER;
    if (keep > 0 && (!pass->logits || pass->logits_floats / keep < model->head->out)) return QL_EBUFFER;
    if (k == 0) return QL_OK;
    float *x = rows->x, *scratch = work->scratch;
    if (specwise_q_gather(model->embed, pass->ids, k, x) != SW_OK) return QL_EIDS;
    const qarch *arch = layers->arch;
    if (arch && arch->embed_scale != 0.0f && arch->embed_scale != 1.0f)
        for (size_t i = 0; i < (size_t)k * hidden; i++) x[i] *= arch->embed_scale;
    layers_run(shape, layers, rows, work, run);
    const float *h = scratch; /* the layers' scratch is free again */
    if (pass->features) {
        rms_norm_rows(x, model->final_norm, pass->features, (int)k, (int)hidden, model->final_eps);
        h = pass->features + (size_t)(k - keep) * hidden;
    } else if (keep > 0) {
        rms_norm_rows(x + (size_t)(k - keep) * hidden, model->final_norm, scratch, (int)keep, (int)hidden,
                      model->final_eps);
    }
    if (keep > 0 &&
        specwise_q_gemm(model->head, 1, h, NULL, pass->logits, (int)keep, run->mode, (int)run->threads) != SW_OK)
        return QL_EOUTPUT;
    return QL_OK;
}

/* Rows of one head step, and the floats of its scratch ahead of the layer kernel's: the fused input [64][2 hidden]
 * and x [64][hidden]. */
#define HEAD_ROWS 64
#define HEAD_INPUTS(hidden) ((int64_t)3 * HEAD_ROWS * (hidden))

/* One call of a draft head (one decoder layer over the target's features, specwise/drafters/head): for n <= 64
 * positions at start .. start + n - 1 of its cache ([kv_heads][cap][head_dim], float32), the fused input
 * [feature norm(f_r), embed norm(e_r)] -> fc -> the layer -> out norm, written to step->pred [n][hidden]; with
 * out->out_w, also the output layer over the last row into out->logits [out_w->out], its argmax into *best and,
 * when top_prob is not NULL, the softmax's largest probability there (1 / sum of exp(l - max)). shape: one layer;
 * work->scratch: HEAD_INPUTS(hidden) floats plus the layer kernel's scratch for n rows (and at least out_w->out
 * with top_prob); scores: heads * n * (start + n) floats. Returns 0; 1 when head_dim is too large, 2 when n is
 * outside 1..64, 3 when the logits hold a NaN, 5 when the shapes, pointers or positions do not fit, 6 when the
 * scratch or scores are too small, 7 when the logits or the rotary tables are; all but 3 found before anything is
 * written. */
int specwise_head_step(const qshape *shape, const qlayers *layer, const qhead *head, const qstep *step,
                       const qwork *work, const qrun *run, const qlogits *out) {
    if (!step || !head || !work || !run) return QL_EFIT;
    const int64_t n = step->n;
    if (n <= 0 || n > HEAD_ROWS) return QL_EIDS;
    int status = layers_check(shape, layer);
    if (status != QL_OK) return status;
    const int64_t hidden = shape->hidden;
    if (shape->layers != 1 || !mat_fits(head->fc, hidden, 2 * hidden) || !head->feature_norm || !head->embed_norm ||
        !head->out_norm || !step->features || !step->emb || !step->pred || !step->k_cache || !step->v_cache)
        return QL_EFIT;
    if (step->start < 0 || step->cap < 1 || step->cap > QMAX_DIM || step->start > step->cap - n) return QL_EFIT;
    const qmat *out_w = out ? out->out_w : NULL;
    if (out_w && (!mat_fits(out_w, 0, hidden) || !out->best)) return QL_EFIT;
    if (out_w && (!out->logits || out->logits_floats < out_w->out)) return QL_EBUFFER;
    if (work->scratch_floats < HEAD_INPUTS(hidden) || !work->scratch) return QL_EWORK;
    float *fused = work->scratch, *x = fused + (size_t)HEAD_ROWS * 2 * hidden;
    float *layer_scratch = x + (size_t)HEAD_ROWS * hidden;
    const int64_t layer_floats = work->scratch_floats - HEAD_INPUTS(hidden);
    if (out_w && out->top_prob && layer_floats < out_w->out) return QL_EWORK;
    float *k_rows[HEAD_ROWS], *v_rows[HEAD_ROWS];
    int64_t caps[HEAD_ROWS], pos[HEAD_ROWS];
    for (int64_t r = 0; r < n; r++) {
        k_rows[r] = step->k_cache;
        v_rows[r] = step->v_cache;
        caps[r] = step->cap;
        pos[r] = step->start + r;
    }
    const qrows rows = {x, HEAD_ROWS * hidden, n, k_rows, v_rows, caps, pos, step->cos, step->sin, NULL, NULL,
                        step->table_rows, 0};
    const qwork inner = {layer_scratch, layer_floats, work->scores, work->scores_floats};
    status = rows_check(shape, &rows, &inner, run);
    if (status != QL_OK) return status;
    const int hd = (int)hidden, threads = (int)run->threads;
    for (int r = 0; r < n; r++) {
        rms_norm_rows(step->features + (size_t)r * hd, head->feature_norm, fused + (size_t)r * 2 * hd, 1, hd,
                      shape->eps);
        rms_norm_rows(step->emb + (size_t)r * hd, head->embed_norm, fused + (size_t)r * 2 * hd + hd, 1, hd,
                      shape->eps);
    }
    specwise_q_gemm(head->fc, 1, fused, NULL, x, (int)n, run->mode, threads);
    layers_run(shape, layer, &rows, &inner, run);
    rms_norm_rows(x, head->out_norm, step->pred, (int)n, hd, shape->eps);
    if (!out_w) return QL_OK;
    const int V = out_w->out;
    specwise_q_gemm(out_w, 1, step->pred + (size_t)(n - 1) * hd, NULL, out->logits, 1, run->mode, threads);
    if (specwise_logits_scan(out->logits, 1, V, out->best) & 1) return QL_ENAN;
    if (out->top_prob) { /* exp(l - max) summed over a copy (the scores' own loop); exp(0) = 1 is the top's share */
        float *e = layer_scratch;
        memcpy(e, out->logits, (size_t)V * sizeof(float));
        *out->top_prob = 1.0f / softmax_unnormalised(e, V, specwise_q_isa());
    }
    return QL_OK;
}
