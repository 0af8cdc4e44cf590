/*
 * The decoder layers of the Llama family, over quantized or float weights (quant.h), for the few rows (k = 1..32)
 * of decoding and verification, in one call: the one layer of every native model (the GGUF models' and the float32
 * models'):
 *   RMSNorm -> Q, K, V products (one parallel pass over the three, + bias) -> rotary + cache write -> causal
 *   attention over the cache -> output product (+ bias) + residual -> RMSNorm -> gate and up products (one pass) ->
 *   SiLU(gate) * up -> down product + residual (and what a family's qarch adds).
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
 * The weights are qmats of any kind (quant.h): a GGUF file's blocks re-packed into tiles, or float32 / float16 rows
 * (KIND_ROWS: the float32 models and a drafter's float16 copies), so this one layer serves both. The attention over
 * the caches is attention.c's, the products quant_gemm.c's (specwise_q_gemm, for every kind). Every loop is the one
 * of the library's table of the path in use (qkernels of quant_internal.h: chosen once from the CPU's flags, lowered
 * by specwise_q_set_isa), each vector function with its own target attribute; the paths agree bit for bit. A row's
 * result depends only on its own inputs and position, never on k.
 */
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "specwise.h"

#include "qllama_internal.h"

/* The RMS norm of k rows of n: a double sum of squares in four chains, the same operations on every path (the
 * compiler vectorises each path's copy for its own instructions). */
