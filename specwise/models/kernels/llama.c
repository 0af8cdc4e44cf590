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
 *   cos, sin [table_rows, hd]                rotary tables with the rotate-half sign folded into sin
 *   scratch  specwise_qllama_scratch_floats(...) floats (qllama.c): the quantized layers carve theirs alike
 * Row r is at position start + r and attends causally.
 *
 * The entry point takes its arguments in structs (specwise.h: the quantized layers' qshape, qwork and qrun, and
 * flayers, frows), every count and size 64-bit, and checks them against each other before anything is written
 * (float_layers_check, float_rows_check), with the quantized layers' statuses.
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
        gemm(h, qkv_w[l], qkv_b ? qkv_b[l] : NULL, qkv, k, hidden, n_qkv, threads, half);
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
        gemm(attn, o_w[l], o_b ? o_b[l] : NULL, tmp, k, n_attn, hidden, threads, half);
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

/* a * b, or -1 when either is negative or the product does not fit in 64 bits */
static int64_t mul64(int64_t a, int64_t b) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return -1;
    return r;
}

/* Whether the shape and the weights fit together: every width inside what the kernels index with an int, heads in
 * whole groups, an even head width, and every layer's norms and product weights there. Returns 0, or QL_EHEAD /
 * QL_EFIT. */
static int float_layers_check(const qshape *shape, const flayers *layers) {
    if (!shape || !layers) return QL_EFIT;
    if (shape->head_dim > 512) return QL_EHEAD;
    if (specwise_qllama_scratch_floats(shape, 1) < 0 || shape->layers < 1 || shape->layers > QMAX_DIM ||
        shape->heads % shape->kv_heads || shape->head_dim < 2 || shape->head_dim % 2 ||
        (shape->heads + 2 * shape->kv_heads) * shape->head_dim > QMAX_DIM || 2 * shape->inter > QMAX_DIM)
        return QL_EFIT;
    if (layers->entries != shape->layers || (layers->half != 0 && layers->half != 1) || !layers->attn_norm ||
        !layers->qkv_w || !layers->o_w || !layers->mlp_norm || !layers->gate_up_w || !layers->down_w)
        return QL_EFIT;
    for (int64_t l = 0; l < shape->layers; l++)
        if (!layers->attn_norm[l] || !layers->qkv_w[l] || !layers->o_w[l] || !layers->mlp_norm[l] ||
            !layers->gate_up_w[l] || !layers->down_w[l])
            return QL_EFIT;
    return QL_OK;
}

/* Whether one sequence's rows, the work buffers and the options fit the (checked) shape: positions start ..
 * start + rows - 1 inside the caches and the rotary tables, and x, scratch and scores large enough. Returns 0, or
 * QL_EFIT, QL_EWORK, QL_EBUFFER. */
static int float_rows_check(const qshape *shape, const frows *rows, const qwork *work, const qrun *run) {
    if (!rows || !work || !run) return QL_EFIT;
    if (rows->rows < 0 || rows->rows > QL_MAX_ROWS || run->threads < 1 || run->threads > 4096 ||
        run->mode != MODE_EXACT)
        return QL_EFIT;
    const int64_t k = rows->rows;
    if (k == 0) return QL_OK;
    if (!rows->x || !rows->k_cache || !rows->v_cache || !rows->cos || !rows->sin || !work->scratch || !work->scores)
        return QL_EFIT;
    if (rows->cap < 1 || rows->cap > QMAX_DIM || rows->start < 0 || rows->start > rows->cap - k) return QL_EFIT;
    const int64_t cache = mul64(mul64(mul64(shape->layers, shape->kv_heads), rows->cap), shape->head_dim);
    const int64_t pairs = mul64(shape->heads, k); /* the attention's (head, row) pairs, counted with an int */
    if (cache < 0 || pairs < 0 || pairs > INT32_MAX) return QL_EFIT;
    const int64_t end = rows->start + k;
    if (rows->table_rows < end) return QL_EBUFFER;
    if (rows->x_floats < k * shape->hidden) return QL_EBUFFER;
    const int64_t scores = mul64(pairs, end);
    if (work->scratch_floats < specwise_qllama_scratch_floats(shape, k) || scores < 0 || work->scores_floats < scores)
        return QL_EWORK;
    return QL_OK;
}

/* The layers over one sequence's rows (layers_avx2). Returns 0, or a status of specwise.h (1, 5, 6, 7, SW_EISA),
 * checked before anything is written. */
int specwise_llama_layers(const qshape *shape, const flayers *layers, const frows *rows, const qwork *work,
                          const qrun *run) {
    if (specwise_q_isa() < ISA_AVX2) return SW_EISA;
    int status = float_layers_check(shape, layers);
    if (status == QL_OK) status = float_rows_check(shape, rows, work, run);
    if (status != QL_OK) return status;
    if (rows->rows == 0) return QL_OK;
    /* every value below fits in an int: the checks above bound each by 2^30, and the (head, row) pairs too */
    layers_avx2((int)shape->layers, (int)shape->hidden, (int)shape->heads, (int)shape->kv_heads,
                (int)shape->head_dim, (int)shape->inter, shape->eps, layers->attn_norm, layers->qkv_w, layers->qkv_b,
                layers->o_w, layers->o_b, layers->mlp_norm, layers->gate_up_w, layers->down_w, rows->k_cache,
                rows->v_cache, (int)rows->cap, rows->cos, rows->sin, rows->x, (int)rows->rows, (int)rows->start,
                work->scratch, work->scores, (int)run->threads, layers->half);
    return QL_OK;
}
#endif /* __x86_64__ */
