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

size_t specwise_qllama_scratch_floats(int hidden, int n_heads, int n_kv, int head_dim, int inter, int k) {
    size_t qkv = (size_t)(n_heads + 2 * n_kv) * head_dim;
    return (size_t)k * (2 * (size_t)hidden + qkv + (size_t)n_heads * head_dim + 3 * (size_t)inter);
}

/* Whether the layers' arguments fit together: a shape with heads in whole groups and an even head width, every
 * layer's seven matrices of the shapes it gives (q, k, v, o, gate, up, down, in tiles the kernels read), and every
 * row's position inside its cache. */
static int rows_fit(int n_layers, int hidden, int n_heads, int n_kv, int head_dim, int inter, const qmat *weights,
                    const int *cap, const int *pos, int k) {
    if (n_layers < 1 || hidden < 32 || n_heads < 1 || n_kv < 1 || n_heads % n_kv || head_dim < 2 || head_dim % 2 ||
        inter < 1 || k < 0 || !weights || (k && (!cap || !pos)))
        return 0;
    const int q = n_heads * head_dim, kv = n_kv * head_dim;
    const int outs[7] = {q, kv, kv, hidden, inter, inter, hidden}, ins[7] = {hidden, hidden, hidden, q, hidden,
                                                                             hidden, inter};
    for (int l = 0; l < n_layers; l++)
        for (int j = 0; j < 7; j++) {
            const qmat *w = weights + (size_t)7 * l + j;
            if (w->out != outs[j] || w->in != ins[j] || !w->q) return 0;
        }
    for (int r = 0; r < k; r++)
        if (pos[r] < 0 || pos[r] >= cap[r]) return 0;
    return 1;
}

/* The layers over k rows, each with its own cache and position: row r is at position pos[r] of the sequence
 * whose caches start at k_rows[r] / v_rows[r] ([layers, n_kv, cap[r], hd]); it attends to positions 0 .. pos[r] of
 * that cache (kv_half: the caches hold float16, written rounded to nearest even, read back exactly). The rows of one
 * sequence come in order of position, and a row's earlier positions are in its cache
 * or among the rows before it in this pass: one pass scores several sequences' rows (a batch, ragged) and a row's
 * result is the same as in a pass of its own. scores: at least n_heads * k * max(pos + 1) floats.
 * Returns 0 on success, 1 when head_dim is too large, 5 when the shape, a weight or a row's position does not fit
 * (checked before anything is written: see rows_fit). */
