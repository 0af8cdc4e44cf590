/*
 * Causal attention of the decoder layers (qllama.c) over each row's own cache: the scores of a query head
 * against the keys, their softmax (unnormalised, with the sum), and the probabilities' weighted sum of the values,
 * for a cache of float32 and one of float16 (kv_half), and for up to three query heads that share a key-value head
 * in one pass over its keys and values (heads of 64 on AVX2 and AVX-512); and, as the layers' option on CPUs with
 * AVX512_BF16, tiled loops in bfloat16 (attention_tile_bf16) that every pass runs.
 *
 * Each path's loops are in its table (attn_portable, attn_avx2, attn_avx512), which the library's table of the
 * path in use holds (qkernels.attn: quant_gemm.c's one choice, specwise_q_set_isa); each vector function carries
 * its own target attribute. Every path computes each score, probability and output element
 * with the same operations in the same order (fused multiply-adds written out, sums over eight lanes added
 * pairwise), so the portable, AVX2 and AVX-512 paths agree bit for bit.
 *
 * One file because those paths, the one-row loops and the tiled loops of multi-row passes must compute every number
 * with the same operations in the same order: they are read and changed side by side.
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

/* softmax_exp8 continued from the lane sums in a (the tiled loops' blocks) */
T256 static void exp_lanes8(float *sc, int n8, float mx, float *a) {
    __m256 acc = _mm256_loadu_ps(a), m = _mm256_set1_ps(mx);
    for (int j = 0; j + 8 <= n8; j += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + j), m));
        _mm256_storeu_ps(sc + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(a, acc);
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

static void exp_lanes_portable(float *sc, int n8, float mx, float *a) {
    for (int j = 0; j + 8 <= n8; j += 8)
        for (int l = 0; l < 8; l++) {
            sc[j + l] = exp_approx(sc[j + l] - mx);
            a[l] += sc[j + l];
        }
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

/* ---- the tiled loops (attention_tile below): every task of a tile over one block of positions at a time ---- */

/* the block indexes [*a, *b) of positions j0 .. j0 + nb - 1 that task t attends to (empty: *a >= *b) */
static inline void task_span(const struct attn_task *t, int j0, int nb, int *a, int *b) {
    const int lo = t->first - j0, hi = t->last - j0;
    *a = lo > 0 ? lo : 0;
    *b = hi < nb ? hi : nb;
}

/* keys [nb][hd] to kt[d * kb + j] (zeros past nb) */
#define TILE_KEYS(SUFFIX, T, LOAD1)                                                                                \
    static void tile_keys##SUFFIX(const void *keys_, int nb, int hd, float *kt, int kb) {                      \
        const T *keys = keys_;                                                                                   \
        for (int d = 0; d < hd; d++) {                                                                           \
            float *row = kt + (size_t)d * kb;                                                                    \
            for (int j = 0; j < nb; j++) row[j] = LOAD1(keys + (size_t)j * hd + d);                               \
            for (int j = nb; j < kb; j++) row[j] = 0.0f;                                                         \
        }                                                                                                        \
    }
TILE_KEYS(_f, float, F32_1)
TILE_KEYS(_h, uint16_t, F16_1)
#undef TILE_KEYS

/* key_scores' chain for 16 keys at a time (kt's columns s .. s + 15): eight lanes (d mod 8) of fused multiply-adds
 * per key, added pairwise, times scale; each score stored where the task attends to it, and the task's largest score
 * so far (mx) raised to it (a NaN skipped) */
static void tile_scores_portable(struct attn_task *t, int n, int j0, int nb, const float *kt, int kb, int hd,
                                 float scale) {
    for (int i = 0; i < n; i++) {
        int a, b;
        task_span(t + i, j0, nb, &a, &b);
        float mx = t[i].mx;
        for (int s = a & ~15; s < b; s += 16) {
            float acc[8][16];
            for (int l = 0; l < 8; l++)
                for (int u = 0; u < 16; u++) acc[l][u] = 0.0f;
            for (int d = 0; d < hd; d += 8)
                for (int l = 0; l < 8; l++) {
                    const float qd = t[i].q[d + l], *k = kt + (size_t)(d + l) * kb + s;
                    for (int u = 0; u < 16; u++) acc[l][u] = fmaf(qd, k[u], acc[l][u]);
                }
            const int lo = a > s ? a : s, hi = b < s + 16 ? b : s + 16;
            for (int j = lo; j < hi; j++) {
                const int u = j - s;
                float t0 = acc[0][u] + acc[4][u], t1 = acc[1][u] + acc[5][u];
                const float t2 = acc[2][u] + acc[6][u], t3 = acc[3][u] + acc[7][u];
                t0 = t0 + t2;
                t1 = t1 + t3;
                const float v = (t0 + t1) * scale;
                t[i].sc[j0 + j - t[i].first] = v;
                mx = v > mx ? v : mx;
            }
        }
        t[i].mx = mx;
    }
}

/* weighted_values' chains continued over the block, in increasing position */
#define TILE_VALUES(SUFFIX, T, LOAD1)                                                                              \
    static void tile_values##SUFFIX(const struct attn_task *t, int n, int j0, int nb, const void *v, int hd) {  \
        for (int i = 0; i < n; i++) {                                                                            \
            int a, b;                                                                                            \
            task_span(t + i, j0, nb, &a, &b);                                                                    \
            float *out = t[i].out;                                                                               \
            const float *p = t[i].sc + (j0 + a - t[i].first); /* the probability of block index a */             \
            for (int j = a; j < b; j++) {                                                                        \
                const float pj = p[j - a];                                                                       \
                const T *vj = (const T *)v + (size_t)j * hd;                                                     \
                for (int d = 0; d < hd; d++) out[d] = fmaf(pj, LOAD1(vj + d), out[d]);                           \
            }                                                                                                    \
        }                                                                                                        \
    }
TILE_VALUES(_f, float, F32_1)
TILE_VALUES(_h, uint16_t, F16_1)
#undef TILE_VALUES

static void tile_values_portable(const struct attn_task *t, int n, int j0, int nb, const void *v, int hd, int half) {
    (half ? tile_values_h : tile_values_f)(t, n, j0, nb, v, hd);
}

