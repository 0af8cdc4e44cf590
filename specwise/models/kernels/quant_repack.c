/*
 * Re-packing GGUF tensors into specwise's tiles (the layout: quant.h and quant_internal.h): the layout of each type,
 * the bytes of each part, one row's decoding, and the re-packing of rows, slices and whole tensors (jobs), every
 * size checked before anything is written.
 */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* madvise under -std=c11 */
#endif
#include "specwise.h"

#include "quant_internal.h"
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#endif

/* ---- float16 / bfloat16 ---------------------------------------------------------------------------------- */

static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

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
