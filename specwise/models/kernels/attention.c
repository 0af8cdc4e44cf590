/*
 * Causal attention of the decoder layers (qllama.c) over each row's own cache: the scores of a query head
 * against the keys, their softmax (unnormalised, with the sum), and the probabilities' weighted sum of the values,
 * for a cache of float32 and one of float16 (kv_half), and for up to three query heads that share a key-value head
 * in one pass over its keys and values (heads of 64 on AVX2 and AVX-512).
 *
 * Each path's loops are in its table (attn_portable, attn_avx2, attn_avx512), which the library's table of the
 * path in use holds (qkernels.attn: quant_gemm.c's one choice, specwise_q_set_isa); each vector function carries
 * its own target attribute. Every path computes each score, probability and output element
 * with the same operations in the same order (fused multiply-adds written out, sums over eight lanes added
 * pairwise), so the portable, AVX2 and AVX-512 paths agree bit for bit.
 */
#include "specwise.h"

#include "qllama_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef SPECWISE_X86
#define T256 TARGET_AVX2
#define T512 TARGET_AVX512

T256 static int softmax_exp8(float *sc, int len, float mx, float *a) {
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

T256 static inline float hsum8(__m256 acc) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
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

#ifdef SPECWISE_X86
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

static float max_portable(const float *sc, int len) {
    float mx = -INFINITY;
    for (int j = 0; j < len; j++) mx = sc[j] > mx ? sc[j] : mx;
    return mx;
}

static int exp_sums_portable(float *sc, int len, float mx, float *a) {
    (void)sc, (void)len, (void)mx, (void)a;
    return 0; /* the loop below does it all */
}

/* Scores to unnormalised probabilities in place; returns their sum (eight partial sums, added pairwise). */
float softmax_unnormalised(float *sc, int len, const struct attn_ops *ops) {
    const float mx = ops->max(sc, len);
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = ops->exp_sums(sc, len, mx, a);
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

/* The portable loops for both caches (the vector loops' operations, lane by lane); LOAD1(p) gives the float at p. */
#define F32_1(p) (*(p))
#define F16_1(p) half_to_float(*(p))
#define ATTENTION(SUFFIX, T, LOAD1)                                                                                \
    /* sc[j] = (q . keys[j]) * scale: eight lanes (d mod 8) of fused multiply-adds, then added pairwise */       \
    static void key_scores##SUFFIX(const float *q, const void *keys_, int len, int hd, float scale, float *sc) {  \
        const T *keys = keys_;                                                                                   \
        for (int j = 0; j < len; j++) {                                                                          \
            const T *kj = keys + (size_t)j * hd;                                                                 \
            float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                               \
            for (int d = 0; d < hd; d += 8)                                                                      \
                for (int l = 0; l < 8 && d + l < hd; l++) a[l] = fmaf(q[d + l], LOAD1(kj + d + l), a[l]);          \
            float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];                        \
            t0 = t0 + t2;                                                                                        \
            t1 = t1 + t3;                                                                                        \
            sc[j] = (t0 + t1) * scale;                                                                           \
        }                                                                                                        \
    }                                                                                                            \
    /* out[d] = sum_j p[j] v[j][d] in increasing j, from zero */                                                  \
    static void weighted_values##SUFFIX(const float *p, const void *vals_, int len, int hd, float *out) {        \
        const T *vals = vals_;                                                                                   \
        for (int d = 0; d < hd; d++) out[d] = 0.0f;                                                              \
        for (int j = 0; j < len; j++) {                                                                          \
            const float pj = p[j];                                                                               \
            const T *v = vals + (size_t)j * hd;                                                                  \
            for (int d = 0; d < hd; d++) out[d] = fmaf(pj, LOAD1(v + d), out[d]);                                \
        }                                                                                                        \
    }
ATTENTION(_f, float, F32_1)
ATTENTION(_h, uint16_t, F16_1)
#undef ATTENTION

const struct attn_ops attn_portable = {
    .key_scores = {key_scores_f, key_scores_h},
    .weighted_values = {weighted_values_f, weighted_values_h},
    .max = max_portable,
    .exp_sums = exp_sums_portable,
};

#ifdef SPECWISE_X86
/* Each vector path's entries: its loops where the head width suits them, else the portable ones (the same
 * numbers). */
#define VECTOR_ENTRIES(SUFFIX, T)                                                                                  \
    static void key_scores##SUFFIX##_x86(const float *q, const void *keys, int len, int hd, float scale,          \
                                          float *sc) {                                                           \
        if (hd % 8 == 0)                                                                                         \
            key_scores##SUFFIX##256(q, (const T *)keys, len, hd, scale, sc);                                     \
        else                                                                                                     \
            key_scores##SUFFIX##_p(q, keys, len, hd, scale, sc);                                                 \
    }                                                                                                            \
    static void weighted_values##SUFFIX##_avx2(const float *p, const void *vals, int len, int hd, float *out) {   \
        if (hd % 8 == 0 && hd <= 256)                                                                            \
            weighted_values##SUFFIX##256(p, (const T *)vals, len, hd, out);                                      \
        else                                                                                                     \
            weighted_values##SUFFIX##_p(p, vals, len, hd, out);                                                  \
    }                                                                                                            \
    static void weighted_values##SUFFIX##_avx512(const float *p, const void *vals, int len, int hd, float *out) { \
        if (hd % 16 == 0 && hd <= 256)                                                                           \
            weighted_values##SUFFIX##512(p, (const T *)vals, len, hd, out);                                      \
        else                                                                                                     \
            weighted_values##SUFFIX##_avx2(p, vals, len, hd, out);                                               \
    }