int specwise_qllama_rows(int n_layers, int hidden, int n_heads, int n_kv, int head_dim, int inter, float eps,
                         const float *const *attn_norm, const qmat *weights, const float *const *qkv_b,
                         const float *const *mlp_norm, float *const *k_rows, float *const *v_rows, const int *cap,
                         const int *pos, const float *cos_t, const float *sin_t, float *x, int k, float *scratch,
                         float *scores, int threads, int mode, int kv_half, const qarch *arch) {
    if (head_dim > 512) return 1;
    if (!rows_fit(n_layers, hidden, n_heads, n_kv, head_dim, inter, weights, cap, pos, k)) return 5;
    if (arch && (arch->act < ACT_SILU || arch->act > ACT_GELU_TANH)) return 5;
    const qarch llama = {0};
    const qarch *a = arch ? arch : &llama;
    const int isa = specwise_q_isa();
    const int hd = head_dim, nq = n_heads, group = n_heads / n_kv;
    const int n_qkv = (nq + 2 * n_kv) * hd, n_attn = nq * hd;
    int end = 0;
    for (int r = 0; r < k; r++) end = pos[r] + 1 > end ? pos[r] + 1 : end;
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
        specwise_q_gemm(w, 3, h, qkv_b[l], qkv, k, mode, threads);
        MARK(PART_PRODUCTS);
        for (int r = 0; r < k; r++) {
            const int p = pos[r];
            const size_t layer = (size_t)l * n_kv * cap[r] * hd;
            float *kc = k_rows[r] + layer, *vc = v_rows[r] + layer;
            uint16_t *kh = (uint16_t *)k_rows[r] + layer, *vh = (uint16_t *)v_rows[r] + layer;
            float *row = qkv + (size_t)r * n_qkv;
            const int local = a->window && a->window[l] > 0 && a->cos_local;
            const float *c = (local ? a->cos_local : cos_t) + (size_t)p * hd;
            const float *s = (local ? a->sin_local : sin_t) + (size_t)p * hd;
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
                const int first = window > 0 && pos[r] + 1 > window ? pos[r] + 1 - window : 0, len = pos[r] + 1 - first;
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
    return 0;
}

/* The RMS norm of k rows of n (the layers' own): the final norm of both the single-sequence pass below and a batch's
 * pass (quantized.py), so that a row's logits do not depend on which of the two computed them. */
void specwise_rms_norm_rows(const float *x, const float *w, float *y, int k, int n, float eps) {
    rms_norm_rows(x, w, y, k, n, eps);
}

/* One sequence's whole pass in one call, so that nothing of the interpreter's runs between its parts (after the
 * weights have gone through the caches, every interpreted operation starts cold): the embedding rows of ids[0 .. k
 * - 1] into x, the layers (specwise_qllama_rows, same arguments), the final norm (of every row into features[k][hidden]
 * when features is not NULL, else of the last `keep` rows only) and the output layer over the last `keep` rows into
 * logits[keep][head->out]. Returns 0, 1 when head_dim is too large, 2 when an id is outside the embedding (or it is
 * not a readable matrix), 4 when the output layer is not. */
int specwise_qllama_forward(int n_layers, int hidden, int n_heads, int n_kv, int head_dim, int inter, float eps,
                            const float *const *attn_norm, const qmat *weights, const float *const *qkv_b,
                            const float *const *mlp_norm, float *const *k_rows, float *const *v_rows, const int *cap,
                            const int *pos, const float *cos_t, const float *sin_t, float *x, int k, float *scratch,
                            float *scores, int threads, int mode, int kv_half, const qarch *arch, const qmat *embed,
                            const int64_t *ids, const float *final_norm, float final_eps, int keep, float *features,
                            const qmat *head, float *logits) {
    if (specwise_q_gather(embed, ids, k, x) != SW_OK) return 2;
    if (arch && arch->embed_scale != 0.0f && arch->embed_scale != 1.0f)
        for (size_t i = 0; i < (size_t)k * hidden; i++) x[i] *= arch->embed_scale;
    const int status = specwise_qllama_rows(n_layers, hidden, n_heads, n_kv, head_dim, inter, eps, attn_norm, weights,
                                            qkv_b, mlp_norm, k_rows, v_rows, cap, pos, cos_t, sin_t, x, k, scratch,
                                            scores, threads, mode, kv_half, arch);
    if (status != 0) return status;
    const float *h = scratch; /* the layers' scratch is free again */
    if (features) {
        rms_norm_rows(x, final_norm, features, k, hidden, final_eps);
        h = features + (size_t)(k - keep) * hidden;
    } else if (keep > 0) {
        rms_norm_rows(x + (size_t)(k - keep) * hidden, final_norm, scratch, keep, hidden, final_eps);
    }
    if (keep > 0 && specwise_q_gemm(head, 1, h, NULL, logits, keep, mode, threads) != SW_OK) return 4;
    return 0;
}

/* One call of a draft head (one decoder layer over the target's features, specwise/drafters/head): for n <= 64
 * positions at start .. start + n - 1 of its cache ([n_kv][cap][hd], float32), the fused input [feature norm(f_r),
 * embed norm(e_r)] -> fc -> the layer -> out norm, written to pred[n][hidden]; with out_w, also the output layer over
 * the last row into logits[out_w->out], its argmax into *best and, when top_prob is not NULL, the softmax's largest
 * probability there (1 / sum of exp(l - max)). scratch: the layer kernel's scratch for 64 rows plus 3 * 64 * hidden
 * floats (and at least out_w->out); scores: n_heads * n * (start + n) floats. Returns 0; 1 when head_dim is too
 * large, 2 when n is outside 1..64, 3 when the logits hold a NaN, 5 when the shapes or positions do not fit. */
int specwise_head_step(int hidden, int n_heads, int n_kv, int head_dim, int inter, float eps, const float *attn_norm,
                       const qmat *weights, const float *mlp_norm, float *k_cache, float *v_cache, int cap, int start,
                       const float *cos_t, const float *sin_t, const float *features, const float *emb, int n,
                       const float *feature_norm, const float *embed_norm, const qmat *fc, const float *out_norm,
                       float *pred, float *scratch, float *scores, int threads, const qmat *out_w, float *logits,
                       int64_t *best, float *top_prob) {
    if (n <= 0 || n > 64) return 2;
    if (!fc || fc->out != hidden || fc->in != 2 * hidden || start < 0 || cap < 1 || start > cap - n) return 5;
    float *fused = scratch, *x = fused + (size_t)64 * 2 * hidden, *layer_scratch = x + (size_t)64 * hidden;
    for (int r = 0; r < n; r++) {
        rms_norm_rows(features + (size_t)r * hidden, feature_norm, fused + (size_t)r * 2 * hidden, 1, hidden, eps);
        rms_norm_rows(emb + (size_t)r * hidden, embed_norm, fused + (size_t)r * 2 * hidden + hidden, 1, hidden, eps);
    }
    specwise_q_gemm(fc, 1, fused, NULL, x, n, MODE_Q8, threads);
    float *k_rows[64], *v_rows[64];
    int caps[64], pos[64];
    for (int r = 0; r < n; r++) {
        k_rows[r] = k_cache;
        v_rows[r] = v_cache;
        caps[r] = cap;
        pos[r] = start + r;
    }
    const float *qkv_b = NULL;
    const int status = specwise_qllama_rows(1, hidden, n_heads, n_kv, head_dim, inter, eps, &attn_norm, weights, &qkv_b,
                                            &mlp_norm, k_rows, v_rows, caps, pos, cos_t, sin_t, x, n, layer_scratch,
                                            scores, threads, MODE_Q8, 0, NULL);
    if (status != 0) return status;
    rms_norm_rows(x, out_norm, pred, n, hidden, eps);
    if (!out_w) return 0;
    const int V = out_w->out;
    specwise_q_gemm(out_w, 1, pred + (size_t)(n - 1) * hidden, NULL, logits, 1, MODE_Q8, threads);
    if (specwise_logits_scan(logits, 1, V, best) & 1) return 3; /* NaN */
    if (top_prob) { /* exp(l - max) summed over a copy (the scores' own loop); exp(0) = 1 is the top's share */
        float *e = layer_scratch;
        memcpy(e, logits, (size_t)V * sizeof(float));
        *top_prob = 1.0f / softmax_unnormalised(e, V, specwise_q_isa());
    }
    return 0;
}
