/*
 * The decoder layers of the Llama family over quantized weights (quant.h), for the few rows (k = 1..32) of
 * decoding and verification, in one call:
 *   RMSNorm -> Q, K, V products (one parallel pass over the three) -> rotary + cache write -> causal attention
 *   over the cache -> output product + residual -> RMSNorm -> gate and up products (one pass) -> SiLU(gate) * up
 *   -> down product + residual.
 *
 * Layouts (float32, row-major, contiguous):
 *   x        [k, hidden]                     the residual stream, updated in place
 *   k_cache  [layers, n_kv, capacity, hd]    rows start .. start + k - 1 are written
 *   cos, sin [capacity, hd]                  rotary tables with the rotate-half sign folded into sin
 *   weights  7 per layer: q, k, v, o, gate, up, down
 *
 * Draft trees: with depth and anc set (else NULL), row r sits at position start + depth[r] while its keys and values
 * go to cache row start + r, and it attends to the cache before start and to the rows j <= r with anc[r * k + j].
 *
 * Everything here is plain C compiled for several instruction sets (target_clones picks one at load time); the
 * products are quant.c's. A row's result depends only on its own inputs and position, never on k.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

CLONES static void rms_norm_rows(const float *x, const float *w, float *y, int k, int n, float eps) {
    for (int r = 0; r < k; r++) {
        const float *xr = x + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        const float inv = 1.0f / sqrtf((float)(ss / n) + eps);
        for (int i = 0; i < n; i++) yr[i] = (xr[i] * inv) * w[i];
    }
}

/* Dot products of q with `len` keys of head_dim hd: eight partial sums per key, added in a fixed order. */
CLONES static void key_scores(const float *q, const float *keys, int len, int hd, float scale, float *sc) {
    for (int j = 0; j < len; j++) {
        const float *kj = keys + (size_t)j * hd;
        float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int d = 0; d < hd; d += 8)
            for (int l = 0; l < 8; l++) part[l] += q[d + l] * kj[d + l];
        sc[j] = (((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]))) * scale;
    }
}

CLONES static void weighted_values(const float *p, const float *vals, int len, int hd, float *out) {
    for (int d = 0; d < hd; d++) out[d] = 0.0f;
    for (int j = 0; j < len; j++) {
        const float pj = p[j], *v = vals + (size_t)j * hd;
        for (int d = 0; d < hd; d++) out[d] += pj * v[d];
    }
}

static void rotary(float *v, const float *c, const float *s, int hd) {
    float tmp[512];
    const int half = hd / 2;
    memcpy(tmp, v, (size_t)hd * sizeof(float));
    for (int d = 0; d < hd; d++) v[d] = tmp[d] * c[d] + tmp[(d + half) % hd] * s[d];
}

size_t specwise_qllama_scratch_floats(int hidden, int n_heads, int n_kv, int head_dim, int inter, int k) {
    size_t qkv = (size_t)(n_heads + 2 * n_kv) * head_dim;
    return (size_t)k * (2 * (size_t)hidden + qkv + (size_t)n_heads * head_dim + 3 * (size_t)inter);
}

/* Returns 0 on success, 1 when head_dim is too large, 2 for a bad weight count. */
int specwise_qllama_layers(int n_layers, int hidden, int n_heads, int n_kv, int head_dim, int inter, float eps,
                           const float *const *attn_norm, const qmat *weights, const float *const *qkv_b,
                           const float *const *mlp_norm, float *k_cache, float *v_cache, int capacity,
                           const float *cos_t, const float *sin_t, float *x, int k, int start, float *scratch,
                           float *scores, int threads, int mode, const int *depth, const unsigned char *anc) {
    if (head_dim > 512) return 1;
    const int hd = head_dim, nq = n_heads, group = n_heads / n_kv;
    const int n_qkv = (nq + 2 * n_kv) * hd, n_attn = nq * hd, end = start + k;
    const float scale = 1.0f / sqrtf((float)hd);
    float *h = scratch;                      /* [k, hidden] */
    float *tmp = h + (size_t)k * hidden;     /* [k, hidden] */
    float *qkv = tmp + (size_t)k * hidden;   /* [k, n_qkv] */
    float *attn = qkv + (size_t)k * n_qkv;   /* [k, n_attn] */
    float *gu = attn + (size_t)k * n_attn;   /* [k, 2 * inter] */
    float *act = gu + (size_t)k * 2 * inter; /* [k, inter] */

    for (int l = 0; l < n_layers; l++) {
        const qmat *w = weights + (size_t)7 * l;
        float *kc = k_cache + (size_t)l * n_kv * capacity * hd;
        float *vc = v_cache + (size_t)l * n_kv * capacity * hd;
        rms_norm_rows(x, attn_norm[l], h, k, hidden, eps);
        specwise_q_gemm(w, 3, h, qkv_b[l], qkv, k, mode, threads);
        for (int r = 0; r < k; r++) {
            const int pos = start + (depth ? depth[r] : r), slot = start + r;
            float *row = qkv + (size_t)r * n_qkv;
            const float *c = cos_t + (size_t)pos * hd, *s = sin_t + (size_t)pos * hd;
            for (int j = 0; j < nq + n_kv; j++) rotary(row + (size_t)j * hd, c, s, hd);
            for (int g = 0; g < n_kv; g++) {
                memcpy(kc + ((size_t)g * capacity + slot) * hd, row + (size_t)(nq + g) * hd, (size_t)hd * 4);
                memcpy(vc + ((size_t)g * capacity + slot) * hd, row + (size_t)(nq + n_kv + g) * hd, (size_t)hd * 4);
            }
        }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (int t = 0; t < nq * k; t++) {
            const int head = t % nq, r = t / nq, len = start + r + 1, g = head / group;
            const float *q = qkv + (size_t)r * n_qkv + (size_t)head * hd;
            const float *keys = kc + (size_t)g * capacity * hd, *vals = vc + (size_t)g * capacity * hd;
            float *sc = scores + (size_t)t * end;
            key_scores(q, keys, len, hd, scale, sc);
            if (anc) /* another branch of the tree: exp gives an exact zero below */
                for (int j = start; j < len; j++)
                    if (!anc[(size_t)r * k + (j - start)]) sc[j] = -INFINITY;
            float mx = -INFINITY;
            for (int j = 0; j < len; j++) mx = sc[j] > mx ? sc[j] : mx;
            float sum = 0.0f;
            for (int j = 0; j < len; j++) {
                sc[j] = expf(sc[j] - mx);
                sum += sc[j];
            }
            float *out = attn + (size_t)r * n_attn + (size_t)head * hd;
            weighted_values(sc, vals, len, hd, out);
            const float inv = 1.0f / sum;
            for (int d = 0; d < hd; d++) out[d] *= inv;
        }
        specwise_q_gemm(w + 3, 1, attn, NULL, tmp, k, mode, threads);
        for (size_t i = 0; i < (size_t)k * hidden; i++) x[i] += tmp[i];
        rms_norm_rows(x, mlp_norm[l], h, k, hidden, eps);
        specwise_q_gemm(w + 4, 2, h, NULL, gu, k, mode, threads);
        for (int r = 0; r < k; r++) {
            const float *gr = gu + (size_t)r * 2 * inter, *ur = gr + inter;
            float *ar = act + (size_t)r * inter;
            for (int i = 0; i < inter; i++) ar[i] = gr[i] / (1.0f + expf(-gr[i])) * ur[i];
        }
        specwise_q_gemm(w + 6, 1, act, NULL, tmp, k, mode, threads);
        for (size_t i = 0; i < (size_t)k * hidden; i++) x[i] += tmp[i];
    }
    return 0;
}