#define key_scores_p key_scores_f
#define key_scores_h_p key_scores_h
#define weighted_values_p weighted_values_f
#define weighted_values_h_p weighted_values_h
VECTOR_ENTRIES(, float)
VECTOR_ENTRIES(_h, uint16_t)
#undef VECTOR_ENTRIES

/* the joint loops behind the table's pointer types (keys and values by their address) */
#define JOINT_ENTRIES(NAME, T)                                                                                     \
    static void joint##NAME##_s(const float *q, const void *keys, int len, float scale, float *sc, size_t ld) {          \
        key_scores##NAME(q, (const T *)keys, len, scale, sc, ld);                                                \
    }                                                                                                            \
    static void joint##NAME##_v(const float *p, size_t ld, const void *vals, int len, float *out) {                      \
        weighted_values##NAME(p, ld, (const T *)vals, len, out);                                                 \
    }
JOINT_ENTRIES(_j2, float)
JOINT_ENTRIES(_j3, float)
JOINT_ENTRIES(_h_j2, uint16_t)
JOINT_ENTRIES(_h_j3, uint16_t)
JOINT_ENTRIES(256_j2, float)
JOINT_ENTRIES(256_j3, float)
JOINT_ENTRIES(_h256_j2, uint16_t)
JOINT_ENTRIES(_h256_j3, uint16_t)
#undef JOINT_ENTRIES

const struct attn_ops attn_avx2 = {
    .key_scores = {key_scores_x86, key_scores_h_x86},
    .weighted_values = {weighted_values_avx2, weighted_values_h_avx2},
    .joint_scores = {{joint256_j2_s, joint256_j3_s}, {joint_h256_j2_s, joint_h256_j3_s}},
    .joint_values = {{joint256_j2_v, joint256_j3_v}, {joint_h256_j2_v, joint_h256_j3_v}},
    .max = max8,
    .exp_sums = softmax_exp8,
};

const struct attn_ops attn_avx512 = {
    .key_scores = {key_scores_x86, key_scores_h_x86},
    .weighted_values = {weighted_values_avx512, weighted_values_h_avx512},
    .joint_scores = {{joint_j2_s, joint_j3_s}, {joint_h_j2_s, joint_h_j3_s}},
    .joint_values = {{joint_j2_v, joint_j3_v}, {joint_h_j2_v, joint_h_j3_v}},
    .max = max8,
    .exp_sums = softmax_exp8,
};
#endif

/* Causal attention of layer l for every row of a pass: each query head of row r over positions first .. pos[r] of
 * the row's cache (first = 0, or with window > 0 the last `window` positions), from the rotated queries in qkv
 * [rows][(heads + 2 kv_heads) hd] into attn [rows][heads hd]; scores: heads * rows * end floats, end the largest
 * position + 1. The caches hold this layer's keys and values of every row already. ops: the path's loops. */
void attention_layer(const qrows *rows, int l, int nq, int n_kv, int hd, int window, float scale, const float *qkv,
                     float *attn, float *scores, int end, int threads, const struct attn_ops *ops) {
    const int k = (int)rows->rows, group = nq / n_kv, kv_half = rows->kv_half;
    const int n_qkv = (nq + 2 * n_kv) * hd, n_attn = nq * hd;
    const size_t elem = kv_half ? sizeof(uint16_t) : sizeof(float);
    const int joint = hd == 64 && ops->joint_scores[kv_half][0] != NULL;
    float *const *k_rows = rows->k_rows, *const *v_rows = rows->v_rows;
    const int64_t *cap = rows->cap, *pos = rows->pos;
    /* tasks ordered by key-value head, then row, then query head, and split in contiguous ranges: a thread runs
     * the tasks that read the same keys and values one after the other, while they are in its cache; where the path
     * has joint loops (heads of 64), up to three of its heads that share a key-value head and a row read them once */
#pragma omp parallel num_threads(threads)
    {
        int lo, hi;
        thread_share(nq * k, &lo, &hi);
        for (int t = lo; t < hi;) {
            const int g = t / (k * group), r = (t / group) % k, head = g * group + t % group;
            const int p = (int)pos[r], first = window > 0 && p + 1 > window ? p + 1 - window : 0, len = p + 1 - first;
            int nh = 1;
            if (joint) {
                nh = group - t % group;
                nh = nh < hi - t ? nh : hi - t;
                nh = nh < 3 ? nh : 3;
            }
            const size_t layer = (size_t)l * n_kv * cap[r] * hd;
            const float *q = qkv + (size_t)r * n_qkv + (size_t)head * hd;
            const size_t at = (layer + ((size_t)g * cap[r] + first) * hd) * elem;
            const void *keys = (const char *)k_rows[r] + at, *vals = (const char *)v_rows[r] + at;
            float *sc = scores + (size_t)t * end;
            float *out = attn + (size_t)r * n_attn + (size_t)head * hd;
            if (nh > 1) ops->joint_scores[kv_half][nh - 2](q, keys, len, scale, sc, end);
            float sums[3];
            for (int h = 0; h < nh; h++) {
                if (nh == 1) ops->key_scores[kv_half](q, keys, len, hd, scale, sc);
                sums[h] = softmax_unnormalised(sc + (size_t)h * end, len, ops);
            }
            if (nh > 1)
                ops->joint_values[kv_half][nh - 2](sc, end, vals, len, out);
            else
                ops->weighted_values[kv_half](sc, vals, len, hd, out);
            for (int h = 0; h < nh; h++) {
                const float inv = 1.0f / sums[h];
                for (int d = 0; d < hd; d++) out[(size_t)h * hd + d] *= inv;
            }
            t += nh;
        }
    }
}
