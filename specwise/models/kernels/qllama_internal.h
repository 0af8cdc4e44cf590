/*
 * What the decoder layers' two files share (qllama.c: the layer loop, the entry points and their checks;
 * attention.c: the attention over the caches). Nothing here is exported (SW_HIDDEN).
 */
#ifndef SPECWISE_QLLAMA_INTERNAL_H
#define SPECWISE_QLLAMA_INTERNAL_H

#include "quant_internal.h" /* specwise.h, the target attributes, SW_HIDDEN */

/* e^x to about 2 ulp (Cody-Waite reduction, degree-7 Taylor polynomial on [-ln2/2, ln2/2]); 0 below -87. The
 * vector versions below compute the same operations lane by lane. */
static inline float exp_approx(float x) {
    const float c = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = floorf(fmaf(c, 1.44269504088896341f, 0.5f));
    const float p = exp_reduced(n, c);
    union {
        int32_t i;
        float f;
    } scale = {((int32_t)n + 127) << 23};
    return x < -87.0f ? 0.0f : p * scale.f;
}

#ifdef SPECWISE_X86
/* exp_approx on eight lanes */
TARGET_AVX2 static inline __m256 exp256(__m256 x) {
    const __m256 c = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(c, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    const __m256 p = exp_reduced256(n, c);
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    return _mm256_andnot_ps(low, y);
}
#endif

/* The attention's loops of one instruction path (attention.c), which the library's table of the path in use holds
 * (qkernels.attn); index [0] for a float32 cache, [1] for a float16 one (keys and values by their address). */
typedef void (*scores_fn)(const float *q, const void *keys, int len, int hd, float scale, float *sc);
typedef void (*values_fn)(const float *p, const void *vals, int len, int hd, float *out);
/* nh query heads of 64 that share a key-value head, each key and value read once for all of them */
typedef void (*joint_scores_fn)(const float *q, const void *keys, int len, float scale, float *sc, size_t ld);
typedef void (*joint_values_fn)(const float *p, size_t ld, const void *vals, int len, float *out);

/* One task of a tile (the tiled loops of attention.c): a query head of a row, the row of scores it fills (sc[j -
 * first] for position j: the score, then the unnormalised probability) and its output [hd], over the positions
 * first .. last - 1 of the cache; its largest score (mx) and the eight lane sums of its probabilities so far. */
struct attn_task {
    const float *q;
    float *sc;
    float *out;
    int first, last;
    float mx;
    float lanes[8];
};
/* keys [nb][hd] of the cache (float32, or float16 bits) to float32 kt[d * kb + j] for j < kb (zeros past nb) */
typedef void (*tile_keys_fn)(const void *keys, int nb, int hd, float *kt, int kb);
/* each task's scores of the positions j0 .. j0 + nb - 1 it attends to, from the keys in kt (kt[d * kb + j] the key
 * of position j0 + j): the same chain per score as scores_fn; the task's mx raised to the largest (NaN skipped) */
typedef void (*tile_scores_fn)(struct attn_task *t, int n, int j0, int nb, const float *kt, int kb, int hd,
                               float scale);
/* each task's output continued over the positions j0 .. j0 + nb - 1 it attends to, in increasing order, from the
 * values v [nb][hd] of the cache (float32, or float16 bits with half) and the task's probabilities:
 * out[d] = fma(p[j], v[j][d], out[d]) */
typedef void (*tile_values_fn)(const struct attn_task *t, int n, int j0, int nb, const void *v, int hd, int half);
struct attn_ops {
    scores_fn key_scores[2];                /* sc[j] = (q . keys[j]) * scale */
    values_fn weighted_values[2];           /* out[d] = sum_j p[j] v[j][d] */
    joint_scores_fn joint_scores[2][2];     /* [cache][nh - 2] for 2 or 3 heads of 64; NULL: one head at a time */
    joint_values_fn joint_values[2][2];
    float (*max)(const float *sc, int len); /* the largest score (NaN skipped) */
    int (*exp_sums)(float *sc, int len, float mx, float *a); /* e^(s - mx) in place over the first multiple of 8
                                                              * scores, summed into a[8]; the count done */
    /* the tiled loops (head widths a multiple of 8): every task of a tile over each block of positions, the block's
     * keys and values read once for all of them */
    tile_keys_fn tile_keys[2]; /* [cache] */
    tile_scores_fn tile_scores;
    /* e^(s - mx) in place over sc[0 .. n8 - 1] (n8 a multiple of 8), each added to a[j mod 8] in increasing j */
    void (*exp_lanes)(float *sc, int n8, float mx, float *a);
    tile_values_fn tile_values;
};

/* Scores to unnormalised probabilities in place (e^(s - max)); returns their sum (eight partial sums, added
 * pairwise). ops: the path in use's loops (q_kernels()->attn). */
SW_HIDDEN float softmax_unnormalised(float *sc, int len, const struct attn_ops *ops);

/* Causal attention of layer l for every row of a pass (see attention.c). */
SW_HIDDEN void attention_layer(const qrows *rows, int l, int nq, int n_kv, int hd, int window, float scale,
                               const float *qkv, float *attn, float *scores, int end, int threads,
                               const struct attn_ops *ops, int tiling, int bf16);
/* attention_layer's tiling: the layers' own choice, the per-row loops, the tiled loops (where the head width suits
 * them) */
enum { TILING_AUTO = -1, TILING_OFF = 0, TILING_ON = 1 };

#endif
