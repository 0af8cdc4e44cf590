/*
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
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* madvise under -std=c11 */
#endif
#include "specwise.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdlib.h>
#include <string.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPECWISE_X86 1
#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#endif
#define INLINE static inline __attribute__((always_inline))

/* ---- float16 / bfloat16 ---------------------------------------------------------------------------------- */

static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* ---- CPU features ------------------------------------------------------------------------------------------ */

static int detected_isa(void) {
#ifdef SPECWISE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
#endif
    return ISA_PORTABLE;
}

static int g_isa = -1;

/* The best instruction path this CPU supports. */
int specwise_q_isa_supported(void) { return detected_isa(); }

/* The path in use (the best supported unless lowered by specwise_q_set_isa). */
int specwise_q_isa(void) {
    if (g_isa < 0) g_isa = detected_isa();
    return g_isa;
}

/* Use `isa` (clamped to what the CPU supports); returns the path now in use. */
int specwise_q_set_isa(int isa) {
    int best = detected_isa();
    g_isa = isa < 0 ? best : (isa > best ? best : isa);
    return g_isa;
}

/* ---- re-packing the GGUF formats --------------------------------------------------------------------------- */

enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_BF16 = 30
};

/* Layout of a GGUF type: 0 on success, -1 when the type is not supported. */
int specwise_q_layout(int type, int *kind, int *block, int *offset, int *has_m, int *half, int *raw_block,
                      int *raw_bytes, int *sub) {
    int k = KIND_U8, b = 32, off = 0, m = 0, h = 1, rb = 32, bytes = 0, su = 0;
    switch (type) {
        case GGML_F32: k = KIND_F32; h = 0; rb = 1; bytes = 4; break;
        case GGML_F16: k = KIND_F32; h = 0; rb = 1; bytes = 2; break;
        case GGML_BF16: k = KIND_F32; h = 0; rb = 1; bytes = 2; break;
        case GGML_Q4_0: k = KIND_Q4; off = 8; bytes = 18; break;
        case GGML_Q4_1: k = KIND_Q4; m = 1; bytes = 20; break;
        case GGML_Q5_0: k = KIND_Q5; off = 16; bytes = 22; break;
        case GGML_Q5_1: k = KIND_Q5; m = 1; bytes = 24; break;
        case GGML_Q8_0: off = 128; bytes = 34; break;
        case GGML_Q4_K: k = KIND_Q4; m = 1; rb = 256; bytes = 144; su = 3; break;
        case GGML_Q5_K: k = KIND_Q5; m = 1; rb = 256; bytes = 176; su = 3; break;
        case GGML_Q6_K: k = KIND_Q6; b = 16; off = 32; rb = 256; bytes = 210; su = 4; break;
        default: return -1;
    }
    *kind = k; *block = b; *offset = off; *has_m = m; *half = h; *raw_block = rb; *raw_bytes = bytes; *sub = su;
    return 0;
}

