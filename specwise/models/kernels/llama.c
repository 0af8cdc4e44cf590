/*
 * The decoder layers of the Llama family for the few rows (k = 1..32) of decoding and verification, in one call.
 *
 * In the torch path a layer is ~20 small operators (norms, rotary, cache writes, attention, activation) around
 * its four matrix products; for a handful of rows their dispatch overhead costs as much as a third of the pass.
 * Here each layer is: RMSNorm -> fused QKV product -> rotary + cache write -> causal attention over the cache
 * -> output product + residual -> RMSNorm -> fused gate/up product -> SiLU(gate) * up -> down product + residual.
 * The products use specwise_small_gemm (smallgemm.c); attention is parallel over (head, row) pairs.
 *
 * Layouts (float32 unless said otherwise, row-major, contiguous; the four product weights may be float16):
 *   x        [k, hidden]                     the residual stream, updated in place
 *   k_cache  [layers, n_kv, capacity, hd]    rows start .. start + k - 1 are written
 *   cos, sin [capacity, hd]                  rotary tables with the rotate-half sign folded into sin
 *   scratch  specwise_qllama_scratch_floats(...) floats (qllama.c): the quantized layers carve theirs alike
 * Row r is at position start + r and attends causally.
 *
 * AVX2, FMA and F16C only (each function carries the target attribute): the entry point runs on the library's one
 * choice of path (specwise_q_isa) and refuses with SW_EISA, writing nothing, below AVX2.
 */
#if defined(__x86_64__) /* AVX2 + FMA intrinsics: x86-64 only; elsewhere the float kernels are absent */
#include <stddef.h>
#include <stdint.h>

#include "specwise.h"

#include "quant_internal.h" /* the target attributes */

/* The products read float32 weights, or float16 ones (half != 0: a drafter's copies, half the memory traffic). */
TARGET_AVX2 static inline void gemm(const float *x, const float *w, const float *bias, float *y, int k, int in, int out,
                        int threads, int half) {
    if (half)
        specwise_small_gemm_f16(x, (const uint16_t *)w, bias, y, k, in, out, threads);
    else
        specwise_small_gemm(x, w, bias, y, k, in, out, threads);
}

TARGET_AVX2 static void rms_norm(const float *x, const float *w, float *y, int k, int n, float eps) {
    for (int r = 0; r < k; r++) {
        const float *xr = x + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float inv = 1.0f / sqrtf((float)(ss / n) + eps);
        for (int i = 0; i < n; i++) yr[i] = (xr[i] * inv) * w[i];
    }
}