const struct attn_ops attn_portable = {
    .key_scores = {key_scores_f, key_scores_h},
    .weighted_values = {weighted_values_f, weighted_values_h},
    .max = max_portable,
    .exp_sums = exp_sums_portable,
    .tile_keys = {tile_keys_f, tile_keys_h},
    .tile_scores = tile_scores_portable,
    .exp_lanes = exp_lanes_portable,
    .tile_values = tile_values_portable,
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

/* ---- the tiled loops on AVX2 and AVX-512: the portable ones' operations, vectors across keys (scores) and across
 * the head's width (values) ---- */

/* a vector loaded once into a register for the several multiply-adds that use it (not read again from memory by
 * each: the loads, not the multiply-adds, would bound the loops) */
#define IN_REGISTER(x) __asm__("" : "+v"(x))

/* r[i] (eight floats of row i) to r[l] (float l of every row) */
T256 static inline void transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* keys [nb][hd] to kt (zeros past nb), eight keys by eight widths at a time: element (j, d) at AT(j, d), which is
 * d * kb + j for tile_keys_f256 / h256 (AVX-512's scores read a width's keys in a row) and, for tile_keys_f8 / h8,
 * (j / 8) * hd * 8 + d * 8 + j % 8 (AVX2's: eight keys at a time, each width's eight floats together, so that the
 * scores of eight keys read one contiguous run of memory) */
#define TILE_KEYS(NAME, T, LOAD8, AT)                                                                              \
    T256 static void NAME(const void *keys_, int nb, int hd, float *kt, int kb) {                                 \
        const T *keys = keys_;                                                                                   \
        for (int j = 0; j < kb; j += 8)                                                                          \
            for (int d = 0; d < hd; d += 8) {                                                                    \
                __m256 r[8];                                                                                     \
                for (int i = 0; i < 8; i++)                                                                      \
                    r[i] = j + i < nb ? LOAD8(keys + (size_t)(j + i) * hd + d) : _mm256_setzero_ps();            \
                transpose8(r);                                                                                   \
                for (int l = 0; l < 8; l++) _mm256_storeu_ps(kt + AT(j, d + l), r[l]);                           \
            }                                                                                                    \
    }
#define BY_WIDTH(j, d) ((size_t)(d) * kb + (j))
#define BY_EIGHT(j, d) ((size_t)(j) * hd + (size_t)(d) * 8)
TILE_KEYS(tile_keys_f256, float, F32_8, BY_WIDTH)
TILE_KEYS(tile_keys_h256, uint16_t, F16_8, BY_WIDTH)
TILE_KEYS(tile_keys_f8, float, F32_8, BY_EIGHT)
TILE_KEYS(tile_keys_h8, uint16_t, F16_8, BY_EIGHT)
#undef BY_WIDTH
#undef BY_EIGHT
#undef TILE_KEYS

/* a vector SC of W scores for keys S .. S + W - 1 into task T's scores, only those in its span SA .. SB - 1, and
 * into its running max MX (lanes outside the span left out) */
#define STORE_SCORES(W, STORE, MAX, KEEP, T, SC, S, SA, SB, J0, MX)                                                 \
    do {                                                                                                         \
        const int a_ = (SA) > (S) ? (SA) : (S), b_ = (SB) < (S) + (W) ? (SB) : (S) + (W);                        \
        if (a_ < b_) {                                                                                           \
            if (b_ - a_ == (W)) {                                                                                \
                STORE((T)->sc + ((J0) + (S) - (T)->first), (SC));                                                \
                (MX) = MAX((SC), (MX));                                                                          \
            } else {                                                                                             \
                float v_[W];                                                                                     \
                STORE(v_, (SC));                                                                                 \
                for (int j_ = a_; j_ < b_; j_++) (T)->sc[(J0) + j_ - (T)->first] = v_[j_ - (S)];                 \
                (MX) = MAX(KEEP((SC), a_ - (S), b_ - (S)), (MX));                                                \
            }                                                                                                    \
        }                                                                                                        \
    } while (0)

/* each task's running max T->mx raised to the largest lane of MX[i] */
#define FOLD_MAX(NQ, HMAX, T, MX)                                                                                 \
    for (int i_ = 0; i_ < (NQ); i_++) {                                                                          \
        const float m_ = HMAX((MX)[i_]);                                                                         \
        (T)[i_]->mx = m_ > (T)[i_]->mx ? m_ : (T)[i_]->mx;                                                       \
    }

/* NQ tasks' scores of the block's key columns lo .. hi - 1 (kt's columns), W keys at a time (the vector's lanes): per
 * task and key the eight lanes' chains of key_scores, side by side across keys, each key column of kt loaded once
 * for the NQ tasks; each score stored where its task attends to it, and the task's largest score so far (mx) raised
 * to the largest of them (NaN skipped, as the per-row max skips it: MAX(x, m) gives m for a NaN x) */
#define TILE_SCORES(NAME, TARGET, VEC, W, ZERO, LOAD, SET1, FMA, ADD, MUL, STORE, MAX, KEEP, HMAX, NQ)              \
    TARGET static void NAME(struct attn_task *const *t, int j0, int nb, int lo, int hi, const float *kt, int kb, \
                            int hd, float scale) {                                                               \
        const float *q[NQ];                                                                                      \
        VEC mx[NQ];                                                                                              \
        int sa[NQ], sb[NQ];                                                                                      \
        for (int i = 0; i < NQ; i++) {                                                                           \
            q[i] = t[i]->q;                                                                                      \
            mx[i] = SET1(-INFINITY);                                                                             \
            task_span(t[i], j0, nb, &sa[i], &sb[i]);                                                             \
        }                                                                                                        \
        for (int s = lo & ~(W - 1); s < hi; s += W) {                                                            \
            VEC acc[NQ][8];                                                                                      \
            for (int i = 0; i < NQ; i++)                                                                         \
                for (int l = 0; l < 8; l++) acc[i][l] = ZERO();                                                  \
            for (int d = 0; d < hd; d += 8) {                                                                    \
                const float *k = kt + (size_t)d * kb + s;                                                        \
                for (int l = 0; l < 8; l++) {                                                                    \
                    VEC kv = LOAD(k + (size_t)l * kb);                                                           \
                    IN_REGISTER(kv);                                                                             \
                    for (int i = 0; i < NQ; i++) acc[i][l] = FMA(SET1(q[i][d + l]), kv, acc[i][l]);              \
                }                                                                                                \
            }                                                                                                    \
            for (int i = 0; i < NQ; i++) {                                                                       \
                VEC t0 = ADD(acc[i][0], acc[i][4]), t1 = ADD(acc[i][1], acc[i][5]);                              \
                const VEC t2 = ADD(acc[i][2], acc[i][6]), t3 = ADD(acc[i][3], acc[i][7]);                        \
                t0 = ADD(t0, t2);                                                                                \
                t1 = ADD(t1, t3);                                                                                \
                const VEC sc = MUL(ADD(t0, t1), SET1(scale));                                                    \
                STORE_SCORES(W, STORE, MAX, KEEP, t[i], sc, s, sa[i], sb[i], j0, mx[i]);                         \
            }                                                                                                    \
        }                                                                                                        \
        FOLD_MAX(NQ, HMAX, t, mx)                                                                                \
    }

/* lanes a .. b - 1 of x, -inf elsewhere */
T512 static inline __m512 keep16(__m512 x, int a, int b) {
    const __mmask16 k = (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u));
    return _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), k, x);
}
T256 static inline __m256 keep8(__m256 x, int a, int b) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(a - 1)),
                                        _mm256_cmpgt_epi32(_mm256_set1_epi32(b), lane));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, _mm256_castsi256_ps(in));
}
/* the largest lane (none is NaN: any order) */
T512 static inline float hmax16(__m512 x) { return _mm512_reduce_max_ps(x); }
T256 static inline float hmax8(__m256 x) {
    float v[8];
    _mm256_storeu_ps(v, x);
    float m = v[0];
    for (int l = 1; l < 8; l++) m = v[l] > m ? v[l] : m;
    return m;
}