static void k_scale_min(const uint8_t *sc, int j, int *d, int *m) {
    if (j < 4) {
        *d = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *d = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

/* One row of a GGUF tensor as q (offset included), and per block of the layout s and m: for the legacy formats
 * their float16 bits in sh / mh; for the K-quants the sub-scales in sc / mn per block and the bits of the factors
 * d / dmin in sh / mh per super-block. F32 kinds give the values in sf[in]. */
static void decode_row(int type, const uint8_t *raw, int in, uint8_t *q, float *sf, uint16_t *sh, uint16_t *mh,
                       int8_t *sc, int8_t *mn) {
    switch (type) {
        case GGML_F32:
            memcpy(sf, raw, (size_t)in * 4);
            return;
        case GGML_F16:
            for (int i = 0; i < in; i++) sf[i] = half_to_float(rd16(raw + 2 * i));
            return;
        case GGML_BF16:
            for (int i = 0; i < in; i++) sf[i] = bf16_to_float(rd16(raw + 2 * i));
            return;
        case GGML_Q4_0: case GGML_Q4_1: {
            int size = type == GGML_Q4_0 ? 18 : 20;
            for (int b = 0; b < in / 32; b++) {
                const uint8_t *blk = raw + (size_t)b * size, *qs = blk + (size - 16);
                sh[b] = rd16(blk);
                if (type == GGML_Q4_1) {
                    mh[b] = rd16(blk + 2);
                }
                for (int i = 0; i < 16; i++) {
                    q[32 * b + i] = qs[i] & 0xF;
                    q[32 * b + 16 + i] = qs[i] >> 4;
                }
            }
            return;
        }
        case GGML_Q5_0: case GGML_Q5_1: {
            int size = type == GGML_Q5_0 ? 22 : 24, hoff = type == GGML_Q5_0 ? 2 : 4;
            for (int b = 0; b < in / 32; b++) {
                const uint8_t *blk = raw + (size_t)b * size, *qs = blk + hoff + 4;
                uint32_t qh = (uint32_t)blk[hoff] | ((uint32_t)blk[hoff + 1] << 8) | ((uint32_t)blk[hoff + 2] << 16) |
                              ((uint32_t)blk[hoff + 3] << 24);
                sh[b] = rd16(blk);
                if (type == GGML_Q5_1) {
                    mh[b] = rd16(blk + 2);
                }
                for (int i = 0; i < 16; i++) {
                    q[32 * b + i] = (uint8_t)((qs[i] & 0xF) | (((qh >> i) & 1) << 4));
                    q[32 * b + 16 + i] = (uint8_t)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
                }
            }
            return;
        }
        case GGML_Q8_0:
            for (int b = 0; b < in / 32; b++) {
                const uint8_t *blk = raw + (size_t)b * 34;
                sh[b] = rd16(blk);
                for (int i = 0; i < 32; i++) q[32 * b + i] = (uint8_t)((int)(int8_t)blk[2 + i] + 128);
            }
            return;
        case GGML_Q4_K: case GGML_Q5_K: {
            int size = type == GGML_Q4_K ? 144 : 176;
            for (int s = 0; s < in / 256; s++) {
                const uint8_t *blk = raw + (size_t)s * size, *scales = blk + 4;
                const uint8_t *qh = blk + 16, *qs = blk + (type == GGML_Q4_K ? 16 : 48);
                sh[s] = rd16(blk);
                mh[s] = rd16(blk + 2);
                for (int j = 0; j < 8; j++) {
                    int d, m;
                    k_scale_min(scales, j, &d, &m);
                    sc[8 * s + j] = (int8_t)d;
                    mn[8 * s + j] = (int8_t)m;
                    const uint8_t *chunk = qs + 32 * (j / 2);
                    for (int l = 0; l < 32; l++) {
                        uint8_t v = (j & 1) ? chunk[l] >> 4 : chunk[l] & 0xF;
                        if (type == GGML_Q5_K) v |= (uint8_t)(((qh[l] >> j) & 1) << 4);
                        q[256 * s + 32 * j + l] = v;
                    }
                }
            }
            return;
        }
        case GGML_Q6_K:
            for (int s = 0; s < in / 256; s++) {
                const uint8_t *blk = raw + (size_t)s * 210, *ql = blk, *qh = blk + 128;
                const int8_t *scales = (const int8_t *)(blk + 192);
                sh[s] = rd16(blk + 208);
                for (int j = 0; j < 16; j++) sc[16 * s + j] = scales[j];
                for (int e = 0; e < 256; e++) {
                    int h = e / 128, r = e % 128;
                    int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
                    int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
                    q[256 * s + e] = (uint8_t)(lo | (hi << 4));
                }
            }
            return;
        default:
            return;
    }
}

/* Scratch for decode_row: one row's values and scales */
typedef struct {
    uint8_t *q;
    float *sf;
    uint16_t *sh, *mh;
    int8_t *sc, *mn;
} row_scratch;

static void scratch_free(row_scratch *w) {
    free(w->q); free(w->sf); free(w->sh); free(w->mh); free(w->sc); free(w->mn);
}

static int scratch_alloc(row_scratch *w, int in) {
    w->q = malloc((size_t)in);
    w->sf = malloc((size_t)in * sizeof(float));
    w->sh = malloc((size_t)in * 2);
    w->mh = malloc((size_t)in * 2);
    w->sc = malloc((size_t)in);
    w->mn = malloc((size_t)in);
    if (w->q && w->sf && w->sh && w->mh && w->sc && w->mn) return 1;
    scratch_free(w);
    return 0;
}

/* Row o of a tensor (its blocks at src) into its lane of its tile: only the bytes of that lane are written (the
 * lanes of one tile share bytes of q, so one tile's rows are re-packed by one thread). */
static void repack_row(const qpack *dst, const uint8_t *src, int o, row_scratch *w) {
    int kind, B, off, has_m, half, rb, rbytes, sub;
    specwise_q_layout(dst->type, &kind, &B, &off, &has_m, &half, &rb, &rbytes, &sub);
    const int type = dst->type, in = (int)dst->in, t = o / QTILE, L = o % QTILE;
    const int nb = in / B, nsb = sub ? nb >> sub : 0;
    uint8_t *qt = dst->q;
    void *st = dst->s, *mt = dst->m, *sdt = dst->sd, *mdt = dst->md;
    if (type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q8_0 || type == GGML_Q5_0 || type == GGML_Q5_1) {
        /* the blocks' bytes are already the tiles' bytes: a Q4 / Q5 byte holds elements i and i + 16 in its low and
         * high nibbles, as the tile's groups do; a Q8_0 value plus 128 is its byte with the top bit flipped; a Q5
         * block's fifth bits (bit i for element i) go 4 at a time to the lane's nibble of the group's masks */
        const int q5 = type == GGML_Q5_0 || type == GGML_Q5_1, has_min = type == GGML_Q4_1 || type == GGML_Q5_1;
        const int size = rbytes, groups = type == GGML_Q8_0 ? 8 : 4, qoff = size - 4 * groups;
        const int block_bytes = q5 ? 320 : groups * 64;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = src + (size_t)b * size, *qs = blk + qoff;
            const size_t si = ((size_t)t * nb + b) * QTILE + L;
            ((uint16_t *)st)[si] = rd16(blk);
            if (has_min) ((uint16_t *)mt)[si] = rd16(blk + 2);
            uint8_t *tb = qt + ((size_t)t * nb + b) * block_bytes, *lane = tb + (size_t)L * 4;
            for (int g = 0; g < groups; g++)
                for (int j = 0; j < 4; j++)
                    lane[g * 64 + j] = type == GGML_Q8_0 ? (uint8_t)(qs[4 * g + j] ^ 0x80) : qs[4 * g + j];
            if (q5) {
                const uint8_t *h = qs - 4;
                const uint32_t qh = (uint32_t)h[0] | ((uint32_t)h[1] << 8) | ((uint32_t)h[2] << 16) | ((uint32_t)h[3] << 24);
                for (int g = 0; g < 4; g++) {
                    tb[256 + g * 8 + L / 2] |= (uint8_t)(((qh >> (4 * g)) & 0xF) << (4 * (L % 2)));
                    tb[256 + (4 + g) * 8 + L / 2] |= (uint8_t)(((qh >> (16 + 4 * g)) & 0xF) << (4 * (L % 2)));
                }
            }
        }
        return;
    }
    decode_row(type, src, in, w->q, w->sf, w->sh, w->mh, w->sc, w->mn);
    if (kind == KIND_F32) {
        float *wt = (float *)qt;
        for (int i = 0; i < in; i++) wt[((size_t)t * in + i) * QTILE + L] = w->sf[i];
        return;
    }
    for (int j = 0; j < nsb; j++) { /* the K-quants' factors d and -dmin (float16 bits: half is always set) */
        size_t fi = ((size_t)t * nsb + j) * QTILE + L;
        ((uint16_t *)sdt)[fi] = w->sh[j];
        if (has_m) ((uint16_t *)mdt)[fi] = w->mh[j] ^ 0x8000; /* -dmin: m = (-dmin) * mn, exactly -(dmin * mn) */
    }
    for (int b = 0; b < nb; b++) {
        size_t si = ((size_t)t * nb + b) * QTILE + L;
        if (sub) {
            ((int8_t *)st)[si] = w->sc[b];
            if (has_m) ((int8_t *)mt)[si] = w->mn[b];
        } else {
            ((uint16_t *)st)[si] = w->sh[b];
            if (has_m) ((uint16_t *)mt)[si] = w->mh[b];
        }
        for (int e = 0; e < B; e++) {
            size_t at;
            uint8_t v = w->q[(size_t)B * b + e];
            if (kind == KIND_Q4) {
                int ee = e % 16, g = ee / 4, j = ee % 4;
                at = (((size_t)t * nb + b) * 4 + g) * 64 + (size_t)L * 4 + j;
                qt[at] |= e < 16 ? v : (uint8_t)(v << 4);
            } else if (kind == KIND_Q5) {
                int ee = e % 16, g = ee / 4, j = ee % 4, bit = L * 4 + j;
                uint8_t *blk = qt + ((size_t)t * nb + b) * 320;
                blk[g * 64 + bit] |= e < 16 ? (uint8_t)(v & 0xF) : (uint8_t)((v & 0xF) << 4);
                if (v & 16) blk[256 + (e < 16 ? g : 4 + g) * 8 + bit / 8] |= (uint8_t)(1u << (bit % 8));
            } else if (kind == KIND_Q6) {
                int g = e / 4, j = e % 4;
                at = ((size_t)t * nb + b) * 3 * 64 + (size_t)L * 4 + j;
                if (g < 3)
                    qt[at + (size_t)g * 64] |= v;
                else
                    for (int k = 0; k < 3; k++) qt[at + (size_t)k * 64] |= (uint8_t)(((v >> (2 * k)) & 3) << 6);
            } else {
                int g = e / 4, j = e % 4;
                at = (((size_t)t * nb + b) * (B / 4) + g) * 64 + (size_t)L * 4 + j;
                qt[at] = v;
            }
        }
    }
}

/* The bytes of one row of dst's raw blocks, once every buffer of dst is checked against the layout (0: refused). */
static int64_t checked_row_bytes(const qpack *dst) {
    int kind, B, off, has_m, half, rb, rbytes, sub;
    int64_t need[5];
    if (!dst || specwise_q_sizes(dst->type, dst->out, dst->in, &need[0], &need[1], &need[2], &need[3], &need[4]))
        return 0;
    const int64_t have[5] = {dst->q_bytes, dst->s_bytes, dst->m_bytes, dst->sd_bytes, dst->md_bytes};
    const void *const bufs[5] = {dst->q, dst->s, dst->m, dst->sd, dst->md};
    for (int i = 0; i < 5; i++)
        if (need[i] > 0 && (!bufs[i] || have[i] < need[i])) return 0;
    specwise_q_layout(dst->type, &kind, &B, &off, &has_m, &half, &rb, &rbytes, &sub);
    return dst->in / rb * rbytes;
}

/* Rows first .. first + count - 1 of a checked dst from raw: row o is raw's row o - first, or rows[o] when a
 * permutation is given (checked by the caller). The tiles are shared out between threads. */
static int repack_rows(const qpack *dst, const uint8_t *raw, int64_t row_bytes, int64_t first, int64_t count,
                       const int64_t *rows) {
    if (count == 0) return SW_OK;
    const int64_t t_first = first / QTILE, t_end = (first + count - 1) / QTILE + 1;
    int failed = 0;
#pragma omp parallel reduction(| : failed) if (count * row_bytes >= (1 << 20))
    {
        row_scratch w;
        const int ok = scratch_alloc(&w, (int)dst->in);
        if (!ok) failed = 1;
#pragma omp for schedule(static)
        for (int64_t t = t_first; t < t_end; t++) {
            if (!ok) continue; /* every thread meets the loop; one without scratch only reports it */
            const int64_t lo = t * QTILE > first ? t * QTILE : first;
            const int64_t hi = (t + 1) * QTILE < first + count ? (t + 1) * QTILE : first + count;
            for (int64_t o = lo; o < hi; o++)
                repack_row(dst, raw + (rows ? rows[o] : o - first) * row_bytes, (int)o, &w);
        }
        if (ok) scratch_free(&w);
    }
    return failed ? SW_ENOMEM : SW_OK;
}

/* Re-pack rows first .. first + count - 1 of a GGUF tensor (raw: those rows' blocks, row-major, raw_bytes of them)
 * into the tiles of the whole tensor that dst describes (zeroed by the caller), so that a large tensor can be read
 * and re-packed a slice at a time. Every size is checked before anything is written: the shape against the layout's
 * limits, each buffer's bytes against what specwise_q_sizes gives, the rows against the tensor and raw_bytes
 * against the rows. The tiles are shared out between threads. Returns SW_OK, SW_EARG for an unsupported type, a
 * shape or a buffer that does not fit, or SW_ENOMEM. */
int specwise_q_repack(const qpack *dst, const uint8_t *raw, int64_t raw_bytes, int64_t first, int64_t count) {
    const int64_t row_bytes = checked_row_bytes(dst);
    if (!row_bytes || !raw || first < 0 || count < 0 || first > dst->out - count || raw_bytes / row_bytes < count)
        return SW_EARG;
    return repack_rows(dst, raw, row_bytes, first, count, NULL);
}

/* The whole pages of [p, p + bytes) handed back to the system (a read-only file mapping's: they leave the process's
 * resident memory and are read again from the page cache if touched). */
static void release_pages(const uint8_t *p, int64_t bytes) {
#if defined(__unix__) || defined(__APPLE__)
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || bytes <= 0) return;
    const uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    const uintptr_t hi = ((uintptr_t)p + (uintptr_t)bytes) & ~((uintptr_t)page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
#else
    (void)p;
    (void)bytes;
#endif
}

/* Re-pack whole tensors, one after another, in one call (a loader can do other work meanwhile, e.g. read the
 * tokenizer, without this call waiting for it between tensors). A tensor without a permutation goes in slices of
 * about 8 MB, each slice's pages released after it when asked; a permuted one row by row, every row index checked
 * first. Returns SW_OK, or the first job's failure (SW_EARG: a size, shape or row that does not fit; SW_ENOMEM),
 * its index in *failed (-1 when none). */
int specwise_q_repack_jobs(const qjob *jobs, int64_t n, int64_t *failed) {
    if (failed) *failed = -1;
    if (n < 0 || (n && !jobs)) return SW_EARG;
    for (int64_t j = 0; j < n; j++) {
        const qjob *job = jobs + j;
        const int64_t row_bytes = checked_row_bytes(&job->dst), out = job->dst.out;
        int st = row_bytes && job->raw && job->raw_bytes >= 0 ? SW_OK : SW_EARG;
        if (st == SW_OK && job->rows) {
            for (int64_t o = 0; o < out && st == SW_OK; o++)
                if (job->rows[o] < 0 || job->rows[o] >= job->raw_bytes / row_bytes) st = SW_EARG;
            if (st == SW_OK) st = repack_rows(&job->dst, job->raw, row_bytes, 0, out, job->rows);
            if (st == SW_OK && job->release) release_pages(job->raw, job->raw_bytes);
        } else if (st == SW_OK) {
            const int64_t step = (((int64_t)8 << 20) / row_bytes + QTILE) / QTILE * QTILE; /* whole tiles */
            if (job->raw_bytes / row_bytes < out) st = SW_EARG;
            for (int64_t first = 0; first < out && st == SW_OK; first += step) {
                const int64_t count = out - first < step ? out - first : step;
                const uint8_t *slice = job->raw + first * row_bytes;
                st = repack_rows(&job->dst, slice, row_bytes, first, count, NULL);
                if (st == SW_OK && job->release) release_pages(slice, count * row_bytes);
            }
        }
        if (st != SW_OK) {
            if (failed) *failed = j;
            return st;
        }
    }
    return SW_OK;
}

/* Bytes of the tiles of q, s and m, and of the K-quants' factors sd and md, for a tensor of this type and shape.
 * Returns SW_OK, or SW_EARG for an unsupported type or a shape the kernels cannot hold (out or in outside
 * 1 .. QMAX_DIM, in not a whole number of the type's blocks and of 32). */
int specwise_q_sizes(int type, int64_t out, int64_t in, int64_t *q_bytes, int64_t *s_bytes, int64_t *m_bytes,
                     int64_t *sd_bytes, int64_t *md_bytes) {
    int kind, B, off, has_m, half, rb, rbytes, sub;
    if (specwise_q_layout(type, &kind, &B, &off, &has_m, &half, &rb, &rbytes, &sub)) return SW_EARG;
    if (out < 1 || in < 1 || out > QMAX_DIM || in > QMAX_DIM || in % 32 || in % rb) return SW_EARG;
    /* at most 2^26 tiles of 2^30 inputs of at most 64 bytes: every product below is under 2^62 */
    const int64_t tiles = (out + QTILE - 1) / QTILE, nb = in / B, per = half ? 2 : 4;
    *s_bytes = *m_bytes = *sd_bytes = *md_bytes = 0;
    if (kind == KIND_F32) {
        *q_bytes = tiles * in * QTILE * 4;
        return SW_OK;
    }
    *q_bytes = tiles * nb * (kind == KIND_Q4 ? 256 : (kind == KIND_Q6 ? 192 : (kind == KIND_Q5 ? 320 : (int64_t)B * QTILE)));
    *s_bytes = tiles * nb * QTILE * (sub ? 1 : per);
    *m_bytes = has_m ? *s_bytes : 0;
    if (sub) {
        *sd_bytes = tiles * (nb >> sub) * QTILE * per;
        *md_bytes = has_m ? *sd_bytes : 0;
    }
    return SW_OK;
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

/* Per block of 32: d = max |x| / 127, q = round-half-even(x / d) clamped to +-127, and the sums of q over each half
 * block. The portable loop is the reference; the vector ones compute the same numbers (a max and integer sums in any
 * order, the same float product and rounding per value). */
static void quantize_rows_portable(const float *x, int k, int in, acts *a) {
    const int nb = in / 32;
    for (int r = 0; r < k; r++) {
        const float *xr = x + (size_t)r * in;
        for (int b = 0; b < nb; b++) {
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) {
                float v = fabsf(xr[32 * b + i]);
                amax = v > amax ? v : amax;
            }
            float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            int s0 = 0, s1 = 0;
            int8_t *qr = a->qx + (size_t)r * in + 32 * b;
            for (int i = 0; i < 32; i++) {
                int v = (int)nearbyintf(xr[32 * b + i] * id);
                v = v > 127 ? 127 : (v < -127 ? -127 : v);
                qr[i] = (int8_t)v;
                if (i < 16) s0 += v; else s1 += v;
            }
            a->dx[(size_t)r * nb + b] = d;
            a->isum[(size_t)r * 2 * nb + 2 * b] = s0;
            a->isum[(size_t)r * 2 * nb + 2 * b + 1] = s1;
            a->dsum[(size_t)r * nb + b] = d * (float)(s0 + s1);
        }
    }
}

#ifdef SPECWISE_X86
TARGET_AVX512 static void quantize_rows_512(const float *x, int k, int in, acts *a) {
    const int nb = in / 32;
    const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
    for (int r = 0; r < k; r++) {
        const float *xr = x + (size_t)r * in;
        for (int b = 0; b < nb; b++) {
            const __m512 v0 = _mm512_loadu_ps(xr + 32 * b), v1 = _mm512_loadu_ps(xr + 32 * b + 16);
            /* max(v, acc) keeps acc where v is NaN, as the portable loop's comparison does */
            __m512 m = _mm512_max_ps(_mm512_and_ps(v0, sign), _mm512_setzero_ps());
            m = _mm512_max_ps(_mm512_and_ps(v1, sign), m);
            const float amax = _mm512_reduce_max_ps(m);
            const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            const __m512 vid = _mm512_set1_ps(id);
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
            q0 = _mm512_max_epi32(_mm512_min_epi32(q0, hi), lo);
            q1 = _mm512_max_epi32(_mm512_min_epi32(q1, hi), lo);
            int8_t *qr = a->qx + (size_t)r * in + 32 * b;
            _mm_storeu_si128((__m128i *)qr, _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(qr + 16), _mm512_cvtepi32_epi8(q1));
            const int s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
            a->dx[(size_t)r * nb + b] = d;
            a->isum[(size_t)r * 2 * nb + 2 * b] = s0;
            a->isum[(size_t)r * 2 * nb + 2 * b + 1] = s1;
            a->dsum[(size_t)r * nb + b] = d * (float)(s0 + s1);
        }
    }
}

TARGET_AVX2 static int hsum256_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

TARGET_AVX2 static void quantize_rows_256(const float *x, int k, int in, acts *a) {
    const int nb = in / 32;
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int r = 0; r < k; r++) {
        const float *xr = x + (size_t)r * in;
        for (int b = 0; b < nb; b++) {
            __m256 v[4];
            __m256 m = _mm256_setzero_ps();
            for (int j = 0; j < 4; j++) {
                v[j] = _mm256_loadu_ps(xr + 32 * b + 8 * j);
                m = _mm256_max_ps(_mm256_and_ps(v[j], sign), m);
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
            const float amax = _mm_cvtss_f32(m4);
            const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            const __m256 vid = _mm256_set1_ps(id);
            __m256i q[4];
            for (int j = 0; j < 4; j++) {
                q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], vid));
                q[j] = _mm256_max_epi32(_mm256_min_epi32(q[j], hi), lo);
            }
            /* packs work within 128-bit lanes: the permutation puts the 32 bytes back in order */
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(a->qx + (size_t)r * in + 32 * b), _mm256_permutevar8x32_epi32(p, order));
            const int s0 = hsum256_epi32(_mm256_add_epi32(q[0], q[1])), s1 = hsum256_epi32(_mm256_add_epi32(q[2], q[3]));
            a->dx[(size_t)r * nb + b] = d;
            a->isum[(size_t)r * 2 * nb + 2 * b] = s0;
            a->isum[(size_t)r * 2 * nb + 2 * b + 1] = s1;
            a->dsum[(size_t)r * nb + b] = d * (float)(s0 + s1);
        }
    }
}
#endif