TARGET_AVX2 static inline float dot(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0.0f;
    if (n >= 8) {
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
        __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
        lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
        s = _mm_cvtss_f32(lo);
    }
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Rotate-half rotary embedding of one head in place: y[d] = x[d] cos[d] + x[(d + hd/2) % hd] sin[d]. */
TARGET_AVX2 static inline void rotary(float *v, const float *c, const float *s, int hd) {
    float tmp[512];
    int half = hd / 2;
    memcpy(tmp, v, (size_t)hd * sizeof(float));
    for (int d = 0; d < hd; d++) v[d] = tmp[d] * c[d] + tmp[(d + half) % hd] * s[d];
}

TARGET_AVX2 static void layers_avx2(int n_layers, int hidden, int n_heads, int n_kv, int head_dim, int inter,
                                    float eps, const float *const *attn_norm, const float *const *qkv_w,
                                    const float *const *qkv_b, const float *const *o_w, const float *const *o_b,
                                    const float *const *mlp_norm, const float *const *gate_up_w,
                                    const float *const *down_w, float *k_cache, float *v_cache, int capacity,
                                    const float *cos_t, const float *sin_t, float *x, int k, int start,
                                    float *scratch, float *scores, int threads, int half) {
    const int hd = head_dim, nq = n_heads, group = n_heads / n_kv;
    const int n_qkv = (nq + 2 * n_kv) * hd, n_attn = nq * hd, end = start + k;
    const float scale = 1.0f / sqrtf((float)hd);
    float *h = scratch;                          /* [k, hidden] */
    float *tmp = h + (size_t)k * hidden;         /* [k, hidden] */
    float *qkv = tmp + (size_t)k * hidden;       /* [k, n_qkv] */
    float *attn = qkv + (size_t)k * n_qkv;       /* [k, n_attn] */
    float *gu = attn + (size_t)k * n_attn;       /* [k, 2 * inter] */
    float *act = gu + (size_t)k * 2 * inter;     /* [k, inter] */

    for (int l = 0; l < n_layers; l++) {
        float *kc = k_cache + (size_t)l * n_kv * capacity * hd;
        float *vc = v_cache + (size_t)l * n_kv * capacity * hd;
        rms_norm(x, attn_norm[l], h, k, hidden, eps);
        gemm(h, qkv_w[l], qkv_b[l], qkv, k, hidden, n_qkv, threads, half);
        for (int r = 0; r < k; r++) {
            int pos = start + r, slot = pos;
            float *row = qkv + (size_t)r * n_qkv;
            const float *c = cos_t + (size_t)pos * hd, *s = sin_t + (size_t)pos * hd;
            for (int j = 0; j < nq + n_kv; j++) rotary(row + (size_t)j * hd, c, s, hd);
            for (int g = 0; g < n_kv; g++) {
                memcpy(kc + ((size_t)g * capacity + slot) * hd, row + (size_t)(nq + g) * hd, (size_t)hd * 4);
                memcpy(vc + ((size_t)g * capacity + slot) * hd, row + (size_t)(nq + n_kv + g) * hd, (size_t)hd * 4);
            }
        }
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int t = 0; t < nq * k; t++) {
            int head = t % nq, r = t / nq, len = start + r + 1, g = head / group;
            const float *q = qkv + (size_t)r * n_qkv + (size_t)head * hd;
            const float *keys = kc + (size_t)g * capacity * hd, *vals = vc + (size_t)g * capacity * hd;
            float *sc = scores + (size_t)t * end;
            float mx = -INFINITY;
            for (int j = 0; j < len; j++) {
                sc[j] = dot(q, keys + (size_t)j * hd, hd) * scale;
                if (sc[j] > mx) mx = sc[j];
            }
            float sum = 0.0f;
            for (int j = 0; j < len; j++) {
                sc[j] = expf(sc[j] - mx);
                sum += sc[j];
            }
            float *out = attn + (size_t)r * n_attn + (size_t)head * hd;
            for (int d = 0; d < hd; d++) out[d] = 0.0f;
            for (int j = 0; j < len; j++) {
                const float p = sc[j], *v = vals + (size_t)j * hd;
                for (int d = 0; d < hd; d++) out[d] += p * v[d];
            }
            const float inv = 1.0f / sum;
            for (int d = 0; d < hd; d++) out[d] *= inv;
        }
        gemm(attn, o_w[l], o_b[l], tmp, k, n_attn, hidden, threads, half);
        for (size_t i = 0; i < (size_t)k * hidden; i++) x[i] += tmp[i];
        rms_norm(x, mlp_norm[l], h, k, hidden, eps);
        gemm(h, gate_up_w[l], NULL, gu, k, hidden, 2 * inter, threads, half);
        for (int r = 0; r < k; r++) {
            const float *gr = gu + (size_t)r * 2 * inter, *ur = gr + inter;
            float *ar = act + (size_t)r * inter;
            for (int i = 0; i < inter; i++) ar[i] = gr[i] / (1.0f + expf(-gr[i])) * ur[i];
        }
        gemm(act, down_w[l], NULL, tmp, k, inter, hidden, threads, half);
        for (size_t i = 0; i < (size_t)k * hidden; i++) x[i] += tmp[i];
    }
}

/* Returns 0 on success, 1 when head_dim is too large for the rotary buffer, SW_EISA below the AVX2 path. */
int specwise_llama_layers(int n_layers, int hidden, int n_heads, int n_kv, int head_dim, int inter, float eps,
                          const float *const *attn_norm, const float *const *qkv_w, const float *const *qkv_b,
                          const float *const *o_w, const float *const *o_b, const float *const *mlp_norm,
                          const float *const *gate_up_w, const float *const *down_w, float *k_cache,
                          float *v_cache, int capacity, const float *cos_t, const float *sin_t, float *x, int k,
                          int start, float *scratch, float *scores, int threads, int half) {
    if (head_dim > 512) return 1;
    if (specwise_q_isa() < ISA_AVX2) return SW_EISA;
    layers_avx2(n_layers, hidden, n_heads, n_kv, head_dim, inter, eps, attn_norm, qkv_w, qkv_b, o_w, o_b, mlp_norm,
                gate_up_w, down_w, k_cache, v_cache, capacity, cos_t, sin_t, x, k, start, scratch, scores, threads,
                half);
    return 0;
}
#endif /* __x86_64__ */
