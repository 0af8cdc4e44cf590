/*
 * The portable path: the reference order of operations every vector path follows (see quant_internal.h), for the
 * activations of MODE_Q8 and for the products of a tile.
 */
#include "specwise.h"

#include "quant_internal.h"

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

static void tiles_portable(const qmat *w, int t0, int TT, const float *x, int ldx, const acts *a, int mode, float *y,
                           int ldy, int R, int n) {
    for (int tt = 0; tt < TT; tt++)
        tile_portable(w, t0 + tt, x, ldx, a, mode, y + (size_t)tt * QTILE, ldy, R, tt == TT - 1 ? n : QTILE);
}

const qkernels qk_portable = {
    .isa = ISA_PORTABLE,
    .quantize = quantize_rows_portable,
    .tiles = tiles_portable,
    .tiles_for = {{0, 4, 2, 1, 1, 1, 1, 1, 1}, {0, 4, 2, 1, 1, 1, 1, 1, 1}},
    .row_max = logits_max_portable,
    .find = logits_find_portable,
    .rows = rows_portable,
    .rms_norm = rms_norm_portable,
    .silu_mul = silu_mul_portable,
    .gelu_mul = gelu_mul_portable,
    .store_half = store_half_portable,
    .attn = &attn_portable,
    .sample = &sample_portable,
};