static void quantize_rows(const float *x, int k, int in, acts *a, int isa) {
#ifdef SPECWISE_X86
    if (isa == ISA_AVX512) {
        quantize_rows_512(x, k, in, a);
        return;
    }
    if (isa == ISA_AVX2) {
        quantize_rows_256(x, k, in, a);
        return;
    }
#endif
    (void)isa;
    quantize_rows_portable(x, k, in, a);
}

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

/* ---- portable path (the reference order of operations) ----------------------------------------------------- */

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

static void tile_portable(const qmat *w, int t, const float *x, int ldx, const acts *a, int mode, float *y,
                          int ldy, int R, int n) {
    const int B = w->block, nb = w->in / B;
    for (int r = 0; r < R; r++) {
        for (int L = 0; L < n; L++) {
            float out;
            if (w->kind == KIND_F32) {
                const float *wt = (const float *)w->q;
                float acc[2] = {0.0f, 0.0f};
                for (int i = 0; i < w->in; i++)
                    acc[(i & 31) >= 16] = fmaf(wt[((size_t)t * w->in + i) * QTILE + L], x[(size_t)r * ldx + i],
                                               acc[(i & 31) >= 16]);
                out = acc[0] + acc[1];
            } else if (mode == MODE_EXACT) {
                float acc[2] = {0.0f, 0.0f};
                for (int b = 0; b < nb; b++) {
                    size_t si = ((size_t)t * nb + b) * QTILE + L;
                    float s = scale_at(w, si, 0), m = w->has_m ? scale_at(w, si, 1) : 0.0f;
                    for (int e = 0; e < B; e++) {
                        int i = B * b + e;
                        float wv = fmaf((float)(q_at(w, t, b, e, L) - w->offset), s, m);
                        acc[(i & 31) >= 16] = fmaf(wv, x[(size_t)r * ldx + i], acc[(i & 31) >= 16]);
                    }
                }
                out = acc[0] + acc[1];
            } else {
                const int nb32 = w->in / 32;
                float acc = 0.0f;
                for (int b = 0; b < nb; b++) {
                    size_t si = ((size_t)t * nb + b) * QTILE + L;
                    int32_t sum = 0, corr = 0;
                    for (int e = 0; e < B; e++) sum += q_at(w, t, b, e, L) * a->qx[(size_t)r * w->in + B * b + e];
                    if (B == 32)
                        corr = a->isum[(size_t)r * 2 * nb32 + 2 * b] + a->isum[(size_t)r * 2 * nb32 + 2 * b + 1];
                    else
                        corr = a->isum[(size_t)r * 2 * nb32 + b];
                    sum -= w->offset * corr;
                    int b32 = B * b / 32;
                    float d = scale_at(w, si, 0) * a->dx[(size_t)r * nb32 + b32];
                    acc = fmaf(d, (float)sum, acc);
                    if (w->has_m) acc = fmaf(scale_at(w, si, 1), a->dsum[(size_t)r * nb32 + b32], acc);
                }
                out = acc;
            }
            y[(size_t)r * ldy + L] = out;
        }
    }
}

#ifdef SPECWISE_X86
/* ---- AVX-512 (with VNNI) ----------------------------------------------------------------------------------- */

/* scale_at for the 16 lanes of a tile (i a multiple of 16) */
TARGET_AVX512 INLINE __m512 ld_scale512(const qmat *w, int which, size_t i) {
    const void *p = which ? w->m : w->s;
    if (w->sub) {
        const void *f = which ? w->md : w->sd;
        const size_t fi = factor_index(w, i);
        const __m512 d = w->half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)f + fi)))
                                 : _mm512_loadu_ps((const float *)f + fi);
        const __m128i b = _mm_loadu_si128((const __m128i *)((const int8_t *)p + i));
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
        return _mm512_mul_ps(d, sc);
    }
    if (w->half) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    return _mm512_loadu_ps((const float *)p + i);
}

/* KIND_Q6: the 4 groups of q (as KIND_U8 holds them) of the block whose 3 stored groups start at `base` */
TARGET_AVX512 INLINE void q6_unpack512(const uint8_t *base, __m512i v[4]) {
    const __m512i low6 = _mm512_set1_epi8(0x3F), m2 = _mm512_set1_epi8(0x03), m4 = _mm512_set1_epi8(0x0F);
    const __m512i a = _mm512_loadu_si512(base), b = _mm512_loadu_si512(base + 64), c = _mm512_loadu_si512(base + 128);
    v[0] = _mm512_and_si512(a, low6);
    v[1] = _mm512_and_si512(b, low6);
    v[2] = _mm512_and_si512(c, low6);
    /* the top 2 bits of a, b and c, at bits 0-1, 2-3 and 4-5: (x & m) | (y & ~m) is ternary logic 0xE4 (x, y, m) */
    __m512i t = _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 6), _mm512_srli_epi16(b, 4), m2, 0xE4);
    t = _mm512_ternarylogic_epi32(t, _mm512_srli_epi16(c, 2), m4, 0xE4);
    v[3] = _mm512_and_si512(t, low6);
}

/* KIND_Q5: the 5-bit values of group g of the block at blk, the low nibbles' inputs (4g + j) in lo and the high
 * nibbles' (16 + 4g + j) in hi, one byte each: the nibble, plus 16 where the group's mask has the byte's bit */
TARGET_AVX512 INLINE void q5_unpack512(const uint8_t *blk, int g, __m512i *lo, __m512i *hi) {
    const __m512i nib = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
    const __m512i v = _mm512_loadu_si512(blk + g * 64);
    uint64_t ml, mh;
    memcpy(&ml, blk + 256 + 8 * g, 8);
    memcpy(&mh, blk + 256 + 8 * (4 + g), 8);
    const __m512i l = _mm512_and_si512(v, nib), h = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
    *lo = _mm512_mask_add_epi8(l, _cvtu64_mask64(ml), l, fifth);
    *hi = _mm512_mask_add_epi8(h, _cvtu64_mask64(mh), h, fifth);
}

TARGET_AVX512 INLINE void store512(float *y, __m512 v, int n) {
    if (n == QTILE)
        _mm512_storeu_ps(y, v);
    else
        _mm512_mask_storeu_ps(y, (__mmask16)((1u << n) - 1), v);
}

