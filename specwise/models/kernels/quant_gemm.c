/*
 * Multi-row products over quantized weights: the instruction path in use, the driver (specwise_q_gemm) that shares
 * tiles out between threads and hands them to the path's kernels, and the row readers (row, gather, re-quantize,
 * sum of magnitudes). The order of operations all paths follow: quant_internal.h.
 */
#include "specwise.h"

#include "quant_internal.h"
#ifdef _OPENMP
#include <omp.h>
#endif

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

/* The kernels of each path, by ISA_* (a path this build lacks falls back to the portable one). */
static const qkernels *kernels_of(int isa) {
#ifdef SPECWISE_X86
    if (isa == ISA_AVX512) return &qk_avx512;
    if (isa == ISA_AVX2) return &qk_avx2;
#endif
    (void)isa;
    return &qk_portable;
}

/* The kernels in use: chosen once, at first use or by specwise_q_set_isa, and then only read. */
static const qkernels *g_kern = NULL;

const qkernels *q_kernels(void) {
    if (!g_kern) g_kern = kernels_of(detected_isa());
    return g_kern;
}

/* The best instruction path this CPU supports. */
int specwise_q_isa_supported(void) { return detected_isa(); }

/* The path in use (the best supported unless lowered by specwise_q_set_isa). */
int specwise_q_isa(void) { return q_kernels()->isa; }

int specwise_attention_bf16_supported(void) {
#ifdef SPECWISE_X86
    if (q_kernels()->isa == ISA_AVX512 && __builtin_cpu_supports("avx512bf16")) return 1;
#endif
    return 0;
}

/* Use `isa` (clamped to what the CPU supports); returns the path now in use. */
int specwise_q_set_isa(int isa) {
    const int best = detected_isa();
    g_kern = kernels_of(isa < 0 ? best : (isa > best ? best : isa));
    return g_kern->isa;
}

/* The interleaved MODE_Q8 kernel of w on the path K (NULL: none, w goes through K->tiles) and in *variant which of
 * its kernels it is (Q8IL_C: it subtracts the offset correction). */
static q8il_fn q8il_of(const qkernels *K, const qmat *w, int *variant) {
    int v = Q8IL_PLAIN;
    if (w->offset == 128 && K->q8il[w->kind][Q8IL_S])
        v = Q8IL_S;
    else if (w->has_m)
        v = Q8IL_M;
    else if (w->offset)
        v = Q8IL_C;
    *variant = v;
    return K->q8il[w->kind][v];
}

/* Whether a qmat describes a matrix the kernels can read: tiles of a known kind with its block and a shape in range,
 * or float rows (KIND_ROWS: float32 or float16, any width). */
int qmat_ok(const qmat *w) {
    if (w && w->kind == KIND_ROWS) return w->q && w->out >= 1 && w->in >= 1 && (w->half == 0 || w->half == 1);
    if (!w || !w->q || w->out < 1 || w->in < 32 || w->in % 32 || w->kind < KIND_F32 || w->kind > KIND_Q5) return 0;
    if (w->block != (w->kind == KIND_Q6 ? 16 : 32) || (w->kind != KIND_F32 && !w->s)) return 0;
    return !w->has_m || w->kind == KIND_F32 || w->m;
}

/* ---- the driver --------------------------------------------------------------------------------------------- */

/* Float rows (KIND_ROWS): the parts' outputs shared out between threads in runs of 4 (the float loops' tiles), each
 * thread's contiguous share handed to the path's rows kernel part by part; y [k][ldy]. */
static void rows_gemm(const qkernels *K, const qmat *parts, int nparts, const float *x, float *y, int k, int ldy,
                      int threads) {
    int first[9], col[9], units = 0, at = 0;
    for (int p = 0; p < nparts; p++) {
        first[p] = units;
        col[p] = at;
        units += (parts[p].out + 3) / 4;
        at += parts[p].out;
    }
    first[nparts] = units;
#pragma omp parallel num_threads(threads)
    {
        int lo, hi;
        thread_share(units, &lo, &hi);
        int p = 0;
        for (int u = lo; u < hi;) {
            while (u >= first[p + 1]) p++;
            const int end = hi < first[p + 1] ? hi : first[p + 1];
            const int o0 = 4 * (u - first[p]), o1 = 4 * (end - first[p]);
            K->rows(parts + p, o0, o1 < parts[p].out ? o1 : parts[p].out, x, k, y + col[p], ldy);
            u = end;
        }
    }
}