INLINE void rms_norm_body(const float *x, const float *w, float *y, int k, int n, float eps) {
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

/* Each path's copy of the loops below (the compiler vectorises each for its own instructions; the operations and
 * their order are the same): the table of the path in use (qkernels of quant_internal.h) holds them. */
#define GELU_K1 (-1.5957691216057308f)   /* -2 sqrt(2 / pi) */
#define GELU_K3 (-0.07135481627159871f) /* -2 sqrt(2 / pi) 0.044715 */

/* act = SiLU(gate) * up from index i on */
INLINE void silu_tail(const float *gate, const float *up, float *act, int i, int n) {
    for (; i < n; i++) act[i] = gate[i] / (1.0f + exp_approx(-gate[i])) * up[i];
}

/* GeGLU's activation from index i on: act = gelu(gate) * up with the tanh approximation of GELU (Gemma's
 * gelu_pytorch_tanh), 0.5 g (1 + tanh(u)) = g / (1 + e^(-2u)) with u = sqrt(2 / pi) (g + 0.044715 g^3):
 * -2u = g (K1 + K3 g^2). */
INLINE void gelu_tail(const float *gate, const float *up, float *act, int i, int n) {
    for (; i < n; i++) {
        const float g = gate[i];
        act[i] = g / (1.0f + exp_approx(g * fmaf(GELU_K3, g * g, GELU_K1))) * up[i];
    }
}

void rms_norm_portable(const float *x, const float *w, float *y, int k, int n, float eps) {
    rms_norm_body(x, w, y, k, n, eps);
}
void silu_mul_portable(const float *gate, const float *up, float *act, int n) { silu_tail(gate, up, act, 0, n); }
void gelu_mul_portable(const float *gate, const float *up, float *act, int n) { gelu_tail(gate, up, act, 0, n); }
/* a float16 cache's writes: rounded to nearest even (what F16C's vcvtps2ph does), read back exactly */
void store_half_portable(uint16_t *dst, const float *src, int n) {
    for (int i = 0; i < n; i++) dst[i] = f2h(src[i]);
}

#ifdef SPECWISE_X86
TARGET_AVX2 void rms_norm_avx2(const float *x, const float *w, float *y, int k, int n, float eps) {
    rms_norm_body(x, w, y, k, n, eps);
}

TARGET_AVX512 void rms_norm_avx512(const float *x, const float *w, float *y, int k, int n, float eps) {
    rms_norm_body(x, w, y, k, n, eps);
}

/* eight lanes at a time, then the portable loop: the same operations */
TARGET_AVX2 void silu_mul_avx2(const float *gate, const float *up, float *act, int n) {
    int i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(act + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    silu_tail(gate, up, act, i, n);
}

TARGET_AVX2 void gelu_mul_avx2(const float *gate, const float *up, float *act, int n) {
    int i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), k1 = _mm256_set1_ps(GELU_K1), k3 = _mm256_set1_ps(GELU_K3);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 z = _mm256_mul_ps(g, _mm256_fmadd_ps(k3, _mm256_mul_ps(g, g), k1));
        const __m256 e = exp256(z);
        _mm256_storeu_ps(act + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    gelu_tail(gate, up, act, i, n);
}

TARGET_AVX2 void store_half_avx2(uint16_t *dst, const float *src, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = f2h(src[i]);
}
#endif

/* the RMS norm on the path in use */
static void rms_norm_rows(const float *x, const float *w, float *y, int k, int n, float eps) {
    q_kernels()->rms_norm(x, w, y, k, n, eps);
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

/* Whether a matrix the kernels can read is there (qmat_ok: its kind, format and shape), with `in` inputs (and `out`
 * outputs when out > 0) */
static int mat_fits(const qmat *w, int64_t out, int64_t in) {
    return qmat_ok(w) && w->in == in && (out <= 0 || w->out == out);
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

/* Whether the run's attention is one this CPU runs */
static int attention_fits(const qrun *run) {
    return run->attention == ATTN_FLOAT32 || (run->attention == ATTN_BF16 && specwise_attention_bf16_supported());
}

/* Whether a pass's rows, work buffers and options fit the (checked) shape: every row's cache there and its
 * position inside it and inside the rotary tables, and x, scratch and scores large enough. Returns 0, or QL_EFIT,
 * QL_EWORK, QL_EBUFFER. */
static int rows_check(const qshape *shape, const qrows *rows, const qwork *work, const qrun *run) {
    if (!rows || !work || !run) return QL_EFIT;
    if (rows->rows < 0 || rows->rows > QL_MAX_ROWS || run->threads < 1 || run->threads > 4096 ||
        (run->mode != MODE_EXACT && run->mode != MODE_Q8) || (rows->kv_half != 0 && rows->kv_half != 1) ||
        !attention_fits(run))
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
    const float *const *attn_norm = layers->attn_norm, *const *qkv_b = layers->qkv_bias, *const *o_b = layers->o_bias;
    const float *const *mlp_norm = layers->mlp_norm;
    const qmat *weights = layers->weights;
    float *const *k_rows = rows->k_rows, *const *v_rows = rows->v_rows;
    const int64_t *cap = rows->cap, *pos = rows->pos;
    const float *cos_t = rows->cos, *sin_t = rows->sin;
    float *x = rows->x, *scratch = work->scratch, *scores = work->scores;
    const qarch llama = {0};
    const qarch *a = layers->arch ? layers->arch : &llama;
    const qkernels *K = q_kernels();
    const int hd = (int)shape->head_dim, nq = (int)shape->heads;
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
        K->rms_norm(x, attn_norm[l], h, k, hidden, eps);
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
                K->rms_norm(row + (size_t)j * hd, a->q_norm[l], row + (size_t)j * hd, 1, hd, eps);
            for (int j = nq; a->k_norm && j < nq + n_kv; j++)
                K->rms_norm(row + (size_t)j * hd, a->k_norm[l], row + (size_t)j * hd, 1, hd, eps);
            for (int j = 0; j < nq + n_kv; j++) rotary(row + (size_t)j * hd, c, s, hd);
            for (int g = 0; g < n_kv; g++) {
                const size_t at = ((size_t)g * cap[r] + p) * hd;
                const float *key = row + (size_t)(nq + g) * hd, *val = row + (size_t)(nq + n_kv + g) * hd;
                if (kv_half) {
                    K->store_half(kh + at, key, hd);
                    K->store_half(vh + at, val, hd);
                } else {
                    memcpy(kc + at, key, (size_t)hd * 4);
                    memcpy(vc + at, val, (size_t)hd * 4);
                }
            }
        }
        MARK(PART_REST);
        attention_layer(rows, l, nq, n_kv, hd, a->window ? a->window[l] : 0, scale, qkv, attn, scores, end, threads,
                        K->attn, TILING_AUTO, run->attention == ATTN_BF16);
        MARK(PART_ATTENTION);
        specwise_q_gemm(w + 3, 1, attn, o_b ? o_b[l] : NULL, tmp, k, mode, threads);
        MARK(PART_PRODUCTS);
        if (a->post_attn_norm) K->rms_norm(tmp, a->post_attn_norm[l], tmp, k, hidden, eps);
        for (size_t i = 0; i < (size_t)k * hidden; i++) x[i] += tmp[i];
        K->rms_norm(x, mlp_norm[l], h, k, hidden, eps);
        MARK(PART_REST);
        specwise_q_gemm(w + 4, 2, h, NULL, gu, k, mode, threads);
        MARK(PART_PRODUCTS);
        for (int r = 0; r < k; r++) {
            const float *gr = gu + (size_t)r * 2 * inter;
            (a->act == ACT_GELU_TANH ? K->gelu_mul : K->silu_mul)(gr, gr + inter, act + (size_t)r * inter, inter);
        }
        MARK(PART_REST);
        specwise_q_gemm(w + 6, 1, act, NULL, tmp, k, mode, threads);
        MARK(PART_PRODUCTS);
        if (a->post_mlp_norm) K->rms_norm(tmp, a->post_mlp_norm[l], tmp, k, hidden, eps);
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

/* The attention of one layer alone (attention_layer, the layers' own loops): every query head of the pass's rows
 * against its row's cache, from the queries in qkv [rows][(heads + 2 kv_heads) head_dim] (the keys and values there
 * are not read: the caches already hold them) into attn [rows][heads head_dim]; window > 0: the last `window`
 * positions only; tiling: TILING_AUTO (-1, the layers' choice), TILING_OFF (0, the per-row loops) or TILING_ON (1,
 * the tiled loops wherever the head width suits them). Returns 0, or QL_EFIT for a shape, layer, window, tiling,
 * pointer or position that does not fit, QL_EWORK for scores smaller than heads * rows * (the largest position + 1),
 * before anything is written. */
int specwise_qllama_attention(const qshape *shape, const qrows *rows, int64_t layer, int64_t window, float scale,
                              const float *qkv, float *attn, const qwork *work, const qrun *run, int64_t tiling) {
    if (!shape || !rows || !work || !run || !qkv || !attn) return QL_EFIT;
    if (specwise_qllama_scratch_floats(shape, 1) < 0 || shape->layers < 1 || shape->layers > QMAX_DIM ||
        shape->heads % shape->kv_heads || shape->head_dim > 512 || shape->head_dim % 2 ||
        (shape->heads + 2 * shape->kv_heads) * shape->head_dim > QMAX_DIM)
        return QL_EFIT;
    if (layer < 0 || layer >= shape->layers || window < 0 || window > QMAX_DIM || tiling < TILING_AUTO ||
        tiling > TILING_ON || rows->rows < 0 || rows->rows > QL_MAX_ROWS || run->threads < 1 || run->threads > 4096 ||
        (rows->kv_half != 0 && rows->kv_half != 1) || !attention_fits(run))
        return QL_EFIT;
    const int64_t k = rows->rows;
    if (k == 0) return QL_OK;
    if (!rows->k_rows || !rows->v_rows || !rows->cap || !rows->pos || !work->scores) return QL_EFIT;
    int64_t end = 0;
    for (int64_t r = 0; r < k; r++) {
        if (!rows->k_rows[r] || !rows->v_rows[r] || rows->cap[r] < 1 || rows->cap[r] > QMAX_DIM || rows->pos[r] < 0 ||
            rows->pos[r] >= rows->cap[r])
            return QL_EFIT;
        end = rows->pos[r] + 1 > end ? rows->pos[r] + 1 : end;
    }
    const int64_t need = mul64(mul64(shape->heads, k), end);
    if (need < 0 || work->scores_floats < need) return QL_EWORK;
    attention_layer(rows, (int)layer, (int)shape->heads, (int)shape->kv_heads, (int)shape->head_dim, (int)window,
                    scale, qkv, attn, work->scores, (int)end, (int)run->threads, q_kernels()->attn, (int)tiling,
                    run->attention == ATTN_BF16);
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
        *out->top_prob = 1.0f / softmax_unnormalised(e, V, q_kernels()->attn);
    }
    return QL_OK;
}