/* TT tiles from t0 (the last may hold n < 16 rows), R rows of x. */
TARGET_AVX512 INLINE void exact512(const qmat *w, int t0, const float *x, int ldx, float *y, int ldy, int n,
                                   const int TT, const int R) {
    __m512 acc0[4][8], acc1[4][8];
    for (int tt = 0; tt < TT; tt++)
        for (int r = 0; r < R; r++) acc0[tt][r] = acc1[tt][r] = _mm512_setzero_ps();
    const int B = w->block, nb = w->in / B;
    if (w->kind == KIND_F32) {
        const float *wt = (const float *)w->q;
        for (int i = 0; i < w->in; i += 32) {
            for (int e = 0; e < 16; e++) {
                for (int tt = 0; tt < TT; tt++) {
                    __m512 lo = _mm512_loadu_ps(wt + ((size_t)(t0 + tt) * w->in + i + e) * QTILE);
                    __m512 hi = _mm512_loadu_ps(wt + ((size_t)(t0 + tt) * w->in + i + 16 + e) * QTILE);
                    for (int r = 0; r < R; r++) {
                        acc0[tt][r] = _mm512_fmadd_ps(lo, _mm512_set1_ps(x[(size_t)r * ldx + i + e]), acc0[tt][r]);
                        acc1[tt][r] =
                            _mm512_fmadd_ps(hi, _mm512_set1_ps(x[(size_t)r * ldx + i + 16 + e]), acc1[tt][r]);
                    }
                }
            }
        }
    } else if (w->kind == KIND_Q4 || w->kind == KIND_Q5) { /* w = table[q] * s + m, 16 or 32 values in the table */
        float lutf[32];
        for (int i = 0; i < 32; i++) lutf[i] = (float)(i - w->offset);
        const __m512 lut0 = _mm512_loadu_ps(lutf), lut1 = _mm512_loadu_ps(lutf + 16);
        const __m512i nib = _mm512_set1_epi8(0x0F);
        const int q5 = w->kind == KIND_Q5;
        const size_t BB = q5 ? 320 : 256; /* bytes of a tile's block */
        for (int b = 0; b < nb; b++) {
            __m512 s[4], m[4];
            for (int tt = 0; tt < TT; tt++) {
                size_t si = ((size_t)(t0 + tt) * nb + b) * QTILE;
                s[tt] = ld_scale512(w, 0, si);
                m[tt] = w->has_m ? ld_scale512(w, 1, si) : _mm512_setzero_ps();
            }
            for (int g = 0; g < 4; g++) {
                __m512i vl[4], vh[4]; /* the values of inputs 4g + j and 16 + 4g + j, one byte each */
                for (int tt = 0; tt < TT; tt++) {
                    const uint8_t *blk = w->q + ((size_t)(t0 + tt) * nb + b) * BB;
                    if (q5) {
                        q5_unpack512(blk, g, &vl[tt], &vh[tt]);
                    } else {
                        const __m512i v = _mm512_loadu_si512(blk + g * 64);
                        vl[tt] = _mm512_and_si512(v, nib);
                        vh[tt] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                    }
                }
                for (int j = 0; j < 4; j++) {
                    const int i = 32 * b + 4 * g + j;
                    for (int tt = 0; tt < TT; tt++) {
                        __m512 lo = _mm512_permutex2var_ps(lut0, _mm512_srli_epi32(vl[tt], 8 * j), lut1);
                        __m512 hi = _mm512_permutex2var_ps(lut0, _mm512_srli_epi32(vh[tt], 8 * j), lut1);
                        lo = _mm512_fmadd_ps(lo, s[tt], m[tt]);
                        hi = _mm512_fmadd_ps(hi, s[tt], m[tt]);
                        for (int r = 0; r < R; r++) {
                            acc0[tt][r] = _mm512_fmadd_ps(lo, _mm512_set1_ps(x[(size_t)r * ldx + i]), acc0[tt][r]);
                            acc1[tt][r] =
                                _mm512_fmadd_ps(hi, _mm512_set1_ps(x[(size_t)r * ldx + i + 16]), acc1[tt][r]);
                        }
                    }
                }
            }
        }
    } else if (w->kind == KIND_Q6) { /* KIND_U8's order of operations, on the unpacked groups */
        const __m512i mask = _mm512_set1_epi32(0xFF), off = _mm512_set1_epi32(w->offset);
        for (int b = 0; b < nb; b++) {
            __m512 s[4], m[4];
            __m512i v[4][4];
            for (int tt = 0; tt < TT; tt++) {
                size_t si = ((size_t)(t0 + tt) * nb + b) * QTILE;
                s[tt] = ld_scale512(w, 0, si);
                m[tt] = w->has_m ? ld_scale512(w, 1, si) : _mm512_setzero_ps();
                q6_unpack512(w->q + ((size_t)(t0 + tt) * nb + b) * 192, v[tt]);
            }
            for (int g = 0; g < 4; g++) {
                for (int tt = 0; tt < TT; tt++) {
                    for (int j = 0; j < 4; j++) {
                        const int i = 16 * b + 4 * g + j, second = (i & 31) >= 16;
                        __m512i qj = _mm512_srli_epi32(v[tt][g], 8 * j); /* byte j (the top one needs no mask) */
                        __m512i qi = _mm512_sub_epi32(j == 3 ? qj : _mm512_and_si512(qj, mask), off);
                        __m512 wv = _mm512_fmadd_ps(_mm512_cvtepi32_ps(qi), s[tt], m[tt]);
                        for (int r = 0; r < R; r++) {
                            __m512 xv = _mm512_set1_ps(x[(size_t)r * ldx + i]);
                            if (second)
                                acc1[tt][r] = _mm512_fmadd_ps(wv, xv, acc1[tt][r]);
                            else
                                acc0[tt][r] = _mm512_fmadd_ps(wv, xv, acc0[tt][r]);
                        }
                    }
                }
            }
        }
    } else {
        const __m512i mask = _mm512_set1_epi32(0xFF), off = _mm512_set1_epi32(w->offset);
        const int G = B / 4;
        for (int b = 0; b < nb; b++) {
            __m512 s[4], m[4];
            for (int tt = 0; tt < TT; tt++) {
                size_t si = ((size_t)(t0 + tt) * nb + b) * QTILE;
                s[tt] = ld_scale512(w, 0, si);
                m[tt] = w->has_m ? ld_scale512(w, 1, si) : _mm512_setzero_ps();
            }
            for (int g = 0; g < G; g++) {
                for (int tt = 0; tt < TT; tt++) {
                    __m512i v = _mm512_loadu_si512(w->q + (((size_t)(t0 + tt) * nb + b) * G + g) * 64);
                    for (int j = 0; j < 4; j++) {
                        const int i = B * b + 4 * g + j, second = (i & 31) >= 16;
                        __m512i qi = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, 8 * j), mask), off);
                        __m512 wv = _mm512_fmadd_ps(_mm512_cvtepi32_ps(qi), s[tt], m[tt]);
                        for (int r = 0; r < R; r++) {
                            __m512 xv = _mm512_set1_ps(x[(size_t)r * ldx + i]);
                            if (second)
                                acc1[tt][r] = _mm512_fmadd_ps(wv, xv, acc1[tt][r]);
                            else
                                acc0[tt][r] = _mm512_fmadd_ps(wv, xv, acc0[tt][r]);
                        }
                    }
                }
            }
        }
    }
    for (int tt = 0; tt < TT; tt++)
        for (int r = 0; r < R; r++)
            store512(y + (size_t)r * ldy + (size_t)tt * QTILE, _mm512_add_ps(acc0[tt][r], acc1[tt][r]),
                     tt == TT - 1 ? n : QTILE);
}

/* vpdpbusd with its 4 activation bytes broadcast from memory ({1to16}): one instruction instead of a broadcast
 * and a product (GCC does not fold the broadcast by itself) */
TARGET_AVX512 INLINE __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t *x4) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x4));
    return acc;
}

/* q8 for one tile and R rows whose activations are interleaved per block of 32 (qx [block][row][32], dx and dsum
 * [block][row]), so that every row's bytes are at a constant offset from one pointer; corr [weight block][row] is
 * offset * sum(qx) over the weight's block (KIND_Q6: blocks of 16). Per row and weight block: the integer sums,
 * minus corr, then one float update, in increasing block order (tile_portable's arithmetic); with few rows the
 * integer sums are split over two accumulators to hide their latency, which changes nothing (integer sums). */
TARGET_AVX512 INLINE void q8il_512(const qmat *w, int t, const int8_t *qx, const float *dx, const float *ds,
                                   const int32_t *corr, float *y, int ldy, int n, const int KIND, const int HASM,
                                   const int CORR, const int R) {
    const int A = R <= 4 ? 2 : 1; /* accumulators per row: with few rows, two chains hide the latency */
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const int nb = w->in / (KIND == KIND_Q6 ? 16 : 32);
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const int BB = KIND == KIND_Q4 ? 256 : (KIND == KIND_Q6 ? 192 : (KIND == KIND_Q5 ? 320 : 512)); /* block bytes */
    const uint8_t *q = w->q + (size_t)t * nb * BB;
    for (int b = 0; b < nb; b++) {
        __m512i ia[8], ib[8];
        for (int r = 0; r < R; r++) ia[r] = ib[r] = _mm512_setzero_si512();
        if (KIND == KIND_Q6) { /* blocks of 16: block b is half (b & 1) of the activations' block b / 2 */
            const int8_t *xb = qx + (size_t)(b >> 1) * R * 32 + (b & 1) * 16;
            __m512i v[4];
            q6_unpack512(q + (size_t)b * 192, v);
            for (int g = 0; g < 4; g++)
                for (int r = 0; r < R; r++) {
                    if (A == 2 && (g & 1))
                        ib[r] = dpbusd_bcast(ib[r], v[g], xb + r * 32 + 4 * g);
                    else
                        ia[r] = dpbusd_bcast(ia[r], v[g], xb + r * 32 + 4 * g);
                }
        }
        const int8_t *xb = qx + (size_t)b * R * 32;
        if (KIND == KIND_Q4 || KIND == KIND_Q5) {
            for (int g = 0; g < 4; g++) {
                __m512i lo, hi;
                if (KIND == KIND_Q5) {
                    q5_unpack512(q + (size_t)b * 320, g, &lo, &hi);
                } else {
                    const __m512i v = _mm512_loadu_si512(q + ((size_t)b * 4 + g) * 64);
                    lo = _mm512_and_si512(v, nib);
                    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                }
                for (int r = 0; r < R; r++) {
                    ia[r] = dpbusd_bcast(ia[r], lo, xb + r * 32 + 4 * g);
                    if (A == 2)
                        ib[r] = dpbusd_bcast(ib[r], hi, xb + r * 32 + 16 + 4 * g);
                    else
                        ia[r] = dpbusd_bcast(ia[r], hi, xb + r * 32 + 16 + 4 * g);
                }
            }
        } else if (KIND == KIND_U8) {
            for (int g = 0; g < 8; g++) {
                const __m512i v = _mm512_loadu_si512(q + ((size_t)b * 8 + g) * 64);
                for (int r = 0; r < R; r++) {
                    if (A == 2 && (g & 1))
                        ib[r] = dpbusd_bcast(ib[r], v, xb + r * 32 + 4 * g);
                    else
                        ia[r] = dpbusd_bcast(ia[r], v, xb + r * 32 + 4 * g);
                }
            }
        }
        const size_t si = ((size_t)t * nb + b) * QTILE;
        const __m512 s = ld_scale512(w, 0, si);
        const __m512 m = HASM ? ld_scale512(w, 1, si) : _mm512_setzero_ps();
        for (int r = 0; r < R; r++) {
            __m512i isum = A == 2 ? _mm512_add_epi32(ia[r], ib[r]) : ia[r];
            if (CORR) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(corr[(size_t)b * R + r]));
            const size_t b32 = KIND == KIND_Q6 ? (size_t)(b >> 1) : (size_t)b;
            const __m512 d = _mm512_mul_ps(s, _mm512_set1_ps(dx[b32 * R + r]));
            acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), acc[r]);
            if (HASM) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(ds[b32 * R + r]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) store512(y + (size_t)r * ldy, acc[r], n);
}

#define Q8IL_RUN(NAME, KIND, HASM, CORR)                                                                    \
    TARGET_AVX512 __attribute__((noinline)) static void NAME(const qmat *w, int t, const int8_t *qx,          \
                                                             const float *dx, const float *ds,               \
                                                             const int32_t *corr, float *y, int ldy, int n,  \
                                                             int R) {                                        \
        switch (R) {                                                                                         \
            case 1: q8il_512(w, t, qx, dx, ds, corr, y, ldy, n, KIND, HASM, CORR, 1); break;                 \
            case 2: q8il_512(w, t, qx, dx, ds, corr, y, ldy, n, KIND, HASM, CORR, 2); break;                 \
            case 3: q8il_512(w, t, qx, dx, ds, corr, y, ldy, n, KIND, HASM, CORR, 3); break;                 \
            case 4: q8il_512(w, t, qx, dx, ds, corr, y, ldy, n, KIND, HASM, CORR, 4); break;                 \
            case 5: q8il_512(w, t, qx, dx, ds, corr, y, ldy, n, KIND, HASM, CORR, 5); break;                 \
            case 6: q8il_512(w, t, qx, dx, ds, corr, y, ldy, n, KIND, HASM, CORR, 6); break;                 \
            case 7: q8il_512(w, t, qx, dx, ds, corr, y, ldy, n, KIND, HASM, CORR, 7); break;                 \
            default: q8il_512(w, t, qx, dx, ds, corr, y, ldy, n, KIND, HASM, CORR, 8); break;                \
        }                                                                                                    \
    }
Q8IL_RUN(q8il_q4, KIND_Q4, 0, 0)
Q8IL_RUN(q8il_q4m, KIND_Q4, 1, 0)
Q8IL_RUN(q8il_q4c, KIND_Q4, 0, 1)
Q8IL_RUN(q8il_u8, KIND_U8, 0, 0)
Q8IL_RUN(q8il_u8m, KIND_U8, 1, 0)
Q8IL_RUN(q8il_u8c, KIND_U8, 0, 1)
Q8IL_RUN(q8il_q6c, KIND_Q6, 0, 1)
Q8IL_RUN(q8il_q5, KIND_Q5, 0, 0)
Q8IL_RUN(q8il_q5m, KIND_Q5, 1, 0)
Q8IL_RUN(q8il_q5c, KIND_Q5, 0, 1)
#undef Q8IL_RUN

/* q8il_512 for a tile of w (blocks of 32; corr: offset * sum(qx) per block and row when w has an offset) */
TARGET_AVX512 static void run512_q8il(const qmat *w, int t, const int8_t *qx, const float *dx, const float *ds,
                                      const int32_t *corr, float *y, int ldy, int n, int R) {
    const int c = w->offset != 0;
    if (w->kind == KIND_Q6)
        q8il_q6c(w, t, qx, dx, ds, corr, y, ldy, n, R);
    else if (w->kind == KIND_Q4)
        (w->has_m ? q8il_q4m : (c ? q8il_q4c : q8il_q4))(w, t, qx, dx, ds, corr, y, ldy, n, R);
    else if (w->kind == KIND_Q5)
        (w->has_m ? q8il_q5m : (c ? q8il_q5c : q8il_q5))(w, t, qx, dx, ds, corr, y, ldy, n, R);
    else
        (w->has_m ? q8il_u8m : (c ? q8il_u8c : q8il_u8))(w, t, qx, dx, ds, corr, y, ldy, n, R);
}