#define SCORES512(NQ)                                                                                              \
    TILE_SCORES(tile_scores512_##NQ, T512, __m512, 16, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_set1_ps,        \
                _mm512_fmadd_ps, _mm512_add_ps, _mm512_mul_ps, _mm512_storeu_ps, _mm512_max_ps, keep16, hmax16, NQ)
SCORES512(1)
SCORES512(2)
SCORES512(3)
#undef SCORES512
#undef TILE_SCORES

typedef void (*scores_group_fn)(struct attn_task *const *t, int j0, int nb, int lo, int hi, const float *kt, int kb,
                                int hd, float scale);

/* The tasks that attend to the block in groups of up to three, each group over the keys that any of its tasks attends
 * to, through fn[m] for a group of m tasks (the loops of AVX-512 and of AVX2) */
static void scores_in_groups(const scores_group_fn fn[4], struct attn_task *t, int n, int j0, int nb, const float *kt,
                             int kb, int hd, float scale) {
    for (int i = 0; i < n;) {
        struct attn_task *sel[3];
        int m = 0, lo = nb, hi = 0;
        for (; i < n && m < 3; i++) {
            int a, b;
            task_span(t + i, j0, nb, &a, &b);
            if (a >= b) continue;
            sel[m++] = t + i;
            lo = a < lo ? a : lo;
            hi = b > hi ? b : hi;
        }
        if (m) fn[m](sel, j0, nb, lo, hi, kt, kb, hd, scale);
    }
}

/* AVX-512's 32 registers: three tasks' 24 accumulators */
static void tile_scores512(struct attn_task *t, int n, int j0, int nb, const float *kt, int kb, int hd, float scale) {
    static const scores_group_fn fn[4] = {NULL, tile_scores512_1, tile_scores512_2, tile_scores512_3};
    scores_in_groups(fn, t, n, j0, nb, kt, kb, hd, scale);
}

/* AVX2's 16 registers cannot hold the eight lane chains of more than one task: NQ tasks' scores of the block's keys
 * lo .. hi - 1 (kt in tile_keys_f8's layout), eight keys at a time, the chains of lanes 0-3 first, then those of
 * lanes 4-7 (each chain the multiply-adds of TILE_SCORES in the same order, the four sums of the first half kept
 * until the second half is added to them, as TILE_SCORES adds them); each vector of keys loaded once for the NQ
 * tasks, so that a multiply-add needs 1 + 1 / NQ loads where one task at a time needed 2 */
#define SCORES256_HALVES(NQ)                                                                                       \
    T256 static void tile_scores256_h##NQ(struct attn_task *const *t, int j0, int nb, int lo, int hi,             \
                                          const float *kt, int kb, int hd, float scale) {                        \
        const float *q[NQ];                                                                                      \
        __m256 mx[NQ];                                                                                           \
        int sa[NQ], sb[NQ];                                                                                      \
        for (int i = 0; i < NQ; i++) {                                                                           \
            q[i] = t[i]->q;                                                                                      \
            mx[i] = _mm256_set1_ps(-INFINITY);                                                                   \
            task_span(t[i], j0, nb, &sa[i], &sb[i]);                                                             \
        }                                                                                                        \
        for (int s = lo & ~7; s < hi; s += 8) {                                                                  \
            __m256 first[NQ][4], acc[NQ][4];                                                                     \
            for (int part = 0; part < 2; part++) {                                                               \
                for (int i = 0; i < NQ; i++)                                                                     \
                    for (int l = 0; l < 4; l++) acc[i][l] = _mm256_setzero_ps();                                 \
                for (int d = 0; d < hd; d += 8) {                                                                \
                    const float *k = kt + (size_t)s * hd + (size_t)(d + 4 * part) * 8;                           \
                    for (int l = 0; l < 4; l++) {                                                                \
                        __m256 kv = _mm256_loadu_ps(k + 8 * l);                                                  \
                        IN_REGISTER(kv);                                                                         \
                        for (int i = 0; i < NQ; i++)                                                             \
                            acc[i][l] = _mm256_fmadd_ps(_mm256_set1_ps(q[i][d + 4 * part + l]), kv, acc[i][l]);  \
                    }                                                                                            \
                }                                                                                                \
                if (part == 0)                                                                                   \
                    for (int i = 0; i < NQ; i++)                                                                 \
                        for (int l = 0; l < 4; l++) first[i][l] = acc[i][l];                                     \
            }                                                                                                    \
            for (int i = 0; i < NQ; i++) {                                                                       \
                __m256 t0 = _mm256_add_ps(first[i][0], acc[i][0]), t1 = _mm256_add_ps(first[i][1], acc[i][1]);   \
                const __m256 t2 = _mm256_add_ps(first[i][2], acc[i][2]);                                         \
                const __m256 t3 = _mm256_add_ps(first[i][3], acc[i][3]);                                         \
                t0 = _mm256_add_ps(t0, t2);                                                                      \
                t1 = _mm256_add_ps(t1, t3);                                                                      \
                const __m256 sc = _mm256_mul_ps(_mm256_add_ps(t0, t1), _mm256_set1_ps(scale));                   \
                STORE_SCORES(8, _mm256_storeu_ps, _mm256_max_ps, keep8, t[i], sc, s, sa[i], sb[i], j0, mx[i]);   \
            }                                                                                                    \
        }                                                                                                        \
        FOLD_MAX(NQ, hmax8, t, mx)                                                                               \
    }
SCORES256_HALVES(1)
SCORES256_HALVES(2)
SCORES256_HALVES(3)
#undef SCORES256_HALVES

static void tile_scores256(struct attn_task *t, int n, int j0, int nb, const float *kt, int kb, int hd, float scale) {
    static const scores_group_fn fn[4] = {NULL, tile_scores256_h1, tile_scores256_h2, tile_scores256_h3};
    scores_in_groups(fn, t, n, j0, nb, kt, kb, hd, scale);
}

/* NT tasks' outputs, widths c .. c + CW W - 1, continued over block indexes a .. b - 1 (which they all attend to),
 * from the block's values (float32, or float16 bits: T, LOAD): per element the chain of weighted_values, in
 * increasing position; each vector of values loaded once for the NT tasks */
