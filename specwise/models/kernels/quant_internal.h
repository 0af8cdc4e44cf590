/*
 * What the quantized kernels' files share (quant_repack.c, quant_gemm.c, quant_portable.c, quant_avx2.c,
 * quant_avx512.c, logits.c): the x86 target attributes, the activations of MODE_Q8, the scale and value readers of
 * the tiles, and the prototypes of the kernels the driver calls. Nothing here is exported (SW_HIDDEN). The other
 * kernel files (smallgemm.c, qllama.c, attention.c, sample.c) include it too: every kernel of the library takes its
 * path from the one table chosen here (qkernels: q_kernels, specwise_q_isa; lowered by specwise_q_set_isa), and no
 * file but quant_gemm.c reads the CPU's flags or compares instruction paths.
 *
 * Multi-row products over quantized weights: y[k][out] = x[k][in] . W^T for the few rows (k = 1..32) of decoding
 * and verification, reading each weight block once per pass and applying it to every row.
 *
 * Layout (see quant.h): tiles of 16 output rows. In a tile, each 64-byte group holds 4 bytes per output row:
 *   KIND_Q4: group g of block b, row lane L, byte j = q[L][32b + 4g + j] | q[L][32b + 16 + 4g + j] << 4  (g < 4)
 *   KIND_U8: group g of block b, row lane L, byte j = q[L][B b + 4g + j]                         (g < B / 4)
 *   KIND_Q6: block b (16 inputs) in 3 groups, row lane L, byte j: group g < 3 holds q[L][16b + 4g + j] in its low
 *            6 bits and 2 bits of q[L][16b + 12 + j] in its top 2 (group 0 the low ones, group 2 the high ones):
 *            KIND_U8's 4 groups in 3/4 of the bytes, each unpacked with a few bitwise operations
 *   KIND_Q5: KIND_Q4's 4 groups (the low 4 bits), then 64 bytes of fifth bits: 8 masks of 64 bits, mask g < 4 for
 *            the low nibbles of group g and mask 4 + g for its high nibbles, bit n of a mask for byte n of its group
 *            (one bit per byte of the unpacked group: an AVX-512 byte mask as it is)
 *   KIND_F32: input i, row lane L: float w[L][i]
 * Scales s (and m) are [tile][block][16]: float16 or float32, or (K-quants, sub > 0) int8 sub-scales whose factors d
 * (and dmin) are [tile][super-block][16]; they are read only through scale_at, ld_scale512 and ld_scale256, which
 * give s = d * sc and m = -(dmin * mn) in float32. A 512-bit register is one group: 16 output rows x 4 inputs, which is
 * what VNNI's dot product of 4 bytes wants, and unpacking one group serves every row of x.
 *
 * Two evaluations of the same weights (mode):
 *   MODE_EXACT  float32 activations: w = fma(q - offset, s, m), accumulated in float32;
 *   MODE_Q8     activations quantized per block of 32 to int8 (scale dx = max|x| / 127), integer dot products
 *               per weight block, then y += (s * dx) * sum + m * dx * sum(qx).
 *
 * A row's result never depends on how many rows share the pass: every output element is computed by the same
 * operations in the same order whatever k is (exact: two float accumulators, inputs with i mod 32 < 16 in the
 * first, the others in the second, in increasing i, added at the end; q8: integer sums, whose order does not
 * matter, then one float update per weight block in increasing order). Rows are grouped, and several tiles are
 * processed together when there are few rows, only to give the core independent work; that changes no
 * arithmetic. The portable, AVX2 and AVX-512 paths follow the same order, so they agree bit for bit.
 */
#ifndef SPECWISE_QUANT_INTERNAL_H
#define SPECWISE_QUANT_INTERNAL_H

#include "specwise.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* SPECWISE_PORTABLE_ONLY builds the portable path alone, as on a machine of another architecture (to test that build
 * on x86) */
#if (defined(__x86_64__) || defined(__i386__)) && !defined(SPECWISE_PORTABLE_ONLY)
#include <immintrin.h>
#define SPECWISE_X86 1
#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#endif
#define INLINE static inline __attribute__((always_inline))
/* a function shared between the kernels' files, not exported by the library */
#define SW_HIDDEN __attribute__((visibility("hidden")))

#ifdef _OPENMP
#include <omp.h>
#endif
/* Inside a parallel region: this thread's contiguous share [*lo, *hi) of `total` tasks (static, in thread order). */
INLINE void thread_share(int total, int *lo, int *hi) {
#ifdef _OPENMP
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
#else
    const int tid = 0, nth = 1;
#endif
    *lo = (int)((long long)total * tid / nth);
    *hi = (int)((long long)total * (tid + 1) / nth);
}

/* ---- activations for MODE_Q8 ------------------------------------------------------------------------------ */

typedef struct {
    const float *x; /* [k][in] */
    int ldx;
    int8_t *qx;     /* [k][in] */
    float *dx;      /* [k][in / 32] */
    float *dsum;    /* [k][in / 32]: dx * sum of qx over the block */
    int32_t *isum;  /* [k][in / 16]: sum of qx over each half block */
} acts;