/* All (tiles, rows) shapes the driver asks for: TT tiles at once (see tiles_for), R <= 8 rows. */
#define SHAPES(CALL)                                                                              \
    switch (TT * 16 + R) {                                                                        \
        case 0x41: CALL(4, 1); break;                                                             \
        case 0x42: CALL(4, 2); break;                                                             \
        case 0x21: CALL(2, 1); break;                                                             \
        case 0x22: CALL(2, 2); break;                                                             \
        case 0x23: CALL(2, 3); break;                                                             \
        case 0x24: CALL(2, 4); break;                                                             \
        case 0x25: CALL(2, 5); break;                                                             \
        case 0x26: CALL(2, 6); break;                                                             \
        case 0x11: CALL(1, 1); break;                                                             \
        case 0x12: CALL(1, 2); break;                                                             \
        case 0x13: CALL(1, 3); break;                                                             \
        case 0x14: CALL(1, 4); break;                                                             \
        case 0x15: CALL(1, 5); break;                                                             \
        case 0x16: CALL(1, 6); break;                                                             \
        case 0x17: CALL(1, 7); break;                                                             \
        default: CALL(1, 8); break;                                                               \
    }

/* exact (float32 activations) on AVX-512; q8 runs in run512_q8il */
TARGET_AVX512 static void run512(const qmat *w, int t0, int TT, const float *x, int ldx, float *y, int ldy, int R,
                                 int n) {
#define EXACT(T, RR) exact512(w, t0, x, ldx, y, ldy, n, T, RR)
    SHAPES(EXACT)
#undef EXACT
}

/* ---- AVX2 + FMA ------------------------------------------------------------------------------------------------ */
/* Half tiles of 8 rows: half h of tile t holds lanes 8h .. 8h + 7, at byte 32h of each 64-byte group. */

/* scale_at for the 8 lanes of a half tile (i a multiple of 8) */
TARGET_AVX2 INLINE __m256 ld_scale256(const qmat *w, int which, size_t i) {
    const void *p = which ? w->m : w->s;
    if (w->sub) {
        const void *f = which ? w->md : w->sd;
        const size_t fi = factor_index(w, i);
        const __m256 d = w->half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)f + fi)))
                                 : _mm256_loadu_ps((const float *)f + fi);
        const __m128i b = _mm_loadl_epi64((const __m128i *)((const int8_t *)p + i));
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        return _mm256_mul_ps(d, sc);
    }
    if (w->half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

/* q6_unpack512 for half tile `half` */
TARGET_AVX2 INLINE void q6_unpack256(const uint8_t *base, int half, __m256i v[4]) {
    const __m256i low6 = _mm256_set1_epi8(0x3F), m2 = _mm256_set1_epi8(0x03), m4 = _mm256_set1_epi8(0x0C);
    const __m256i m6 = _mm256_set1_epi8(0x30);
    const __m256i a = _mm256_loadu_si256((const __m256i *)(base + 32 * half));
    const __m256i b = _mm256_loadu_si256((const __m256i *)(base + 64 + 32 * half));
    const __m256i c = _mm256_loadu_si256((const __m256i *)(base + 128 + 32 * half));
    v[0] = _mm256_and_si256(a, low6);
    v[1] = _mm256_and_si256(b, low6);
    v[2] = _mm256_and_si256(c, low6);
    v[3] = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 6), m2),
                                           _mm256_and_si256(_mm256_srli_epi16(b, 4), m4)),
                           _mm256_and_si256(_mm256_srli_epi16(c, 2), m6));
}

/* KIND_Q5: 16 where bit n of the 32 at `bits` is set, for byte n of a half tile's group (q5_unpack512's masks) */
TARGET_AVX2 INLINE __m256i q5_fifth256(const uint8_t *bits) {
    uint32_t b32;
    memcpy(&b32, bits, 4);
    const __m256i byte_of = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                             3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)b32), byte_of), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

/* KIND_Q5: q5_unpack512 for half tile `half` */
TARGET_AVX2 INLINE void q5_unpack256(const uint8_t *blk, int g, int half, __m256i *lo, __m256i *hi) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + g * 64 + 32 * half));
    *lo = _mm256_or_si256(_mm256_and_si256(v, nib), q5_fifth256(blk + 256 + 8 * g + 4 * half));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), nib), q5_fifth256(blk + 256 + 8 * (4 + g) + 4 * half));
}

TARGET_AVX2 INLINE void store256(float *y, __m256 v, int n) {
    if (n >= 8) {
        _mm256_storeu_ps(y, v);
    } else if (n > 0) {
        float tmp[8];
        _mm256_storeu_ps(tmp, v);
        memcpy(y, tmp, (size_t)n * sizeof(float));
    }
}

/* HT half tiles from half tile h0 (= 2 t + half); rows valid in the tile of the last: n. */
TARGET_AVX2 INLINE void exact256(const qmat *w, int h0, const float *x, int ldx, float *y, int ldy, int n,
                                 const int HT, const int R) {
    __m256 acc0[4][4], acc1[4][4];
    for (int hh = 0; hh < HT; hh++)
        for (int r = 0; r < R; r++) acc0[hh][r] = acc1[hh][r] = _mm256_setzero_ps();
    const int B = w->block, nb = w->in / B;
    if (w->kind == KIND_F32) {
        const float *wt = (const float *)w->q;
        for (int i = 0; i < w->in; i += 32) {
            for (int e = 0; e < 16; e++) {
                for (int hh = 0; hh < HT; hh++) {
                    int t = (h0 + hh) / 2, half = (h0 + hh) % 2;
                    __m256 lo = _mm256_loadu_ps(wt + ((size_t)t * w->in + i + e) * QTILE + 8 * half);
                    __m256 hi = _mm256_loadu_ps(wt + ((size_t)t * w->in + i + 16 + e) * QTILE + 8 * half);
                    for (int r = 0; r < R; r++) {
                        acc0[hh][r] = _mm256_fmadd_ps(lo, _mm256_set1_ps(x[(size_t)r * ldx + i + e]), acc0[hh][r]);
                        acc1[hh][r] =
                            _mm256_fmadd_ps(hi, _mm256_set1_ps(x[(size_t)r * ldx + i + 16 + e]), acc1[hh][r]);
                    }
                }
            }
        }
    } else if (w->kind == KIND_Q6) { /* as exact512 */
        const __m256i mask = _mm256_set1_epi32(0xFF), off = _mm256_set1_epi32(w->offset);
        for (int b = 0; b < nb; b++) {
            __m256 s[4], m[4];
            __m256i v[4][4];
            for (int hh = 0; hh < HT; hh++) {
                int t = (h0 + hh) / 2, half = (h0 + hh) % 2;
                size_t si = ((size_t)t * nb + b) * QTILE + 8 * half;
                s[hh] = ld_scale256(w, 0, si);
                m[hh] = w->has_m ? ld_scale256(w, 1, si) : _mm256_setzero_ps();
                q6_unpack256(w->q + ((size_t)t * nb + b) * 192, half, v[hh]);
            }
            for (int g = 0; g < 4; g++) {
                for (int hh = 0; hh < HT; hh++) {
                    for (int j = 0; j < 4; j++) {
                        const int i = 16 * b + 4 * g + j, second = (i & 31) >= 16;
                        __m256i qj = _mm256_srli_epi32(v[hh][g], 8 * j); /* byte j (the top one needs no mask) */
                        __m256i qi = _mm256_sub_epi32(j == 3 ? qj : _mm256_and_si256(qj, mask), off);
                        __m256 wv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qi), s[hh], m[hh]);
                        for (int r = 0; r < R; r++) {
                            __m256 xv = _mm256_set1_ps(x[(size_t)r * ldx + i]);
                            if (second)
                                acc1[hh][r] = _mm256_fmadd_ps(wv, xv, acc1[hh][r]);
                            else
                                acc0[hh][r] = _mm256_fmadd_ps(wv, xv, acc0[hh][r]);
                        }
                    }
                }
            }
        }
    } else {
        const __m256i off = _mm256_set1_epi32(w->offset), mask = _mm256_set1_epi32(0xFF);
        const __m256i nib = _mm256_set1_epi8(0x0F);
        const int nibbles = w->kind == KIND_Q4 || w->kind == KIND_Q5; /* KIND_Q5: KIND_Q4's nibbles and fifth bits */
        const int G = nibbles ? 4 : B / 4;
        const size_t BB = w->kind == KIND_Q5 ? 320 : (size_t)G * 64; /* bytes of a tile's block */
        for (int b = 0; b < nb; b++) {
            __m256 s[4], m[4];
            for (int hh = 0; hh < HT; hh++) {
                int t = (h0 + hh) / 2, half = (h0 + hh) % 2;
                size_t si = ((size_t)t * nb + b) * QTILE + 8 * half;
                s[hh] = ld_scale256(w, 0, si);
                m[hh] = w->has_m ? ld_scale256(w, 1, si) : _mm256_setzero_ps();
            }
            for (int g = 0; g < G; g++) {
                for (int hh = 0; hh < HT; hh++) {
                    int t = (h0 + hh) / 2, half = (h0 + hh) % 2;
                    const uint8_t *blk = w->q + ((size_t)t * nb + b) * BB;
                    __m256i v = _mm256_loadu_si256((const __m256i *)(blk + (size_t)g * 64 + 32 * half)), vh = v;
                    if (w->kind == KIND_Q5) { /* the values of inputs 4g + j and 16 + 4g + j, one byte each */
                        q5_unpack256(blk, g, half, &v, &vh);
                    } else if (nibbles) {
                        vh = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                        v = _mm256_and_si256(v, nib);
                    }
                    for (int j = 0; j < 4; j++) {
                        if (nibbles) {
                            const int i = 32 * b + 4 * g + j;
                            __m256i lo = _mm256_and_si256(_mm256_srli_epi32(v, 8 * j), mask);
                            __m256i hi = _mm256_and_si256(_mm256_srli_epi32(vh, 8 * j), mask);
                            __m256 wl = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(lo, off)), s[hh], m[hh]);
                            __m256 wh = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi, off)), s[hh], m[hh]);
                            for (int r = 0; r < R; r++) {
                                acc0[hh][r] =
                                    _mm256_fmadd_ps(wl, _mm256_set1_ps(x[(size_t)r * ldx + i]), acc0[hh][r]);
                                acc1[hh][r] =
                                    _mm256_fmadd_ps(wh, _mm256_set1_ps(x[(size_t)r * ldx + i + 16]), acc1[hh][r]);
                            }
                        } else {
                            const int i = B * b + 4 * g + j, second = (i & 31) >= 16;
                            __m256i qi = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(v, 8 * j), mask), off);
                            __m256 wv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qi), s[hh], m[hh]);
                            for (int r = 0; r < R; r++) {
                                __m256 xv = _mm256_set1_ps(x[(size_t)r * ldx + i]);
                                if (second)
                                    acc1[hh][r] = _mm256_fmadd_ps(wv, xv, acc1[hh][r]);
                                else
                                    acc0[hh][r] = _mm256_fmadd_ps(wv, xv, acc0[hh][r]);
                            }
                        }
                    }
                }
            }
        }
    }
    for (int hh = 0; hh < HT; hh++) {
        int t = (h0 + hh) / 2, half = (h0 + hh) % 2, last = (h0 + hh) / 2 == (h0 + HT - 1) / 2;
        int valid = last ? n - 8 * half : 8;
        for (int r = 0; r < R; r++)
            store256(y + (size_t)r * ldy + (size_t)(t - h0 / 2) * QTILE + 8 * half,
                     _mm256_add_ps(acc0[hh][r], acc1[hh][r]), valid);
    }
}