/* Rows r_lo .. r_hi - 1 (whole groups of RMAX from r_lo) of the quantized activations a, interleaved per group of
 * RMAX rows for the interleaved kernels (qx [block][row][32], dx and dsum [block][row]), with each distinct
 * (offset, block) correction offset * sum(qx) per weight block and row (ci: ncorr arrays of k * in / 16). */
static void interleave_acts(const acts *a, int k, int in, int r_lo, int r_hi, int RMAX, int8_t *qxi, float *dxi,
                            float *dsi, int32_t *ci, int ncorr, const int *coff, const int *cblk) {
    const size_t nb = (size_t)in / 32;
    for (int r0 = r_lo; r0 < r_hi; r0 += RMAX) {
        const int R = k - r0 < RMAX ? k - r0 : RMAX;
        for (size_t b = 0; b < nb; b++)
            for (int r = 0; r < R; r++) {
                const size_t from = (size_t)(r0 + r) * nb + b, to = (size_t)r0 * nb + b * R + r;
                memcpy(qxi + to * 32, a->qx + from * 32, 32);
                dxi[to] = a->dx[from];
                dsi[to] = a->dsum[from];
                const int32_t h0 = a->isum[2 * from], h1 = a->isum[2 * from + 1];
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
}

/* y[k][sum of outs] = x[k][in] . [W_0; W_1; ...]^T (+ bias): the parts' outputs side by side (a fused QKV or
 * gate/up product whose parts may have different formats). All parts share `in`, and are all tiles or all float
 * rows (KIND_ROWS: computed in float32 whatever the mode). */
int specwise_q_gemm(const qmat *parts, int nparts, const float *x, const float *bias, float *y, int k, int mode,
                    int threads) {
    if (k < 0 || nparts < 1 || nparts > 8 || !parts || !x || !y || threads < 1) return SW_EARG;
    const int float_rows = parts[0].kind == KIND_ROWS;
    for (int p = 0; p < nparts; p++)
        if (!qmat_ok(&parts[p]) || parts[p].in != parts[0].in || (parts[p].kind == KIND_ROWS) != float_rows)
            return SW_EARG;
    if (k == 0) return SW_OK;
    const int in = parts[0].in;
    const qkernels *K = q_kernels();
    if (float_rows) {
        int ldy = 0;
        for (int p = 0; p < nparts; p++) ldy += parts[p].out;
        rows_gemm(K, parts, nparts, x, y, k, ldy, threads);
        if (bias)
            for (int r = 0; r < k; r++)
                for (int o = 0; o < ldy; o++) y[(size_t)r * ldy + o] += bias[o];
        return SW_OK;
    }
    int ldy = 0, tiles = 0, need_q8 = 0, il = 0;
    int first_tile[9], col[9], variant[8];
    q8il_fn q8il[8]; /* each part's interleaved MODE_Q8 kernel, or NULL */
    for (int p = 0; p < nparts && p < 8; p++) {
        first_tile[p] = tiles;
        col[p] = ldy;
        tiles += (parts[p].out + QTILE - 1) / QTILE;
        ldy += parts[p].out;
        const int pq8 = mode == MODE_Q8 && parts[p].kind != KIND_F32;
        need_q8 |= pq8;
        q8il[p] = pq8 ? q8il_of(K, parts + p, &variant[p]) : NULL;
        il |= q8il[p] != NULL;
    }
    first_tile[nparts] = tiles;
    acts a = {x, in, NULL, NULL, NULL, NULL};
    void *mem = NULL;
    const int RMAX = 8;
    /* the interleaved q8 kernels (il): the activations interleaved per group of RMAX rows, and each distinct
     * (offset, block) of the parts' offset corrections offset * sum(qx) per weight block and row */
    int ncorr = 0, coff[8], cblk[8];
    const int32_t *corr[8] = {NULL};
    int8_t *qxi = NULL;
    float *dxi = NULL, *dsi = NULL;
    int32_t *ci = NULL;
    if (il)
        for (int p = 0; p < nparts && p < 8; p++) {
            if (!q8il[p] || variant[p] != Q8IL_C) continue;
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
        if (il) {
            dxi = (float *)((char *)mem + ((plain + 63) & ~(size_t)63));
            dsi = dxi + (size_t)k * nb;
            ci = (int32_t *)(dsi + (size_t)k * nb); /* per correction: k * (in / block) */
            qxi = (int8_t *)(ci + (size_t)k * nb * 2 * ncorr);
            for (int p = 0; p < nparts && p < 8; p++)
                for (int c = 0; c < ncorr; c++)
                    if (q8il[p] && variant[p] == Q8IL_C && parts[p].offset == coff[c] && parts[p].block == cblk[c])
                        corr[p] = ci + (size_t)c * k * nb * 2;
        }
    }
#pragma omp parallel num_threads(threads)
    {
        if (need_q8) { /* the activations, each thread a share of the rows (a row's values depend on that row alone) */
            int r_lo, r_hi;
            thread_share(k, &r_lo, &r_hi);
            if (r_hi > r_lo) {
                const size_t nb = (size_t)in / 32;
                acts ar = a;
                ar.x = x + (size_t)r_lo * in;
                ar.qx = a.qx + (size_t)r_lo * in;
                ar.dx = a.dx + (size_t)r_lo * nb;
                ar.dsum = a.dsum + (size_t)r_lo * nb;
                ar.isum = a.isum + (size_t)r_lo * nb * 2;
                K->quantize(ar.x, r_hi - r_lo, in, &ar);
            }
            if (il) {
#pragma omp barrier
                /* interleaved per group of RMAX rows, each thread a share of the groups */
                int g_lo, g_hi;
                thread_share((k + RMAX - 1) / RMAX, &g_lo, &g_hi);
                interleave_acts(&a, k, in, g_lo * RMAX, g_hi * RMAX < k ? g_hi * RMAX : k, RMAX, qxi, dxi, dsi, ci, ncorr,
                                coff, cblk);
            }
#pragma omp barrier
        }
        int lo, hi;
        thread_share(tiles, &lo, &hi);
        int p = 0;
        for (int t = lo; t < hi;) {
            while (t >= first_tile[p + 1]) p++;
            const qmat *w = parts + p;
            const int lt = t - first_tile[p], ptiles = first_tile[p + 1] - first_tile[p];
            const int avail = (hi < first_tile[p + 1] ? hi : first_tile[p + 1]) - t;
            const int pq8 = mode == MODE_Q8 && w->kind != KIND_F32;
            int chunk = K->tiles_for[pq8][k < RMAX ? k : RMAX];
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
                if (q8il[p]) {
                    const size_t nb = (size_t)in / 32, nbw = (size_t)in / w->block;
                    for (int c = 0; c < chunk; c++) {
                        const int t0 = lt + c;
                        const int n = (t0 + 1 == ptiles && w->out % QTILE) ? w->out % QTILE : QTILE;
                        const int32_t *cr = corr[p] ? corr[p] + (size_t)r0 * nbw : NULL;
                        float *yt = y + (size_t)r0 * ldy + col[p] + (size_t)t0 * QTILE;
                        q8il[p](w, t0, qxi + (size_t)r0 * in, dxi + (size_t)r0 * nb, dsi + (size_t)r0 * nb, cr, yt, ldy,
                                n, R);
                    }
                    continue;
                }
                for (int c = 0; c < chunk;) {
                    int TT = K->tiles_for[pq8][R];
                    while (TT > chunk - c) TT /= 2;
                    const int t0 = lt + c;
                    const int n = (t0 + TT == ptiles && w->out % QTILE) ? w->out % QTILE : QTILE;
                    float *yt = y + (size_t)r0 * ldy + col[p] + (size_t)t0 * QTILE;
                    K->tiles(w, t0, TT, xr, in, &ar, mode, yt, ldy, R, n);
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
    if (w->kind == KIND_ROWS) {
        const size_t at = (size_t)row * w->in;
        for (int i = 0; i < w->in; i++)
            out[i] = w->half ? half_to_float(((const uint16_t *)w->q)[at + i]) : ((const float *)w->q)[at + i];
        return;
    }
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
    if (!qmat_ok(w) || !out || first < 0 || count < 0 || first > w->out - count || w->in % 32) return SW_EARG;
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