#define TILE_VALUES(NAME, TARGET, VEC, W, T, LOAD, SET1, FMA, CW, NT)                                              \
    TARGET static void NAME(const struct attn_task *const *t, int j0, int a, int b, const void *v_, int hd,      \
                            int c) {                                                                             \
        VEC acc[NT][CW];                                                                                         \
        const float *p[NT];                                                                                      \
        for (int i = 0; i < NT; i++) {                                                                           \
            p[i] = t[i]->sc + (j0 + a - t[i]->first);                                                            \
            for (int u = 0; u < CW; u++) acc[i][u] = LOADF(W, t[i]->out + c + W * u);                            \
        }                                                                                                        \
        for (int j = a; j < b; j++) {                                                                            \
            const T *vj = (const T *)v_ + (size_t)j * hd + c;                                                    \
            VEC pj[NT];                                                                                          \
            for (int i = 0; i < NT; i++) pj[i] = SET1(p[i][j - a]);                                              \
            for (int u = 0; u < CW; u++) {                                                                       \
                VEC vv = LOAD(vj + W * u);                                                                       \
                IN_REGISTER(vv);                                                                                 \
                for (int i = 0; i < NT; i++) acc[i][u] = FMA(pj[i], vv, acc[i][u]);                              \
            }                                                                                                    \
        }                                                                                                        \
        for (int i = 0; i < NT; i++)                                                                             \
            for (int u = 0; u < CW; u++) STOREF(W, t[i]->out + c + W * u, acc[i][u]);                            \
    }
#define LOADF(W, p) LOADF##W(p)
#define LOADF16(p) _mm512_loadu_ps(p)
#define LOADF8(p) _mm256_loadu_ps(p)
#define STOREF(W, p, x) STOREF##W(p, x)
#define STOREF16(p, x) _mm512_storeu_ps(p, x)
#define STOREF8(p, x) _mm256_storeu_ps(p, x)
#define TILE_VALUES512(CW, NT)                                                                                     \
    TILE_VALUES(tile_values512_##CW##_##NT, T512, __m512, 16, float, F32_16, _mm512_set1_ps, _mm512_fmadd_ps, CW, \
                NT)                                                                                              \
    TILE_VALUES(tile_values512_h##CW##_##NT, T512, __m512, 16, uint16_t, F16_16, _mm512_set1_ps, _mm512_fmadd_ps, \
                CW, NT)