TARGET_AVX2 INLINE __m256i dot4_256(__m256i wq, __m256i xb, int signed_w) {
    /* per 32-bit lane: sum of 4 products of bytes; wq unsigned (or signed when signed_w), xb signed */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p;
    if (signed_w)
        p = _mm256_maddubs_epi16(_mm256_abs_epi8(wq), _mm256_sign_epi8(xb, wq));
    else
        p = _mm256_maddubs_epi16(wq, xb);
    return _mm256_madd_epi16(p, ones);
}

/* q8: the float update of weight block b from its integer sums ia (per half tile and row), as q8_256 does it */
TARGET_AVX2 INLINE void q8_update256(const qmat *w, const acts *a, __m256 acc[4][4], __m256i ia[4][4], int b, int h0,
                                     int signed_w, const int HT, const int R) {
    const int B = w->block, nb = w->in / B, nb32 = w->in / 32, b32 = B * b / 32;
    for (int r = 0; r < R; r++) {
        const int32_t *is = a->isum + (size_t)r * 2 * nb32;
        const int32_t corr = signed_w ? 0 : w->offset * (B == 32 ? is[2 * b] + is[2 * b + 1] : is[b]);
        const __m256 dx = _mm256_set1_ps(a->dx[(size_t)r * nb32 + b32]);
        const __m256 ds = _mm256_set1_ps(a->dsum[(size_t)r * nb32 + b32]);
        for (int hh = 0; hh < HT; hh++) {
            int t = (h0 + hh) / 2, half = (h0 + hh) % 2;
            size_t si = ((size_t)t * nb + b) * QTILE + 8 * half;
            __m256 d = _mm256_mul_ps(ld_scale256(w, 0, si), dx);
            __m256 sum = _mm256_cvtepi32_ps(_mm256_sub_epi32(ia[hh][r], _mm256_set1_epi32(corr)));
            acc[hh][r] = _mm256_fmadd_ps(d, sum, acc[hh][r]);
            if (w->has_m) acc[hh][r] = _mm256_fmadd_ps(ld_scale256(w, 1, si), ds, acc[hh][r]);
        }
    }
}

TARGET_AVX2 INLINE void q8q6_256(const qmat *w, int h0, const acts *a, float *y, int ldy, int n, const int HT,
                                 const int R) {
    __m256 acc[4][4];
    for (int hh = 0; hh < HT; hh++)
        for (int r = 0; r < R; r++) acc[hh][r] = _mm256_setzero_ps();
    const int nb = w->in / 16, in = w->in;
    for (int b = 0; b < nb; b++) {
        __m256i ia[4][4];
        for (int hh = 0; hh < HT; hh++)
            for (int r = 0; r < R; r++) ia[hh][r] = _mm256_setzero_si256();
        for (int hh = 0; hh < HT; hh++) {
            int t = (h0 + hh) / 2, half = (h0 + hh) % 2;
            __m256i v[4];
            q6_unpack256(w->q + ((size_t)t * nb + b) * 192, half, v);
            for (int g = 0; g < 4; g++) {
                for (int r = 0; r < R; r++) {
                    int32_t x0;
                    memcpy(&x0, a->qx + (size_t)r * in + 16 * b + 4 * g, 4);
                    ia[hh][r] = _mm256_add_epi32(ia[hh][r], dot4_256(v[g], _mm256_set1_epi32(x0), 0));
                }
            }
        }
        q8_update256(w, a, acc, ia, b, h0, 0, HT, R);
    }
    for (int hh = 0; hh < HT; hh++) {
        int t = (h0 + hh) / 2, half = (h0 + hh) % 2, last = (h0 + hh) / 2 == (h0 + HT - 1) / 2;
        int valid = last ? n - 8 * half : 8;
        for (int r = 0; r < R; r++)
            store256(y + (size_t)r * ldy + (size_t)(t - h0 / 2) * QTILE + 8 * half, acc[hh][r], valid);
    }
}

TARGET_AVX2 __attribute__((noinline)) static void q8q6_256_shapes(const qmat *w, int h0, const acts *a, float *y,
                                                                  int ldy, int n, int HT, int R) {
    switch (HT * 16 + R) { /* the shapes run256 asks for */
        case 0x41: q8q6_256(w, h0, a, y, ldy, n, 4, 1); break;
        case 0x22: q8q6_256(w, h0, a, y, ldy, n, 2, 2); break;
        case 0x11: q8q6_256(w, h0, a, y, ldy, n, 1, 1); break;
        case 0x12: q8q6_256(w, h0, a, y, ldy, n, 1, 2); break;
        case 0x13: q8q6_256(w, h0, a, y, ldy, n, 1, 3); break;
        default: q8q6_256(w, h0, a, y, ldy, n, 1, 4); break;
    }
}

/* scale_at for a half tile: half-precision scales without sub-scales read straight (SF = 1), any other format
 * through ld_scale256 (SF = 0), so that the common formats' loop has no branch to keep its accumulators across */
TARGET_AVX2 INLINE __m256 scale256(const qmat *w, int which, size_t i, const int SF) {
    if (SF == 1) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)(which ? w->m : w->s) + i)));
    return ld_scale256(w, which, i);
}

/* q8il_512 for AVX2 (blocks of 32: KIND_Q4, KIND_Q5, KIND_U8), H half tiles of 8 output rows from half tile `half` (H = 2:
 * both halves of tile t, each activation broadcast serving both): the same integer sums and float updates.
 * KIND_Q4 adds the block's 8 byte-pair products (maddubs) in 16 bits before widening them (each at most
 * 2 * 15 * 127 = 3810 in magnitude, 8 of them 30480 < 2^15: exact); SIGNED (Q8_0, offset 128) takes the weights as
 * signed bytes (q ^ 0x80 = q - 128), multiplied through their magnitude and sign (at most 2 * 128 * 127 per pair: no
 * saturation). While it works on tile t it asks for the next tile's lines, a share per block, so that memory keeps
 * streaming while the products are computed. */
TARGET_AVX2 INLINE void q8il_256(const qmat *w, int t, int half, const int8_t *qx, const float *dx, const float *ds,
                                 const int32_t *corr, int RS, float *y, int ldy, int valid, const int KIND,
                                 const int HASM, const int CORR, const int SIGNED, const int R, const int H,
                                 const int SF) {
    __m256 acc[2][4];
    for (int h = 0; h < H; h++)
        for (int r = 0; r < R; r++) acc[h][r] = _mm256_setzero_ps();
    const int nb = w->in / 32;
    const size_t block_bytes = KIND == KIND_Q4 ? 256 : (KIND == KIND_Q5 ? 320 : 512);
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    const uint8_t *q = w->q + (size_t)t * nb * block_bytes + 32 * half;
    const char *next = (const char *)w->q + (size_t)(t + 1) * nb * block_bytes;
    for (int b = 0; b < nb; b++) {
        __m256i ia[2][4];
        const int8_t *xb = qx + (size_t)b * RS * 32;
        { /* this call's share of the next tile's lines of block b: half of them per half tile */
            const size_t from = H == 2 ? 0 : (size_t)half * (block_bytes / 2), len = H == 2 ? block_bytes : block_bytes / 2;
            for (size_t l = 0; l < len; l += 64) _mm_prefetch(next + (size_t)b * block_bytes + from + l, _MM_HINT_T1);
        }
        if (KIND == KIND_Q4 || KIND == KIND_Q5) {
            /* a group's two byte-pair products (maddubs) added in 16 bits; KIND_Q4 keeps adding the block's 8 in 16
             * bits before widening them (see above), KIND_Q5's (each at most 2 * 31 * 127) are widened per group */
            __m256i s16[2][4];
            for (int h = 0; h < H; h++)
                for (int r = 0; r < R; r++) s16[h][r] = ia[h][r] = _mm256_setzero_si256();
            for (int g = 0; g < 4; g++) {
                __m256i lo[2], hi[2];
                for (int h = 0; h < H; h++) {
                    if (KIND == KIND_Q5) {
                        q5_unpack256(q - 32 * half + (size_t)b * 320, g, half + h, &lo[h], &hi[h]);
                    } else {
                        const __m256i v = _mm256_loadu_si256((const __m256i *)(q + ((size_t)b * 4 + g) * 64 + 32 * h));
                        lo[h] = _mm256_and_si256(v, nib);
                        hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                    }
                }
                for (int r = 0; r < R; r++) {
                    int32_t x0, x1;
                    memcpy(&x0, xb + r * 32 + 4 * g, 4);
                    memcpy(&x1, xb + r * 32 + 16 + 4 * g, 4);
                    const __m256i b0 = _mm256_set1_epi32(x0), b1 = _mm256_set1_epi32(x1);
                    for (int h = 0; h < H; h++) {
                        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], b0), _mm256_maddubs_epi16(hi[h], b1));
                        if (KIND == KIND_Q5)
                            ia[h][r] = _mm256_add_epi32(ia[h][r], _mm256_madd_epi16(p, ones));
                        else
                            s16[h][r] = _mm256_add_epi16(s16[h][r], p);
                    }
                }
            }
            if (KIND == KIND_Q4)
                for (int h = 0; h < H; h++)
                    for (int r = 0; r < R; r++) ia[h][r] = _mm256_madd_epi16(s16[h][r], ones);
        } else {
            for (int h = 0; h < H; h++)
                for (int r = 0; r < R; r++) ia[h][r] = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                __m256i v[2], av[2];
                for (int h = 0; h < H; h++) {
                    v[h] = _mm256_loadu_si256((const __m256i *)(q + ((size_t)b * 8 + g) * 64 + 32 * h));
                    if (SIGNED) v[h] = _mm256_xor_si256(v[h], flip);
                    av[h] = SIGNED ? _mm256_abs_epi8(v[h]) : v[h];
                }
                for (int r = 0; r < R; r++) {
                    int32_t x0;
                    memcpy(&x0, xb + r * 32 + 4 * g, 4);
                    const __m256i xv = _mm256_set1_epi32(x0);
                    for (int h = 0; h < H; h++) {
                        const __m256i p = _mm256_maddubs_epi16(av[h], SIGNED ? _mm256_sign_epi8(xv, v[h]) : xv);
                        ia[h][r] = _mm256_add_epi32(ia[h][r], _mm256_madd_epi16(p, ones));
                    }
                }
            }
        }
        __m256 s[2], m[2];
        for (int h = 0; h < H; h++) {
            const size_t si = ((size_t)t * nb + b) * QTILE + 8 * (half + h);
            s[h] = scale256(w, 0, si, SF);
            m[h] = HASM ? scale256(w, 1, si, SF) : _mm256_setzero_ps();
        }
        for (int r = 0; r < R; r++) {
            const __m256 dxr = _mm256_set1_ps(dx[(size_t)b * RS + r]);
            for (int h = 0; h < H; h++) {
                __m256i isum = ia[h][r];
                if (CORR) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(corr[(size_t)b * RS + r]));
                const __m256 d = _mm256_mul_ps(s[h], dxr);
                acc[h][r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc[h][r]);
                if (HASM) acc[h][r] = _mm256_fmadd_ps(m[h], _mm256_set1_ps(ds[(size_t)b * RS + r]), acc[h][r]);
            }
        }
    }
    for (int h = 0; h < H; h++)
        for (int r = 0; r < R; r++) store256(y + (size_t)r * ldy + 8 * h, acc[h][r], valid - 8 * h);
}

