/*
 * The AVX-512 (with VNNI) path: MODE_Q8's activations, the exact products (exact512, run512) and MODE_Q8's
 * interleaved products (q8il_512), in the reference order of operations (quant_internal.h); its table of kernels
 * (qk_avx512).
 */
#include "specwise.h"

#include "quant_internal.h"

#ifdef SPECWISE_X86

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

/* ---- the shared kernels (quant_simd.inc) over 512-bit vectors: a unit is a whole tile ---------------------- */

#define QV_BITS 512
#define QV_LANES 16
#define QV_MAXR 8
#define QV_TARGET TARGET_AVX512
#define VF __m512
#define VI __m512i
#define VF_ZERO() _mm512_setzero_ps()
#define VF_LOAD(p) _mm512_loadu_ps(p)
#define VF_SET1(v) _mm512_set1_ps(v)
#define VF_ADD(a, b) _mm512_add_ps(a, b)
#define VF_MUL(a, b) _mm512_mul_ps(a, b)
#define VF_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VF_MAX(a, b) _mm512_max_ps(a, b)
#define VF_AND(a, b) _mm512_and_ps(a, b)
#define VF_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VF_I8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define VF_OF_VI(v) _mm512_cvtepi32_ps(v)
#define VF_BITS(v) _mm512_castsi512_ps(v)
#define VF_HMAX(v) _mm512_reduce_max_ps(v)
#define VI_LOAD(p) _mm512_loadu_si512(p)
#define VI_SET1(v) _mm512_set1_epi32(v)
#define VI_ADD(a, b) _mm512_add_epi32(a, b)
#define VI_SUB(a, b) _mm512_sub_epi32(a, b)
#define VI_AND(a, b) _mm512_and_si512(a, b)
#define VI_SRLI(v, n) _mm512_srli_epi32(v, n)
#define VI_MIN(a, b) _mm512_min_epi32(a, b)
#define VI_MAX(a, b) _mm512_max_epi32(a, b)
#define VI_ROUND(v) _mm512_cvtps_epi32(v)
#define VI_HSUM(v) _mm512_reduce_add_epi32(v)
#define QV_STORE_Q(dst, q)                                                                                             \
    do {                                                                                                               \
        _mm_storeu_si128((__m128i *)(dst), _mm512_cvtepi32_epi8((q)[0]));                                              \
        _mm_storeu_si128((__m128i *)((dst) + 16), _mm512_cvtepi32_epi8((q)[1]));                                       \
    } while (0)
#define QV_STORE(p, v, n) store512(p, v, n)
#define QV_Q6_UNPACK(base, part, v) q6_unpack512(base, v)
#include "quant_simd.inc"


/* vpdpbusd with its 4 activation bytes broadcast from memory ({1to16}): one instruction instead of a broadcast
 * and a product (GCC does not fold the broadcast by itself) */
TARGET_AVX512 INLINE __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t *x4) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x4));
    return acc;
}

/* how far ahead of the block in hand q8il_512 asks for weights (the fastest of 1, 2, 4, 6 and 8 KB, into L1 or L2, on
 * an Intel Xeon) */
#define PREFETCH_AHEAD 4096

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
        { /* ask for the lines PREFETCH_AHEAD bytes on (into L2), so that memory keeps streaming while the products
           * are computed: the weights of a pass stream once, and one core's reads alone do not keep enough misses in
           * flight (a 1-token pass of Qwen2.5-Coder-1.5B 0.89x the time, a 5-token pass 0.74x:
           * benchmarks/results/prefetch_pass_ab_qwen.json) */
            const char *pf = (const char *)q + (size_t)b * BB + PREFETCH_AHEAD;
            for (int l = 0; l < BB; l += 64) _mm_prefetch(pf + l, _MM_HINT_T1);
        }
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

/* exact (float32 activations) on AVX-512 (q8: the interleaved kernels, for every quantized kind) */
TARGET_AVX512 static void run512(const qmat *w, int t0, int TT, const float *x, int ldx, const acts *a, int mode,
                                 float *y, int ldy, int R, int n) {
    (void)a;
    (void)mode;
#define EXACT(T, RR) exact512(w, t0, x, ldx, y, ldy, n, T, RR)
    SHAPES(EXACT)
#undef EXACT
}

const qkernels qk_avx512 = {
    .isa = ISA_AVX512,
    .quantize = quantize_rows_512,
    .tiles = run512,
    .q8il =
        {
            [KIND_Q4] = {[Q8IL_PLAIN] = q8il_q4, [Q8IL_M] = q8il_q4m, [Q8IL_C] = q8il_q4c},
            [KIND_U8] = {[Q8IL_PLAIN] = q8il_u8, [Q8IL_M] = q8il_u8m, [Q8IL_C] = q8il_u8c},
            [KIND_Q6] = {[Q8IL_C] = q8il_q6c}, /* Q6_K: offset 32, no m */
            [KIND_Q5] = {[Q8IL_PLAIN] = q8il_q5, [Q8IL_M] = q8il_q5m, [Q8IL_C] = q8il_q5c},
        },
    /* q8: several integer accumulators per row instead of several tiles */
    .tiles_for = {{0, 2, 1, 1, 1, 1, 1, 1, 1}, {0, 1, 1, 1, 1, 1, 1, 1, 1}},
    .row_max = logits_max_avx2,
    .find = logits_find_avx2,
    /* the float rows, the layers' activations and float16 writes: AVX2's loops (no wider kernel pays there) */
    .rows = rows_avx2,
    .rms_norm = rms_norm_avx512,
    .silu_mul = silu_mul_avx2,
    .gelu_mul = gelu_mul_avx2,
    .store_half = store_half_avx2,
    .attn = &attn_avx512,
    .sample = &sample_avx512,
};
#endif /* SPECWISE_X86 */