#define TILE_VALUES256(CW, NT)                                                                                     \
    TILE_VALUES(tile_values256_##CW##_##NT, T256, __m256, 8, float, F32_8, _mm256_set1_ps, _mm256_fmadd_ps, CW, NT) \
    TILE_VALUES(tile_values256_h##CW##_##NT, T256, __m256, 8, uint16_t, F16_8, _mm256_set1_ps, _mm256_fmadd_ps, CW, \
                NT)
TILE_VALUES512(8, 1)
TILE_VALUES512(8, 2)
TILE_VALUES512(8, 3)
TILE_VALUES512(4, 1)
TILE_VALUES512(4, 2)
TILE_VALUES512(4, 3)
TILE_VALUES512(4, 6)
TILE_VALUES512(2, 1)
TILE_VALUES512(2, 2)
TILE_VALUES512(2, 4)
TILE_VALUES512(2, 8)
TILE_VALUES512(1, 1)
TILE_VALUES512(1, 2)
TILE_VALUES512(1, 4)
TILE_VALUES512(1, 8)
TILE_VALUES256(4, 1)
TILE_VALUES256(4, 2)
TILE_VALUES256(4, 3)
TILE_VALUES256(2, 1)
TILE_VALUES256(2, 2)
TILE_VALUES256(2, 4)
TILE_VALUES256(1, 1)
TILE_VALUES256(1, 2)
TILE_VALUES256(1, 4)
#undef TILE_VALUES512
#undef TILE_VALUES256
#undef TILE_VALUES
#undef LOADF
#undef LOADF16
#undef LOADF8
#undef STOREF
#undef STOREF16
#undef STOREF8

typedef void (*values_part_fn)(const struct attn_task *const *t, int j0, int a, int b, const void *v, int hd, int c);

/* A path's value loops: fn[part][nt] for nt tasks at once (NULL where there is none; fn[part][1] one task) over
 * widths of cw[part] vectors of w floats. */
struct values_loops {
    int w;
    int cw[4];
    values_part_fn fn[4][9];
};

/* nt tasks (sel, with their spans sa, sb of the block): their common positions in one pass over the values, those
 * before and after task by task, so that every chain still runs in increasing position */
static void values_group(const struct values_loops *L, int part, const struct attn_task *const *sel, const int *sa,
                         const int *sb, int nt, int j0, const void *v, int hd, int c) {
    int lo = sa[0], hi = sb[0];
    for (int u = 1; u < nt; u++) {
        lo = sa[u] > lo ? sa[u] : lo;
        hi = sb[u] < hi ? sb[u] : hi;
    }
    const values_part_fn one = L->fn[part][1];
    if (nt == 1 || lo >= hi) {
        for (int u = 0; u < nt; u++) one(sel + u, j0, sa[u], sb[u], v, hd, c);
        return;
    }
    for (int u = 0; u < nt; u++)
        if (sa[u] < lo) one(sel + u, j0, sa[u], lo, v, hd, c);
    L->fn[part][nt](sel, j0, lo, hi, v, hd, c);
    for (int u = 0; u < nt; u++)
        if (hi < sb[u]) one(sel + u, j0, hi, sb[u], v, hd, c);
}

/* The tasks that attend to the block, in groups as large as the path's loops take, over the widths in parts of
 * cw vectors (the largest of 8, 4, 2, 1 that fits). v: the block's values, hd a multiple of L->w. */
static void tile_values_x86(const struct values_loops *L, const struct attn_task *t, int n, int j0, int nb,
                            const void *v, int hd) {
    for (int c = 0; c < hd;) {
        const int left = (hd - c) / L->w;
        int part = 0;
        while (L->cw[part] > left || !L->fn[part][1]) part++;
        int most = 8;
        while (!L->fn[part][most]) most--;
        for (int i = 0; i < n;) {
            const struct attn_task *sel[8];
            int sa[8], sb[8], m = 0;
            for (; i < n && m < most; i++) {
                task_span(t + i, j0, nb, &sa[m], &sb[m]);
                if (sa[m] < sb[m]) sel[m++] = t + i;
            }
            for (int u = 0; u < m;) {
                int nt = m - u;
                while (!L->fn[part][nt]) nt--;
                values_group(L, part, sel + u, sa + u, sb + u, nt, j0, v, hd, c);
                u += nt;
            }
        }
        c += L->cw[part] * L->w;
    }
}

#define V256(H)                                                                                                    \
    {                                                                                                            \
        8, {8, 4, 2, 1}, {                                                                                       \
            {NULL},                                                                                              \
            {NULL, tile_values256_##H##4_1, tile_values256_##H##4_2, tile_values256_##H##4_3},                   \
            {NULL, tile_values256_##H##2_1, tile_values256_##H##2_2, NULL, tile_values256_##H##2_4},             \
            {NULL, tile_values256_##H##1_1, tile_values256_##H##1_2, NULL, tile_values256_##H##1_4},             \
        }                                                                                                        \
    }
#define V512(H)                                                                                                    \
    {                                                                                                            \
        16, {8, 4, 2, 1}, {                                                                                      \
            {NULL, tile_values512_##H##8_1, tile_values512_##H##8_2, tile_values512_##H##8_3},                   \
            {NULL, tile_values512_##H##4_1, tile_values512_##H##4_2, tile_values512_##H##4_3, NULL, NULL,        \
             tile_values512_##H##4_6},                                                                           \
            {NULL, tile_values512_##H##2_1, tile_values512_##H##2_2, NULL, tile_values512_##H##2_4, NULL, NULL,  \
             NULL, tile_values512_##H##2_8},                                                                     \
            {NULL, tile_values512_##H##1_1, tile_values512_##H##1_2, NULL, tile_values512_##H##1_4, NULL, NULL,  \
             NULL, tile_values512_##H##1_8},                                                                     \
        }                                                                                                        \
    }
static const struct values_loops values256[2] = {V256(), V256(h)};
static const struct values_loops values512[2] = {V512(), V512(h)};
#undef V256
#undef V512

static void tile_values256(const struct attn_task *t, int n, int j0, int nb, const void *v, int hd, int half) {
    tile_values_x86(&values256[half], t, n, j0, nb, v, hd);
}

static void tile_values512(const struct attn_task *t, int n, int j0, int nb, const void *v, int hd, int half) {
    tile_values_x86(hd % 16 ? &values256[half] : &values512[half], t, n, j0, nb, v, hd);
}

const struct attn_ops attn_avx2 = {
    .key_scores = {key_scores_x86, key_scores_h_x86},
    .weighted_values = {weighted_values_avx2, weighted_values_h_avx2},
    .joint_scores = {{joint256_j2_s, joint256_j3_s}, {joint_h256_j2_s, joint_h256_j3_s}},
    .joint_values = {{joint256_j2_v, joint256_j3_v}, {joint_h256_j2_v, joint_h256_j3_v}},
    .max = max8,
    .exp_sums = softmax_exp8,
    .tile_keys = {tile_keys_f8, tile_keys_h8},
    .tile_scores = tile_scores256,
    .exp_lanes = exp_lanes8,
    .tile_values = tile_values256,
};

const struct attn_ops attn_avx512 = {
    .key_scores = {key_scores_x86, key_scores_h_x86},
    .weighted_values = {weighted_values_avx512, weighted_values_h_avx512},
    .joint_scores = {{joint_j2_s, joint_j3_s}, {joint_h_j2_s, joint_h_j3_s}},
    .joint_values = {{joint_j2_v, joint_j3_v}, {joint_h_j2_v, joint_h_j3_v}},
    .max = max8,
    .exp_sums = softmax_exp8,
    .tile_keys = {tile_keys_f256, tile_keys_h256},
    .tile_scores = tile_scores512,
    .exp_lanes = exp_lanes8,
    .tile_values = tile_values512,
};
#endif

/* The tiled loops' block sizes: positions of keys per block of the scores (transposed into a thread's buffer of
 * TILE_FLOATS floats, 64 KB, in L2) and of values per block of the outputs (fewer where the head is wider than 128);
 * TILE_TASKS tasks at most per tile. Blocks of 128 rather than 64 positions: the work each task does per block
 * (its span, its probabilities' call, its group's setup) counts half as often (Zen 4, one thread, one layer of
 * Qwen2.5-Coder-1.5B's shape, a 64-row slice: 0.95x the attention's time after 4,096 and 8,192 positions; smaller
 * blocks, in L1, 1.13-1.5x). The block sizes change no number: every chain runs in increasing position whatever
 * the blocks. When the layers choose (TILING_AUTO), a tile has at least TILE_MIN_TASKS
 * tasks, TILE_MIN_JOINT where the path has joint loops for the head width (heads of 64): below, transposing the keys
 * costs more than reading them once per task or per three (measured in process on Zen 4, one thread: heads of 64,
 * three per key-value head, one row 1.2-1.3x the joint loops' time; heads of 128, six per key-value head, one row
 * 0.7-0.95x the per-row loops' time after 100-2,000 positions). */
#define TILE_KEYS 128
#define TILE_VALUES 128
#define TILE_FLOATS 16384
#define TILE_TASKS 512
#define TILE_MIN_TASKS 4
#define TILE_MIN_JOINT 16

/* The task's scores of the block's positions j0 .. j0 + nb - 1 that it attends to, to e^(s - mx) in place, each of
 * the row's first multiple of 8 added to its lane's sum (lane: its index in the row mod 8): softmax_unnormalised's
 * operations, a block at a time, in increasing position. */
static void probabilities(struct attn_task *t, int j0, int nb, const struct attn_ops *ops) {
    int a, b;
    task_span(t, j0, nb, &a, &b);
    const int m8 = (t->last - t->first) & ~7, end = j0 + b - t->first;
    int i = j0 + a - t->first;
    if (a >= b) return;
    if (i % 8 == 0 && i < m8) {
        const int n8 = ((end < m8 ? end : m8) - i) & ~7;
        ops->exp_lanes(t->sc + i, n8, t->mx, t->lanes);
        i += n8;
    }
    for (; i < end; i++) {
        const float e = exp_approx(t->sc[i] - t->mx);
        t->sc[i] = e;
        if (i < m8) t->lanes[i % 8] += e;
    }
}

/* A tile's start: the positions its tasks span (lo .. hi) and each task's maximum, lane sums and output reset. */
static void tile_begin(struct attn_task *tasks, int n, int hd, int *lo_out, int *hi_out) {
    int lo = tasks[0].first, hi = tasks[0].last;
    for (int i = 0; i < n; i++) {
        struct attn_task *t = tasks + i;
        lo = t->first < lo ? t->first : lo;
        hi = t->last > hi ? t->last : hi;
        t->mx = -INFINITY;
        for (int l = 0; l < 8; l++) t->lanes[l] = 0.0f;
        memset(t->out, 0, (size_t)hd * sizeof(float));
    }
    *lo_out = lo;
    *hi_out = hi;
}

/* A tile's end: each task's sum (the lanes added pairwise, then the row's last len mod 8) and its output times
 * 1 / sum, as the per-row loops end. */
static void tile_end(struct attn_task *tasks, int n, int hd) {
    for (int i = 0; i < n; i++) {
        const struct attn_task *t = tasks + i;
        const float *a = t->lanes;
        float sum = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        for (int j = (t->last - t->first) & ~7; j < t->last - t->first; j++) sum += t->sc[j];
        const float inv = 1.0f / sum;
        for (int d = 0; d < hd; d++) t->out[d] *= inv;
    }
}

/* One tile: n tasks (query heads of rows that share one cache, and one key-value head whose keys and values start at
 * `keys` and `vals`, position 0), each key and value of their positions read once for all of them. Every score,
 * probability and output element is computed with the same operations in the same order as by the per-row loops:
 * the scores of each block of keys (transposed to float32 in buf) for every task, with each task's largest; then
 * for each block of values, each task's probabilities there (their lane sums continued) and its output chains
 * continued in increasing position; then each sum (the lanes added pairwise, then the row's last len mod 8) and each
 * output times its 1 / sum. Each row of scores is written once and read once more. */
static void attention_tile(struct attn_task *tasks, int n, const void *keys, const void *vals, int kv_half, int hd,
                           float scale, const struct attn_ops *ops, float *buf) {
    const size_t elem = kv_half ? sizeof(uint16_t) : sizeof(float);
    int lo, hi;
    tile_begin(tasks, n, hd, &lo, &hi);
    int kb = TILE_FLOATS / hd;
    kb = (kb < TILE_KEYS ? kb : TILE_KEYS) & ~15;
    for (int j0 = lo; j0 < hi; j0 += kb) {
        const int nb = hi - j0 < kb ? hi - j0 : kb;
        ops->tile_keys[kv_half]((const char *)keys + (size_t)j0 * hd * elem, nb, hd, buf, kb);
        ops->tile_scores(tasks, n, j0, nb, buf, kb, hd, scale);
    }
    int vb = TILE_FLOATS / hd;
    vb = vb < TILE_VALUES ? vb : TILE_VALUES;
    for (int j0 = lo; j0 < hi; j0 += vb) {
        const int nb = hi - j0 < vb ? hi - j0 : vb;
        for (int i = 0; i < n; i++) probabilities(tasks + i, j0, nb, ops);
        ops->tile_values(tasks, n, j0, nb, (const char *)vals + (size_t)j0 * hd * elem, hd, kv_half);
    }
    tile_end(tasks, n, hd);
}

#ifdef SPECWISE_X86
/* ---- the tiled loops in bfloat16 (the layers' ATTN_BF16, on CPUs with AVX512_BF16): queries, keys, probabilities
 * and values rounded to bfloat16 (to nearest even, as VCVTNE2PS2BF16 rounds), their products summed in float32 by
 * VDPBF16PS, two products per lane and instruction. Every row's numbers come from these loops whatever the pass (a
 * decoding step's tasks make a tile of their own), and each number's operations are fixed by its position and
 * width alone: a key's score is two chains over pairs of widths (pair p in chain p mod 2, in increasing p), added,
 * times scale; an output element is one chain over pairs of positions (2m, 2m + 1) of the cache, in
 * increasing m, a position the row does not attend to weighing 0. Head widths a multiple of 16, up to 256. ---- */
#define T512BF __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

/* sixteen floats of width d .. d + 15 of a cache row, both halves rounded to bfloat16 in width order */
T512BF static inline __m256i bf16_16(const void *row, int half, int d) {
    __m256 lo, hi;
    if (half) {
        lo = F16_8((const uint16_t *)row + d);
        hi = F16_8((const uint16_t *)row + d + 8);
    } else {
        lo = F32_8((const float *)row + d);
        hi = F32_8((const float *)row + d + 8);
    }
    return (__m256i)_mm256_cvtne2ps_pbh(hi, lo);
}

/* keys [nb][hd] to pairs kt[p * kb + j] = the bfloat16 of (k[j][2p], k[j][2p + 1]) (zeros past nb) */
T512BF static void bf16_keys(const void *keys, int half, int nb, int hd, uint32_t *kt, int kb) {
    const size_t elem = half ? 2 : 4;
    for (int j = 0; j < kb; j += 8)
        for (int d = 0; d < hd; d += 16) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = j + i < nb ? _mm256_castsi256_ps(bf16_16((const char *)keys + (size_t)(j + i) * hd * elem, half, d))
                                  : _mm256_setzero_ps();
            transpose8(r);
            for (int l = 0; l < 8; l++) _mm256_storeu_ps((float *)kt + (size_t)(d / 2 + l) * kb + j, r[l]);
        }
}

/* values [nb][hd] to pairs vt[m * hd + d] = the bfloat16 of (v[2m][d], v[2m + 1][d]) (zeros past nb) */
T512BF static void bf16_values(const void *vals, int half, int nb, int hd, uint32_t *vt) {
    const size_t elem = half ? 2 : 4;
    const __m512i mix = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int m = 0; 2 * m < nb; m++) {
        const char *a = (const char *)vals + (size_t)(2 * m) * hd * elem, *b = a + (size_t)hd * elem;
        for (int d = 0; d < hd; d += 16) {
            const __m256i x = bf16_16(a, half, d), y = 2 * m + 1 < nb ? bf16_16(b, half, d) : _mm256_setzero_si256();
            const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1);
            _mm512_storeu_si512(vt + (size_t)m * hd + d, _mm512_permutexvar_epi16(mix, both));
        }
    }
}

/* a query (hd floats) to hd / 2 pairs of bfloat16 */
T512BF static void bf16_query(const float *q, int hd, uint32_t *qb) {
    for (int d = 0; d < hd; d += 16) _mm256_storeu_si256((__m256i *)(qb + d / 2), bf16_16(q, 0, d));
}

/* a task's probabilities of block positions a .. b - 1 (zero elsewhere) as pairs pp[m] = (p[2m], p[2m + 1]) for the
 * pairs that hold them */
T512BF static void bf16_probs(const struct attn_task *t, int j0, int a, int b, uint32_t *pp) {
    const float *sc = t->sc + (j0 - t->first);
    for (int j = a & ~31; j < b; j += 32) {
        const int from = a > j ? a - j : 0, to = b - j < 32 ? b - j : 32;
        const uint64_t in = ((1ull << to) - 1) & ~((1ull << from) - 1);
        const __m512 lo = _mm512_maskz_loadu_ps((__mmask16)in, sc + j), hi = _mm512_maskz_loadu_ps((__mmask16)(in >> 16), sc + j + 16);
        _mm512_storeu_si512(pp + j / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

/* NQ tasks' scores of block columns lo .. hi - 1, 32 keys at a time (two vectors of 16): per key two chains of
 * VDPBF16PS over its pairs of widths (pair p in chain p mod 2, in increasing p), added, times scale; each key
 * vector loaded once for the NQ tasks and each query pair broadcast once for both key vectors; stored and maxed as
 * TILE_SCORES does */
#define BF16_SCORES(NQ)                                                                                            \
    T512BF static void bf16_scores_##NQ(struct attn_task *const *t, const uint32_t *const *qb, int j0, int nb,   \
                                        int lo, int hi, const uint32_t *kt, int kb, int hd, float scale) {        \
        __m512 mx[NQ];                                                                                           \
        int sa[NQ], sb[NQ];                                                                                      \
        for (int i = 0; i < NQ; i++) {                                                                           \
            mx[i] = _mm512_set1_ps(-INFINITY);                                                                   \
            task_span(t[i], j0, nb, &sa[i], &sb[i]);                                                             \
        }                                                                                                        \
        for (int s = lo & ~31; s < hi; s += 32) {                                                                \
            __m512 acc[NQ][2][2];                                                                                \
            for (int i = 0; i < NQ; i++)                                                                         \
                acc[i][0][0] = acc[i][0][1] = acc[i][1][0] = acc[i][1][1] = _mm512_setzero_ps();                 \
            for (int p = 0; p < hd / 2; p += 2) {                                                                \
                const uint32_t *k = kt + (size_t)p * kb + s;                                                     \
                for (int c = 0; c < 2; c++) {                                                                    \
                    __m512i k0 = _mm512_loadu_si512(k + (size_t)c * kb),                                         \
                            k1 = _mm512_loadu_si512(k + (size_t)c * kb + 16);                                    \
                    IN_REGISTER(k0);                                                                             \
                    IN_REGISTER(k1);                                                                             \
                    for (int i = 0; i < NQ; i++) {                                                               \
                        const __m512bh qv = (__m512bh)_mm512_set1_epi32((int)qb[i][p + c]);                      \
                        acc[i][c][0] = _mm512_dpbf16_ps(acc[i][c][0], (__m512bh)k0, qv);                         \
                        acc[i][c][1] = _mm512_dpbf16_ps(acc[i][c][1], (__m512bh)k1, qv);                         \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
            for (int i = 0; i < NQ; i++)                                                                         \
                for (int h = 0; h < 2; h++) {                                                                    \
                    const int s16 = s + 16 * h;                                                                  \
                    const __m512 sc = _mm512_mul_ps(_mm512_add_ps(acc[i][0][h], acc[i][1][h]), _mm512_set1_ps(scale)); \
                    STORE_SCORES(16, _mm512_storeu_ps, _mm512_max_ps, keep16, t[i], sc, s16, sa[i], sb[i], j0, mx[i]); \
                }                                                                                                \
        }                                                                                                        \
        FOLD_MAX(NQ, hmax16, t, mx)                                                                              \
    }
BF16_SCORES(1)
BF16_SCORES(2)
BF16_SCORES(3)
BF16_SCORES(4)
#undef BF16_SCORES

/* NT tasks' outputs, widths c .. c + 16 CW - 1, continued over pairs ma .. mb - 1 of the block: per element one
 * chain of VDPBF16PS in increasing pair; each vector of values loaded once for the NT tasks */
#define BF16_VALUES(CW, NT)                                                                                        \
    T512BF static void bf16_values_##CW##_##NT(struct attn_task *const *t, const uint32_t *const *pp, int ma,    \
                                               int mb, const uint32_t *vt, int hd, int c) {                      \
        __m512 acc[NT][CW];                                                                                      \
        for (int i = 0; i < NT; i++)                                                                             \
            for (int u = 0; u < CW; u++) acc[i][u] = _mm512_loadu_ps(t[i]->out + c + 16 * u);                    \
        for (int m = ma; m < mb; m++) {                                                                          \
            const uint32_t *vm = vt + (size_t)m * hd + c;                                                        \
            __m512i pm[NT];                                                                                      \
            for (int i = 0; i < NT; i++) pm[i] = _mm512_set1_epi32((int)pp[i][m]);                               \
            for (int u = 0; u < CW; u++) {                                                                       \
                __m512i vv = _mm512_loadu_si512(vm + 16 * u);                                                    \
                IN_REGISTER(vv);                                                                                 \
                for (int i = 0; i < NT; i++) acc[i][u] = _mm512_dpbf16_ps(acc[i][u], (__m512bh)vv, (__m512bh)pm[i]); \
            }                                                                                                    \
        }                                                                                                        \
        for (int i = 0; i < NT; i++)                                                                             \
            for (int u = 0; u < CW; u++) _mm512_storeu_ps(t[i]->out + c + 16 * u, acc[i][u]);                    \
    }
BF16_VALUES(4, 1)
BF16_VALUES(4, 2)
BF16_VALUES(4, 3)
BF16_VALUES(4, 4)
BF16_VALUES(2, 1)
BF16_VALUES(2, 2)
BF16_VALUES(2, 3)
BF16_VALUES(2, 4)
BF16_VALUES(1, 1)
BF16_VALUES(1, 2)
BF16_VALUES(1, 3)
BF16_VALUES(1, 4)
#undef BF16_VALUES

typedef void (*bf16_values_fn)(struct attn_task *const *t, const uint32_t *const *pp, int ma, int mb,
                               const uint32_t *vt, int hd, int c);
static const bf16_values_fn bf16_values_of[3][5] = {
    {NULL, bf16_values_4_1, bf16_values_4_2, bf16_values_4_3, bf16_values_4_4},
    {NULL, bf16_values_2_1, bf16_values_2_2, bf16_values_2_3, bf16_values_2_4},
    {NULL, bf16_values_1_1, bf16_values_1_2, bf16_values_1_3, bf16_values_1_4},
};

/* The block's values for every task that attends to it, in groups of up to four: each group's common pairs in one
 * pass, those before and after task by task (every chain still in increasing pair). */
static void bf16_tile_values(struct attn_task *t, int n, int j0, int nb, const uint32_t *vt, int hd) {
    for (int i = 0; i < n;) {
        struct attn_task *sel[4];
        uint32_t pp[4][64];
        const uint32_t *pr[4];
        int ma[4], mb[4], m = 0;
        for (; i < n && m < 4; i++) {
            int a, b;
            task_span(t + i, j0, nb, &a, &b);
            if (a >= b) continue;
            bf16_probs(t + i, j0, a, b, pp[m]);
            sel[m] = t + i;
            pr[m] = pp[m];
            ma[m] = a / 2;
            mb[m] = (b + 1) / 2;
            m++;
        }
        if (!m) continue;
        int lo = ma[0], hi = mb[0];
        for (int u = 1; u < m; u++) {
            lo = ma[u] > lo ? ma[u] : lo;
            hi = mb[u] < hi ? mb[u] : hi;
        }
        for (int c = 0; c < hd;) {
            const int part = hd - c >= 64 ? 0 : hd - c >= 32 ? 1 : 2, w = 64 >> part;
            if (m == 1 || lo >= hi) {
                for (int u = 0; u < m; u++) bf16_values_of[part][1](sel + u, pr + u, ma[u], mb[u], vt, hd, c);
            } else {
                for (int u = 0; u < m; u++)
                    if (ma[u] < lo) bf16_values_of[part][1](sel + u, pr + u, ma[u], lo, vt, hd, c);
                bf16_values_of[part][m](sel, pr, lo, hi, vt, hd, c);
                for (int u = 0; u < m; u++)
                    if (hi < mb[u]) bf16_values_of[part][1](sel + u, pr + u, hi, mb[u], vt, hd, c);
            }
            c += w;
        }
    }
}

/* attention_tile in bfloat16: buf holds 2 TILE_FLOATS + n hd / 2 words (the block's keys, its values and the
 * tasks' queries as pairs). Blocks start at even positions (a pair of positions never straddles two). */
static void attention_tile_bf16(struct attn_task *tasks, int n, const void *keys, const void *vals, int kv_half,
                                int hd, float scale, const struct attn_ops *ops, uint32_t *buf) {
    const size_t elem = kv_half ? sizeof(uint16_t) : sizeof(float);
    uint32_t *kt = buf, *vt = buf + TILE_FLOATS, *qb = buf + 2 * TILE_FLOATS;
    int lo, hi;
    tile_begin(tasks, n, hd, &lo, &hi);
    for (int i = 0; i < n; i++) bf16_query(tasks[i].q, hd, qb + (size_t)i * hd / 2);
    lo &= ~1;
    int kb = TILE_FLOATS / (hd / 2);
    kb = (kb < TILE_KEYS ? kb : TILE_KEYS) & ~31;
    for (int j0 = lo; j0 < hi; j0 += kb) {
        const int nb = hi - j0 < kb ? hi - j0 : kb;
        bf16_keys((const char *)keys + (size_t)j0 * hd * elem, kv_half, nb, hd, kt, kb);
        for (int i = 0; i < n;) {
            struct attn_task *sel[4];
            const uint32_t *q[4];
            int m = 0, a0 = nb, b0 = 0;
            for (; i < n && m < 4; i++) {
                int a, b;
                task_span(tasks + i, j0, nb, &a, &b);
                if (a >= b) continue;
                sel[m] = tasks + i;
                q[m++] = qb + (size_t)i * hd / 2;
                a0 = a < a0 ? a : a0;
                b0 = b > b0 ? b : b0;
            }
            if (m == 4)
                bf16_scores_4(sel, q, j0, nb, a0, b0, kt, kb, hd, scale);
            else if (m == 3)
                bf16_scores_3(sel, q, j0, nb, a0, b0, kt, kb, hd, scale);
            else if (m == 2)
                bf16_scores_2(sel, q, j0, nb, a0, b0, kt, kb, hd, scale);
            else if (m == 1)
                bf16_scores_1(sel, q, j0, nb, a0, b0, kt, kb, hd, scale);
        }
    }
    int vb = 2 * TILE_FLOATS / hd;
    vb = (vb < TILE_VALUES ? vb : TILE_VALUES) & ~1;
    for (int j0 = lo; j0 < hi; j0 += vb) {
        const int nb = hi - j0 < vb ? hi - j0 : vb;
        for (int i = 0; i < n; i++) probabilities(tasks + i, j0, nb, ops);
        bf16_values((const char *)vals + (size_t)j0 * hd * elem, kv_half, nb, hd, vt);
        bf16_tile_values(tasks, n, j0, nb, vt, hd);
    }
    tile_end(tasks, n, hd);
}
#endif

/* Causal attention of layer l for every row of a pass: each query head of row r over positions first .. pos[r] of
 * the row's cache (first = 0, or with window > 0 the last `window` positions), from the rotated queries in qkv
 * [rows][(heads + 2 kv_heads) hd] into attn [rows][heads hd]; scores: heads * rows * end floats, end the largest
 * position + 1. The caches hold this layer's keys and values of every row already. ops: the path's loops; tiling:
 * TILING_AUTO (tiles of at least TILE_MIN_TASKS or TILE_MIN_JOINT tasks), TILING_OFF or TILING_ON (the tiled loops
 * wherever the head width suits them). A row's numbers are the same whichever loops compute them. */
void attention_layer(const qrows *rows, int l, int nq, int n_kv, int hd, int window, float scale, const float *qkv,
                     float *attn, float *scores, int end, int threads, const struct attn_ops *ops, int tiling,
                     int bf16) {
    const int k = (int)rows->rows, group = nq / n_kv, kv_half = rows->kv_half;
    const int n_qkv = (nq + 2 * n_kv) * hd, n_attn = nq * hd;
    const size_t elem = kv_half ? sizeof(uint16_t) : sizeof(float);
    const int joint = hd == 64 && ops->joint_scores[kv_half][0] != NULL;
#ifdef SPECWISE_X86
    bf16 = bf16 && hd % 16 == 0 && hd <= 256;
#else
    bf16 = 0;
#endif
    const int tiles = bf16 || (tiling != TILING_OFF && ops->tile_scores != NULL && hd % 8 == 0 && hd <= 512);
    const int min_tasks = bf16 || tiling == TILING_ON ? 1 : joint ? TILE_MIN_JOINT : TILE_MIN_TASKS;
    float *const *k_rows = rows->k_rows, *const *v_rows = rows->v_rows;
    const int64_t *cap = rows->cap, *pos = rows->pos;
    /* tasks ordered by key-value head, then row, then query head, and split in contiguous ranges: a thread runs
     * the tasks that read the same keys and values one after the other. A thread's tasks of one key-value head whose
     * rows share a cache make a tile (attention_tile): each block of keys and values is read once for all of them.
     * Otherwise one task at a time, or where the path has joint loops (heads of 64), up to three of its heads that
     * share a key-value head and a row read them once */
#pragma omp parallel num_threads(threads)
    {
        int lo, hi;
        thread_share(nq * k, &lo, &hi);
        /* the thread's buffer of transposed keys, on the heap (64 KB: more than some threads' stacks hold); without
         * it the thread runs the per-row loops, whose numbers are the same */
        const size_t bf16_words = 2 * TILE_FLOATS + (size_t)(hi - lo < TILE_TASKS ? hi - lo : TILE_TASKS) * hd / 2;
        float *buf = !tiles || lo >= hi ? NULL
                     : bf16 ? aligned_alloc(64, (bf16_words * sizeof(uint32_t) + 63) & ~(size_t)63)
                            : aligned_alloc(64, TILE_FLOATS * sizeof(float));
        struct attn_task tasks[TILE_TASKS];
        for (int t = lo; t < hi;) {
            const int g = t / (k * group), r = (t / group) % k;
            if (buf) {
                /* the tile: tasks t .. e - 1, of key-value head g, whose rows share row r's caches */
                int e = t;
                const int stop = (g + 1) * k * group < hi ? (g + 1) * k * group : hi;
                for (; e < stop && e - t < TILE_TASKS; e++) {
                    const int rr = (e / group) % k, head = g * group + e % group;
                    if (k_rows[rr] != k_rows[r] || v_rows[rr] != v_rows[r] || cap[rr] != cap[r]) break;
                    const int p = (int)pos[rr];
                    struct attn_task *task = tasks + (e - t);
                    task->q = qkv + (size_t)rr * n_qkv + (size_t)head * hd;
                    task->sc = scores + (size_t)e * end;
                    task->out = attn + (size_t)rr * n_attn + (size_t)head * hd;
                    task->first = window > 0 && p + 1 > window ? p + 1 - window : 0;
                    task->last = p + 1;
                }
                if (e - t >= min_tasks) {
                    const size_t layer = (size_t)l * n_kv * cap[r] * hd, at = (layer + (size_t)g * cap[r] * hd) * elem;
#ifdef SPECWISE_X86
                    if (bf16)
                        attention_tile_bf16(tasks, e - t, (const char *)k_rows[r] + at, (const char *)v_rows[r] + at,
                                            kv_half, hd, scale, ops, (uint32_t *)buf);
                    else
#endif
                        attention_tile(tasks, e - t, (const char *)k_rows[r] + at, (const char *)v_rows[r] + at,
                                       kv_half, hd, scale, ops, buf);
                    t = e;
                    continue;
                }
            }
            if (bf16) {
                /* no buffer for the bfloat16 loops (which alone give this option's numbers): NaN, never other
                 * numbers */
                attn[(size_t)r * n_attn + (size_t)(g * group + t % group) * hd] = NAN;
                t++;
                continue;
            }
            const int head = g * group + t % group;
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
        free(buf);
    }
}