/* one kernel per format: SF (scale256) and, for up to three rows, both half tiles at once (H = 2) */
#define Q8IL256_CASES(KIND, HASM, CORR, SIGNED, SF)                                                                \
    if (H == 2) {                                                                                                  \
        if (R == 1) q8il_256(w, t, half, qx, dx, ds, corr, RS, y, ldy, valid, KIND, HASM, CORR, SIGNED, 1, 2, SF);     \
        else if (R == 2) q8il_256(w, t, half, qx, dx, ds, corr, RS, y, ldy, valid, KIND, HASM, CORR, SIGNED, 2, 2, SF); \
        else q8il_256(w, t, half, qx, dx, ds, corr, RS, y, ldy, valid, KIND, HASM, CORR, SIGNED, 3, 2, SF);            \
    } else {                                                                                                       \
        switch (R) {                                                                                               \
            case 1: q8il_256(w, t, half, qx, dx, ds, corr, RS, y, ldy, valid, KIND, HASM, CORR, SIGNED, 1, 1, SF); break; \
            case 2: q8il_256(w, t, half, qx, dx, ds, corr, RS, y, ldy, valid, KIND, HASM, CORR, SIGNED, 2, 1, SF); break; \
            case 3: q8il_256(w, t, half, qx, dx, ds, corr, RS, y, ldy, valid, KIND, HASM, CORR, SIGNED, 3, 1, SF); break; \
            default: q8il_256(w, t, half, qx, dx, ds, corr, RS, y, ldy, valid, KIND, HASM, CORR, SIGNED, 4, 1, SF); break; \
        }                                                                                                          \
    }
#define Q8IL256_RUN(NAME, KIND, HASM, CORR, SIGNED)                                                             \
    TARGET_AVX2 __attribute__((noinline)) static void NAME(const qmat *w, int t, int half, const int8_t *qx,     \
                                                           const float *dx, const float *ds, const int32_t *corr, \
                                                           int RS, float *y, int ldy, int valid, int R, int H) { \
        if (w->half && !w->sub) {                                                                                \
            Q8IL256_CASES(KIND, HASM, CORR, SIGNED, 1)                                                           \
        } else {                                                                                                 \
            Q8IL256_CASES(KIND, HASM, CORR, SIGNED, 0)                                                           \
        }                                                                                                        \
    }
Q8IL256_RUN(q8il256_q4, KIND_Q4, 0, 0, 0)
Q8IL256_RUN(q8il256_q4m, KIND_Q4, 1, 0, 0)
Q8IL256_RUN(q8il256_q4c, KIND_Q4, 0, 1, 0)
Q8IL256_RUN(q8il256_u8m, KIND_U8, 1, 0, 0)
Q8IL256_RUN(q8il256_u8c, KIND_U8, 0, 1, 0)
Q8IL256_RUN(q8il256_u8s, KIND_U8, 0, 0, 1)
Q8IL256_RUN(q8il256_u8, KIND_U8, 0, 0, 0)
Q8IL256_RUN(q8il256_q5, KIND_Q5, 0, 0, 0)
Q8IL256_RUN(q8il256_q5m, KIND_Q5, 1, 0, 0)
Q8IL256_RUN(q8il256_q5c, KIND_Q5, 0, 1, 0)
#undef Q8IL256_RUN
#undef Q8IL256_CASES

/* q8il_256 for tile t (n valid rows) and R rows interleaved per block (R <= 8), four rows at a time (the tile stays
 * in L1 between them): up to three rows over both half tiles at once where both hold rows (three spill a few
 * accumulators, still cheaper than broadcasting every activation twice), four one half tile after the other */
TARGET_AVX2 static void run256_q8il(const qmat *w, int t, const int8_t *qx, const float *dx, const float *ds,
                                    const int32_t *corr, float *y, int ldy, int n, int R) {
    void (*kernel)(const qmat *, int, int, const int8_t *, const float *, const float *, const int32_t *, int, float *,
                   int, int, int, int);
    if (w->kind == KIND_Q4)
        kernel = w->has_m ? q8il256_q4m : (w->offset ? q8il256_q4c : q8il256_q4);
    else if (w->kind == KIND_Q5)
        kernel = w->has_m ? q8il256_q5m : (w->offset ? q8il256_q5c : q8il256_q5);
    else if (w->offset == 128)
        kernel = q8il256_u8s;
    else
        kernel = w->has_m ? q8il256_u8m : (w->offset ? q8il256_u8c : q8il256_u8);
    for (int r0 = 0; r0 < R; r0 += 4) {
        const int rr = R - r0 < 4 ? R - r0 : 4, H = rr <= 3 && n > 8 ? 2 : 1;
        for (int half = 0; half < 2 && 8 * half < n; half += H)
            kernel(w, t, half, qx + (size_t)r0 * 32, dx + r0, ds + r0, corr ? corr + r0 : NULL, R,
                   y + (size_t)r0 * ldy + 8 * half, ldy, n - 8 * half, rr, H);
    }
}


TARGET_AVX2 static void run256(const qmat *w, int t0, int TT, const float *x, int ldx, const acts *a, int mode,
                               float *y, int ldy, int R, int n) {
    /* TT tiles = 2 TT half tiles; grouped by 4, 2 or 1 by the number of rows */
    const int q8 = mode == MODE_Q8 && w->kind != KIND_F32;
    const int halves = 2 * TT, HT = R == 1 ? 4 : (R == 2 ? 2 : 1);
    for (int h = 0; h < halves;) {
        int step = HT <= halves - h ? HT : 1;
        int h0 = 2 * t0 + h, nlast = ((h0 + step - 1) / 2 == t0 + TT - 1) ? n : QTILE;
        float *yt = y + (size_t)(h0 / 2 - t0) * QTILE;
#define E(H, RR) exact256(w, h0, x, ldx, yt, ldy, nlast, H, RR)
#define Q(H, RR) q8q6_256_shapes(w, h0, a, yt, ldy, nlast, H, RR) /* q8 here is KIND_Q6 only (see il_takes) */
        if (step == 4) {
            if (q8) Q(4, 1); else E(4, 1);
        } else if (step == 2) {
            if (q8) Q(2, 2); else E(2, 2);
        } else {
            switch (R) {
                case 1: if (q8) Q(1, 1); else E(1, 1); break;
                case 2: if (q8) Q(1, 2); else E(1, 2); break;
                case 3: if (q8) Q(1, 3); else E(1, 3); break;
                default: if (q8) Q(1, 4); else E(1, 4); break;
            }
        }
#undef E
#undef Q
        h += step;
    }
}
#endif /* SPECWISE_X86 */

/* Tiles processed together for R rows: enough independent accumulators to hide the latency of the FMAs. */
static inline int tiles_for(int R, int isa, int q8) {
    if (isa == ISA_AVX512) return q8 ? 1 : (R == 1 ? 2 : 1); /* q8: several integer accumulators per row instead */
    return R == 1 ? 4 : (R == 2 ? 2 : 1);
}

/* The weights the interleaved q8 kernels take: every quantized kind on AVX-512 (run512_q8il), the blocks of 32
 * on AVX2 (run256_q8il; KIND_Q6 there stays with q8q6_256) */
static inline int il_takes(const qmat *w, int isa) {
    return w->kind != KIND_F32 && (isa == ISA_AVX512 || (isa == ISA_AVX2 && w->block == 32));
}

/* Whether a qmat describes tiles the kernels can read: a known kind with its block, a shape in range. */
static int qmat_ok(const qmat *w) {
    if (!w || !w->q || w->out < 1 || w->in < 32 || w->in % 32 || w->kind < KIND_F32 || w->kind > KIND_Q5) return 0;
    if (w->block != (w->kind == KIND_Q6 ? 16 : 32) || (w->kind != KIND_F32 && !w->s)) return 0;
    return !w->has_m || w->kind == KIND_F32 || w->m;
}

/* ---- the driver --------------------------------------------------------------------------------------------- */

/* y[k][sum of outs] = x[k][in] . [W_0; W_1; ...]^T (+ bias): the parts' outputs side by side (a fused QKV or
 * gate/up product whose parts may have different formats). All parts share `in`. */
int specwise_q_gemm(const qmat *parts, int nparts, const float *x, const float *bias, float *y, int k, int mode,
                    int threads) {
    if (k < 0 || nparts < 1 || nparts > 8 || !parts || !x || !y) return SW_EARG;
    for (int p = 0; p < nparts; p++)
        if (!qmat_ok(&parts[p]) || parts[p].in != parts[0].in) return SW_EARG;
    if (k == 0) return SW_OK;
    const int in = parts[0].in, isa = specwise_q_isa();
    int ldy = 0, tiles = 0, need_q8 = 0;
    int first_tile[9], col[9];
    for (int p = 0; p < nparts && p < 8; p++) {
        first_tile[p] = tiles;
        col[p] = ldy;
        tiles += (parts[p].out + QTILE - 1) / QTILE;
        ldy += parts[p].out;
        need_q8 |= mode == MODE_Q8 && parts[p].kind != KIND_F32;
    }
    first_tile[nparts] = tiles;
    acts a = {x, in, NULL, NULL, NULL, NULL};
    void *mem = NULL;
    const int RMAX = 8;
    /* q8 on AVX-512 and AVX2 (run512_q8il, run256_q8il): the activations interleaved per group of RMAX rows, and each distinct
     * (offset, block) of the parts' offset corrections offset * sum(qx) per weight block and row */
    const int il = need_q8 && (isa == ISA_AVX512 || isa == ISA_AVX2);
    int ncorr = 0, coff[8], cblk[8];
    const int32_t *corr[8] = {NULL};
    int8_t *qxi = NULL;
    float *dxi = NULL, *dsi = NULL;
    if (il)
        for (int p = 0; p < nparts && p < 8; p++) {
            if (!il_takes(parts + p, isa) || !parts[p].offset || (isa == ISA_AVX2 && parts[p].offset == 128)) continue;
            int c = 0;
            while (c < ncorr && (coff[c] != parts[p].offset || cblk[c] != parts[p].block)) c++;
            if (c == ncorr) {
                coff[ncorr] = parts[p].offset;
                cblk[ncorr++] = parts[p].block;
            }
        }
    if (need_q8) {
        const size_t nb = (size_t)in / 32, plain = (size_t)k * (in + nb * 4 * 2 + nb * 2 * 4);
        const size_t inter = il ? (size_t)k * (in + nb * 4 * 2 + nb * 2 * 4 * ncorr) : 0;
        mem = malloc(plain + inter + 128);
        if (!mem) return SW_ENOMEM;
        a.dx = (float *)mem;
        a.dsum = a.dx + (size_t)k * nb;
        a.isum = (int32_t *)(a.dsum + (size_t)k * nb);
        a.qx = (int8_t *)(a.isum + (size_t)k * nb * 2);
        quantize_rows(x, k, in, &a, isa);
        if (il) {
            dxi = (float *)((char *)mem + ((plain + 63) & ~(size_t)63));
            dsi = dxi + (size_t)k * nb;
            int32_t *ci = (int32_t *)(dsi + (size_t)k * nb); /* per correction: k * (in / block) */
            qxi = (int8_t *)(ci + (size_t)k * nb * 2 * ncorr);
            for (int r0 = 0; r0 < k; r0 += RMAX) {
                const int R = k - r0 < RMAX ? k - r0 : RMAX;
                for (size_t b = 0; b < nb; b++)
                    for (int r = 0; r < R; r++) {
                        const size_t from = (size_t)(r0 + r) * nb + b, to = (size_t)r0 * nb + b * R + r;
                        memcpy(qxi + to * 32, a.qx + from * 32, 32);
                        dxi[to] = a.dx[from];
                        dsi[to] = a.dsum[from];
                        const int32_t h0 = a.isum[2 * from], h1 = a.isum[2 * from + 1];
                        for (int c = 0; c < ncorr; c++) {
                            int32_t *cc = ci + (size_t)c * k * nb * 2;
                            if (cblk[c] == 32) {
                                cc[to] = coff[c] * (h0 + h1);
                            } else { /* blocks of 16: [block 16][row] in the group */
                                cc[(size_t)r0 * nb * 2 + 2 * b * R + r] = coff[c] * h0;
                                cc[(size_t)r0 * nb * 2 + (2 * b + 1) * R + r] = coff[c] * h1;
                            }
                        }
                    }
            }
            for (int p = 0; p < nparts && p < 8; p++)
                for (int c = 0; c < ncorr; c++)
                    if (il_takes(parts + p, isa) && parts[p].offset == coff[c] && parts[p].block == cblk[c])
                        corr[p] = ci + (size_t)c * k * nb * 2;
        }
    }
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
#else
        const int tid = 0, nth = 1;
#endif
        const int lo = (int)((long long)tiles * tid / nth), hi = (int)((long long)tiles * (tid + 1) / nth);
        int p = 0;
        for (int t = lo; t < hi;) {
            while (t >= first_tile[p + 1]) p++;
            const qmat *w = parts + p;
            const int lt = t - first_tile[p], ptiles = first_tile[p + 1] - first_tile[p];
            const int avail = (hi < first_tile[p + 1] ? hi : first_tile[p + 1]) - t;
            const int pq8 = mode == MODE_Q8 && w->kind != KIND_F32;
            int chunk = tiles_for(k < RMAX ? k : RMAX, isa, pq8);
            while (chunk > avail) chunk /= 2;
            for (int r0 = 0; r0 < k; r0 += RMAX) {
                const int R = k - r0 < RMAX ? k - r0 : RMAX;
                const float *xr = x + (size_t)r0 * in;
                acts ar = a;
                if (need_q8) {
                    size_t nb = (size_t)in / 32;
                    ar.qx = a.qx + (size_t)r0 * in;
                    ar.dx = a.dx + (size_t)r0 * nb;
                    ar.dsum = a.dsum + (size_t)r0 * nb;
                    ar.isum = a.isum + (size_t)r0 * nb * 2;
                }
#ifdef SPECWISE_X86
                if (il && pq8 && il_takes(w, isa)) {
                    const size_t nb = (size_t)in / 32, nbw = (size_t)in / w->block;
                    for (int c = 0; c < chunk; c++) {
                        const int t0 = lt + c;
                        const int n = (t0 + 1 == ptiles && w->out % QTILE) ? w->out % QTILE : QTILE;
                        const int32_t *cr = corr[p] ? corr[p] + (size_t)r0 * nbw : NULL;
                        float *yt = y + (size_t)r0 * ldy + col[p] + (size_t)t0 * QTILE;
                        if (isa == ISA_AVX512)
                            run512_q8il(w, t0, qxi + (size_t)r0 * in, dxi + (size_t)r0 * nb, dsi + (size_t)r0 * nb, cr,
                                        yt, ldy, n, R);
                        else
                            run256_q8il(w, t0, qxi + (size_t)r0 * in, dxi + (size_t)r0 * nb, dsi + (size_t)r0 * nb, cr,
                                        yt, ldy, n, R);
                    }
                    continue;
                }
#endif
                for (int c = 0; c < chunk;) {
                    int TT = tiles_for(R, isa, pq8);
                    while (TT > chunk - c) TT /= 2;
                    const int t0 = lt + c;
                    const int n = (t0 + TT == ptiles && w->out % QTILE) ? w->out % QTILE : QTILE;
                    float *yt = y + (size_t)r0 * ldy + col[p] + (size_t)t0 * QTILE;
#ifdef SPECWISE_X86
                    if (isa == ISA_AVX512)
                        run512(w, t0, TT, xr, in, yt, ldy, R, n);
                    else if (isa == ISA_AVX2)
                        for (int s = 0; s < R; s += 4) { /* run256 takes up to four rows */
                            acts as = ar;
                            if (need_q8) {
                                const size_t nb = (size_t)in / 32;
                                as.qx += (size_t)s * in;
                                as.dx += (size_t)s * nb;
                                as.dsum += (size_t)s * nb;
                                as.isum += (size_t)s * nb * 2;
                            }
                            run256(w, t0, TT, xr + (size_t)s * in, in, &as, mode, yt + (size_t)s * ldy, ldy,
                                   R - s < 4 ? R - s : 4, n);
                        }
                    else
#endif
                        for (int tt = 0; tt < TT; tt++)
                            tile_portable(w, t0 + tt, xr, in, &ar, mode, yt + (size_t)tt * QTILE, ldy, R,
                                          tt == TT - 1 ? n : QTILE);
                    c += TT;
                }
            }
            t += chunk;
        }
    }
    free(mem);
    if (bias) {
        for (int r = 0; r < k; r++)
            for (int o = 0; o < ldy; o++) y[(size_t)r * ldy + o] += bias[o];
    }
    return SW_OK;
}