/* The scales of a tile are read only here and in ld_scale512 / ld_scale256: which = 0 gives s, 1 gives m, at index
 * i = (tile * blocks + block) * 16 + lane. With sub-scales (sub = k > 0) the factor of block index i is at
 * (i / 16 / 2^k) * 16 + i % 16, and s = d * sc, m = (-dmin) * mn in float32: the values gguf computes (products
 * of float16 by 6- or 8-bit integers are exact, and negation commutes with rounding, signed zeros included). */
static inline size_t factor_index(const qmat *w, size_t i) { return (i >> (4 + w->sub) << 4) | (i & 15); }

static inline float scale_at(const qmat *w, size_t i, int which) {
    const void *p = which ? w->m : w->s;
    if (w->sub) {
        const void *f = which ? w->md : w->sd;
        const size_t fi = factor_index(w, i);
        const float d = w->half ? half_to_float(((const uint16_t *)f)[fi]) : ((const float *)f)[fi];
        return d * (float)((const int8_t *)p)[i];
    }
    return w->half ? half_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline int q_at(const qmat *w, int t, int b, int e, int L) {
    const int nb = w->in / w->block;
    if (w->kind == KIND_Q4) {
        int ee = e % 16, g = ee / 4, j = ee % 4;
        uint8_t v = w->q[(((size_t)t * nb + b) * 4 + g) * 64 + (size_t)L * 4 + j];
        return e < 16 ? (v & 0xF) : (v >> 4);
    }
    if (w->kind == KIND_Q5) {
        int ee = e % 16, g = ee / 4, bit = L * 4 + ee % 4;
        const uint8_t *blk = w->q + ((size_t)t * nb + b) * 320;
        int lo = e < 16 ? (blk[g * 64 + bit] & 0xF) : (blk[g * 64 + bit] >> 4);
        return lo | (((blk[256 + (e < 16 ? g : 4 + g) * 8 + bit / 8] >> (bit % 8)) & 1) << 4);
    }
    if (w->kind == KIND_Q6) {
        int g = e / 4, j = e % 4;
        const uint8_t *base = w->q + ((size_t)t * nb + b) * 3 * 64 + (size_t)L * 4 + j;
        if (g < 3) return base[g * 64] & 0x3F;
        return (base[0] >> 6) | ((base[64] >> 6) << 2) | ((base[128] >> 6) << 4);
    }
    int g = e / 4, j = e % 4;
    return w->q[(((size_t)t * nb + b) * (w->block / 4) + g) * 64 + (size_t)L * 4 + j];
}

/* ---- one instruction path's kernels (quant_portable.c, quant_avx2.c, quant_avx512.c) ---------------------- */

/* MODE_Q8's activations of k rows of x: per block of 32, the int8 values, their scale and sums (quant_portable.c) */
typedef void (*quantize_fn)(const float *x, int k, int in, acts *a);
/* TT tiles from t0 (the last holding n valid rows) for R <= 8 rows of x: the exact products, and MODE_Q8 for the
 * weights without an interleaved kernel (a: their activations) */
typedef void (*tiles_fn)(const qmat *w, int t0, int TT, const float *x, int ldx, const acts *a, int mode, float *y,
                         int ldy, int R, int n);
/* MODE_Q8 for tile t (n valid rows) and R <= 8 rows whose activations are interleaved per block of 32 (qx
 * [block][row][32], dx and ds [block][row]; corr [weight block][row]: offset * sum(qx) over the weight's block) */
typedef void (*q8il_fn)(const qmat *w, int t, const int8_t *qx, const float *dx, const float *ds, const int32_t *corr,
                        float *y, int ldy, int n, int R);
/* The interleaved kernels of one kind: plain, with m, with the offset correction corr, signed bytes (offset 128
 * taken as signed weights, no correction). */
enum { Q8IL_PLAIN = 0, Q8IL_M = 1, Q8IL_C = 2, Q8IL_S = 3, Q8IL_VARIANTS = 4 };

/* KIND_ROWS: y[r][o] = x[r][0 .. in) . w[o][0 .. in) for outputs o0 <= o < o1 and rows r < k (smallgemm.c) */
typedef void (*rows_fn)(const qmat *w, int o0, int o1, const float *x, int k, float *y, int ldy);
/* the RMS norm of k rows of n (qllama.c) */
typedef void (*norm_fn)(const float *x, const float *w, float *y, int k, int n, float eps);
/* act = f(gate) * up over n values: SiLU or tanh GELU (qllama.c) */
typedef void (*glu_fn)(const float *gate, const float *up, float *act, int n);
/* n floats rounded to float16 (qllama.c: a float16 cache's writes) */
typedef void (*half_fn)(uint16_t *dst, const float *src, int n);
struct attn_ops;     /* attention.c: the attention's loops (qllama_internal.h) */
struct sample_loops; /* sample.c: the sampling distributions' row loops */

/* Everything the kernels call, for one instruction path, chosen once (q_kernels): the products' kernels per tile
 * kind, in the spirit of a table of type traits, and the loops of the layers, their attention, the logits scan and
 * sampling; every file reaches its path's loops through this table. */
typedef struct {
    int isa;                                /* ISA_* */
    quantize_fn quantize;                   /* MODE_Q8's activations */
    tiles_fn tiles;                         /* see tiles_fn */
    q8il_fn q8il[KIND_Q5 + 1][Q8IL_VARIANTS]; /* per kind and variant; NULL where the path has none (then: tiles) */
    unsigned char tiles_for[2][9];          /* tiles per call [MODE_Q8 with quantized weights][rows 1..8]: enough
                                             * independent accumulators to hide the latency of the FMAs */
    float (*row_max)(const float *x, int n, int *nan); /* logits.c: the largest non-NaN value, *nan = 1 if any */
    int (*find)(const float *x, int n, float v);      /* logits.c: the first index of v (n when none) */
    rows_fn rows;                           /* the products of KIND_ROWS */
    norm_fn rms_norm;                       /* the layers' loops */
    glu_fn silu_mul, gelu_mul;
    half_fn store_half;
    const struct attn_ops *attn;            /* the attention's loops */
    const struct sample_loops *sample;      /* the sampling rows' loops */
} qkernels;

SW_HIDDEN extern const qkernels qk_portable;
#ifdef SPECWISE_X86
SW_HIDDEN extern const qkernels qk_avx2, qk_avx512;
#endif
/* Whether a qmat is a matrix the kernels can read: tiles of a known kind, block and shape, or float rows
 * (quant_gemm.c; every entry point that takes a qmat checks it). */
SW_HIDDEN int qmat_ok(const qmat *w);
/* The kernels of the path in use (quant_gemm.c; chosen with the path: first use or specwise_q_set_isa). */
SW_HIDDEN const qkernels *q_kernels(void);

/* e^(x - n ln2) for an integral n with |x - n ln2| <= ln2 / 2: Cody-Waite reduction (ln 2 in two parts, the first
 * exact in float) and the degree-7 Taylor polynomial (Horner, fused multiply-adds). The exp approximations of the
 * layers (exp_approx, qllama_internal.h) and of sampling (exp_neg, sample.c) round n and scale by 2^n each their
 * own way, around this shared core. */
static inline float exp_reduced(float n, float x) {
    float r = fmaf(n, -0.693145751953125f, x);
    r = fmaf(n, -1.428606765330187e-06f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    return fmaf(p, r, 1.0f);
}

#ifdef SPECWISE_X86
/* exp_reduced on eight lanes: the same operations in the same order */
TARGET_AVX2 static inline __m256 exp_reduced256(__m256 n, __m256 x) {
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    return _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
}
#endif

/* The other files' loops of each path, which the tables of quant_portable.c, quant_avx2.c and quant_avx512.c hold */
SW_HIDDEN void rows_portable(const qmat *w, int o0, int o1, const float *x, int k, float *y, int ldy);
SW_HIDDEN void rms_norm_portable(const float *x, const float *w, float *y, int k, int n, float eps);
SW_HIDDEN void silu_mul_portable(const float *gate, const float *up, float *act, int n);
SW_HIDDEN void gelu_mul_portable(const float *gate, const float *up, float *act, int n);
SW_HIDDEN void store_half_portable(uint16_t *dst, const float *src, int n);
SW_HIDDEN extern const struct attn_ops attn_portable;
SW_HIDDEN extern const struct sample_loops sample_portable;
#ifdef SPECWISE_X86
TARGET_AVX2 SW_HIDDEN void rows_avx2(const qmat *w, int o0, int o1, const float *x, int k, float *y, int ldy);
TARGET_AVX2 SW_HIDDEN void rms_norm_avx2(const float *x, const float *w, float *y, int k, int n, float eps);
TARGET_AVX512 SW_HIDDEN void rms_norm_avx512(const float *x, const float *w, float *y, int k, int n, float eps);
TARGET_AVX2 SW_HIDDEN void silu_mul_avx2(const float *gate, const float *up, float *act, int n);
TARGET_AVX2 SW_HIDDEN void gelu_mul_avx2(const float *gate, const float *up, float *act, int n);
TARGET_AVX2 SW_HIDDEN void store_half_avx2(uint16_t *dst, const float *src, int n);
SW_HIDDEN extern const struct attn_ops attn_avx2, attn_avx512;
SW_HIDDEN extern const struct sample_loops sample_avx2, sample_avx512;
#endif

/* The logits scan's kernels (logits.c) */
SW_HIDDEN float logits_max_portable(const float *x, int n, int *nan);
SW_HIDDEN int logits_find_portable(const float *x, int n, float v);
#ifdef SPECWISE_X86
TARGET_AVX2 SW_HIDDEN float logits_max_avx2(const float *x, int n, int *nan);
TARGET_AVX2 SW_HIDDEN int logits_find_avx2(const float *x, int n, float v);
#endif

#endif