static void q_row(const qmat *w, int row, float *out) {
    const int t = row / QTILE, L = row % QTILE, B = w->block, nb = w->in / B;
    if (w->kind == KIND_F32) {
        const float *wt = (const float *)w->q;
        for (int i = 0; i < w->in; i++) out[i] = wt[((size_t)t * w->in + i) * QTILE + L];
        return;
    }
    for (int b = 0; b < nb; b++) {
        size_t si = ((size_t)t * nb + b) * QTILE + L;
        float s = scale_at(w, si, 0), m = w->has_m ? scale_at(w, si, 1) : 0.0f;
        for (int e = 0; e < B; e++) out[B * b + e] = fmaf((float)(q_at(w, t, b, e, L) - w->offset), s, m);
    }
}

/* Row `row` of a re-packed tensor as float32 (an embedding lookup). Returns SW_OK, SW_EARG for a bad matrix or
 * SW_ERANGE for a row outside it. */
int specwise_q_row(const qmat *w, int64_t row, float *out) {
    if (!qmat_ok(w) || !out) return SW_EARG;
    if (row < 0 || row >= w->out) return SW_ERANGE;
    q_row(w, (int)row, out);
    return SW_OK;
}

/* Rows ids[0 .. n - 1] of a re-packed tensor as float32 [n][in] (embedding lookups, references). Every id is
 * checked before anything is written: SW_ERANGE when one lies outside the matrix. */
int specwise_q_gather(const qmat *w, const int64_t *ids, int64_t n, float *out) {
    if (!qmat_ok(w) || n < 0 || (n && (!ids || !out))) return SW_EARG;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->out) return SW_ERANGE;
    for (int64_t i = 0; i < n; i++) q_row(w, (int)ids[i], out + (size_t)i * w->in);
    return SW_OK;
}

/* Rows first .. first + count - 1 of a re-packed tensor re-quantized to GGUF Q4_0 blocks (out: count * in / 32
 * blocks of 18 bytes, row-major, as a file stores them, out_bytes of room), by the reference rule: per block of 32
 * values, d = v / -8 for the value v of largest magnitude, q = min(15, trunc(x / d + 8.5)), d kept as float16.
 * Lossy: for a draft model, whose proposals need not be exact. Returns SW_OK, SW_EARG for rows outside the matrix
 * or too little room, or SW_ENOMEM. */
int specwise_q_requantize_q4_0(const qmat *w, int64_t first, int64_t count, uint8_t *out, int64_t out_bytes) {
    if (!qmat_ok(w) || !out || first < 0 || count < 0 || first > w->out - count) return SW_EARG;
    const int nb = w->in / 32;
    if (out_bytes / ((int64_t)nb * 18) < count) return SW_EARG;
    float *row = malloc((size_t)w->in * sizeof(float));
    if (!row) return SW_ENOMEM;
    for (int64_t r = 0; r < count; r++) {
        q_row(w, (int)(first + r), row);
        for (int b = 0; b < nb; b++) {
            const float *x = row + 32 * b;
            float amax = 0.0f, mx = 0.0f;
            for (int i = 0; i < 32; i++)
                if (fabsf(x[i]) > amax) {
                    amax = fabsf(x[i]);
                    mx = x[i];
                }
            const float d = mx / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            uint8_t *blk = out + ((size_t)r * nb + b) * 18;
            const uint16_t dh = f2h(d);
            blk[0] = (uint8_t)(dh & 0xFF);
            blk[1] = (uint8_t)(dh >> 8);
            for (int i = 0; i < 16; i++) {
                int lo = (int)(int8_t)(x[i] * id + 8.5f), hi = (int)(int8_t)(x[i + 16] * id + 8.5f);
                lo = lo > 15 ? 15 : lo;
                hi = hi > 15 ? 15 : hi;
                blk[2 + i] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
    free(row);
    return SW_OK;
}

/* Sum of |w| over the elements [first, first + n) of the row-major flattened tensor (a trained drafter's
 * fingerprint of its target), in double precision; -1 when out of memory, -2 for a range outside the matrix. */
double specwise_q_abs_sum(const qmat *w, int64_t first, int64_t n) {
    if (!qmat_ok(w) || first < 0 || n < 0 || first > (int64_t)w->out * w->in - n) return -2.0;
    if (n == 0) return 0.0;
    const long long end = first + n, r0 = first / w->in, r1 = (end + w->in - 1) / w->in;
    double total = 0.0;
    int failed = 0;
    /* rows shared out between threads (a model's identity reads its whole output layer at start-up): each thread's
     * double sum, then their total; the order of the additions moves the result by about 1e-16 of it */
#pragma omp parallel reduction(+ : total) reduction(| : failed)
    {
        float *row = malloc((size_t)w->in * sizeof(float));
        if (!row) failed = 1;
#pragma omp for schedule(static)
        for (long long r = r0; r < r1; r++) {
            if (!row) continue; /* every thread meets the loop; one without a buffer only reports it */
            q_row(w, (int)r, row);
            const long long lo = first > r * w->in ? first - r * w->in : 0;
            const long long hi = end < (r + 1) * w->in ? end - r * w->in : w->in;
            for (long long i = lo; i < hi; i++) total += fabs((double)row[i]);
        }
        free(row);
    }
    return failed ? -1.0 : total;
}

/* ---- logits ---------------------------------------------------------------------------------------------- */

/* The largest value of x[0 .. n - 1] ignoring NaN (-inf when all are -inf or NaN), and whether a NaN was seen. */
static float row_max_portable(const float *x, int n, int *nan) {
    float best = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] != x[i]) *nan = 1;
        else if (x[i] > best) best = x[i];
    }
    return best;
}

#ifdef SPECWISE_X86
TARGET_AVX2 static float row_max_avx2(const float *x, int n, int *nan) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, bad = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
        m0 = _mm256_max_ps(m0, a);
        m1 = _mm256_max_ps(m1, b);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_max_ps(m0, m1));
    if (_mm256_movemask_ps(bad)) *nan = 1;
    float best = row_max_portable(x + i, n - i, nan);
    for (int l = 0; l < 8; l++) best = lanes[l] > best ? lanes[l] : best;
    return best;
}

/* The first index i with x[i] == v (n when none). */
TARGET_AVX2 static int find_avx2(const float *x, int n, float v) {
    const __m256 t = _mm256_set1_ps(v);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_EQ_OQ));
        if (mask) return i + __builtin_ctz((unsigned)mask);
    }
    while (i < n && x[i] != v) i++;
    return i;
}
#endif

/* For each of `rows` rows of n logits: the index of the first largest value (torch.argmax's choice) in argmax.
 * Returns flags: 1 when a NaN was seen (argmax is then not set for that row: NaN has no order), 2 when +inf was
 * seen, 4 when some row is entirely -inf. One read of the logits replaces the several passes of a check for
 * invalid values followed by an argmax. */
int specwise_logits_scan(const float *x, int rows, int n, int64_t *argmax) {
    int flags = 0;
    for (int r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * n;
        int nan = 0;
#ifdef SPECWISE_X86
        float best = specwise_q_isa() >= ISA_AVX2 ? row_max_avx2(row, n, &nan) : row_max_portable(row, n, &nan);
#else
        float best = row_max_portable(row, n, &nan);
#endif
        if (nan) {
            flags |= 1;
            continue;
        }
        if (best == INFINITY) flags |= 2;
        if (best == -INFINITY) flags |= 4;
        int at = 0;
#ifdef SPECWISE_X86
        if (specwise_q_isa() >= ISA_AVX2)
            at = find_avx2(row, n, best);
        else
#endif
            while (at < n && row[at] != best) at++;
        argmax[r] = at;
    }
    return flags;
}
