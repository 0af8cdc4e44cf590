/*
 * The AVX2 + FMA path: MODE_Q8's activations, the exact products (exact256), MODE_Q8 for KIND_Q6 (q8q6s_256 for
 * Q6_K, q8q6_256 otherwise), both over half tiles of 8 output rows (run256), and MODE_Q8's interleaved products for
 * blocks of 32 (q8il_256, run256_q8il), in the reference order of operations (quant_internal.h).
 */
#include "specwise.h"

#include "quant_internal.h"

#ifdef SPECWISE_X86
/* ---- AVX2 + FMA ------------------------------------------------------------------------------------------------ */
/* Half tiles of 8 rows: half h of tile t holds lanes 8h .. 8h + 7, at byte 32h of each 64-byte group. */

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

/* ---- the shared kernels (quant_simd.inc) over 256-bit vectors: a unit is half a tile --------------------- */

TARGET_AVX2 INLINE int hsum256_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

TARGET_AVX2 INLINE float hmax256(__m256 m) {
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    return _mm_cvtss_f32(m4);
}

/* 32 int8 from the int32 of q[0 .. 3]: packs work within 128-bit lanes, the permutation puts the bytes back in order */
TARGET_AVX2 INLINE void store_q256(int8_t *dst, const __m256i q[4]) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(p, order));
}

#define QV_BITS 256
#define QV_LANES 8
#define QV_MAXR 4
#define QV_TARGET TARGET_AVX2
#define VF __m256
#define VI __m256i
#define VF_ZERO() _mm256_setzero_ps()
#define VF_LOAD(p) _mm256_loadu_ps(p)
#define VF_SET1(v) _mm256_set1_ps(v)
#define VF_ADD(a, b) _mm256_add_ps(a, b)
#define VF_MUL(a, b) _mm256_mul_ps(a, b)
#define VF_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VF_MAX(a, b) _mm256_max_ps(a, b)
#define VF_AND(a, b) _mm256_and_ps(a, b)
#define VF_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VF_I8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define VF_OF_VI(v) _mm256_cvtepi32_ps(v)
#define VF_BITS(v) _mm256_castsi256_ps(v)
#define VF_HMAX(v) hmax256(v)
#define VI_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VI_SET1(v) _mm256_set1_epi32(v)
#define VI_ADD(a, b) _mm256_add_epi32(a, b)
#define VI_SUB(a, b) _mm256_sub_epi32(a, b)
#define VI_AND(a, b) _mm256_and_si256(a, b)
#define VI_SRLI(v, n) _mm256_srli_epi32(v, n)
#define VI_MIN(a, b) _mm256_min_epi32(a, b)
#define VI_MAX(a, b) _mm256_max_epi32(a, b)
#define VI_ROUND(v) _mm256_cvtps_epi32(v)
#define VI_HSUM(v) hsum256_epi32(v)
#define QV_STORE_Q(dst, q) store_q256(dst, q)
#define QV_STORE(p, v, n) store256(p, v, n)
#define QV_Q6_UNPACK(base, part, v) q6_unpack256(base, part, v)
#include "quant_simd.inc"


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

/* KIND_Q6 with offset 32 and no m (Q6_K): the weights taken as signed, q - 32 in [-32, 31], multiplied through their
 * magnitude and sign (maddubs(|w|, sign(x, w)): each byte pair at most 2 * 32 * 127 = 8128 in magnitude), the block's
 * 4 groups added in 16 bits (4 * 8128 = 32512 < 2^15: exact) and widened once per block. The sum over the block is
 * sum((q - 32) x) = sum(q x) - 32 sum(x): the very integer the offset correction gives, so the float update and the
 * result are those of q8q6_256. One widening per block where q8q6_256 widens every group: the multiplier port,
 * which the widening shares with the byte products on AVX2 CPUs, does 5 operations per block instead of 8. */
TARGET_AVX2 INLINE void q8q6s_256(const qmat *w, int h0, const acts *a, float *y, int ldy, int n, const int HT,
                                  const int R) {
    __m256 acc[4][4];
    for (int hh = 0; hh < HT; hh++)
        for (int r = 0; r < R; r++) acc[hh][r] = _mm256_setzero_ps();
    const int nb = w->in / 16, in = w->in, nb32 = w->in / 32;
    const __m256i ones = _mm256_set1_epi16(1), off = _mm256_set1_epi8(32);
    for (int b = 0; b < nb; b++) {
        __m256i s16[4][4];
        for (int hh = 0; hh < HT; hh++) {
            int t = (h0 + hh) / 2, half = (h0 + hh) % 2;
            __m256i v[4], av[4];
            q6_unpack256(w->q + ((size_t)t * nb + b) * 192, half, v);
            for (int g = 0; g < 4; g++) {
                v[g] = _mm256_sub_epi8(v[g], off);
                av[g] = _mm256_abs_epi8(v[g]);
            }
            for (int r = 0; r < R; r++) {
                const int8_t *xr = a->qx + (size_t)r * in + 16 * b;
                __m256i sum = _mm256_setzero_si256();
                for (int g = 0; g < 4; g++) {
                    int32_t x0;
                    memcpy(&x0, xr + 4 * g, 4);
                    const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(x0), v[g]);
                    sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(av[g], xs));
                }
                s16[hh][r] = sum;
            }
        }
        for (int r = 0; r < R; r++) {
            const __m256 dx = _mm256_set1_ps(a->dx[(size_t)r * nb32 + b / 2]);
            for (int hh = 0; hh < HT; hh++) {
                int t = (h0 + hh) / 2, half = (h0 + hh) % 2;
                size_t si = ((size_t)t * nb + b) * QTILE + 8 * half;
                __m256 d = _mm256_mul_ps(ld_scale256(w, 0, si), dx);
                __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[hh][r], ones));
                acc[hh][r] = _mm256_fmadd_ps(d, sum, acc[hh][r]);
            }
        }
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
#define Q6_SHAPES(FN)                                                                                              \
    switch (HT * 16 + R) { /* the shapes run256 asks for */                                                    \
        case 0x41: FN(w, h0, a, y, ldy, n, 4, 1); break;                                                       \
        case 0x22: FN(w, h0, a, y, ldy, n, 2, 2); break;                                                       \
        case 0x11: FN(w, h0, a, y, ldy, n, 1, 1); break;                                                       \
        case 0x12: FN(w, h0, a, y, ldy, n, 1, 2); break;                                                       \
        case 0x13: FN(w, h0, a, y, ldy, n, 1, 3); break;                                                       \
        default: FN(w, h0, a, y, ldy, n, 1, 4); break;                                                         \
    }
    if (w->offset == 32 && !w->has_m) { /* Q6_K */
        Q6_SHAPES(q8q6s_256)
    } else {
        Q6_SHAPES(q8q6_256)
    }
#undef Q6_SHAPES
}

/* scale_at for a half tile: half-precision scales without sub-scales read straight (SF = 1), any other format
 * through ld_scale256 (SF = 0), so that the common formats' loop has no branch to keep its accumulators across */
TARGET_AVX2 INLINE __m256 scale256(const qmat *w, int which, size_t i, const int SF) {
    if (SF == 1) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)(which ? w->m : w->s) + i)));
    return ld_scale256(w, which, i);
}

/* q8il_512 for AVX2 (blocks of 32: KIND_Q4, KIND_Q5, KIND_U8), H half tiles of 8 output rows from half tile `half` (H = 2:
 * both halves of tile t, each activation broadcast serving both): the same integer sums and float updates.
 * Written apart from q8il_512, not from quant_simd.inc: without VNNI the byte products go through maddubs with
 * 16-bit partial sums, grouped differently (and over both half tiles at once); integer sums are exact in any order, so
 * the results are the same.
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
typedef void (*q8il256_fn)(const qmat *, int, int, const int8_t *, const float *, const float *, const int32_t *, int,
                           float *, int, int, int, int);
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
TARGET_AVX2 INLINE void run256_q8il(q8il256_fn kernel, const qmat *w, int t, const int8_t *qx, const float *dx,
                                    const float *ds, const int32_t *corr, float *y, int ldy, int n, int R) {
    for (int r0 = 0; r0 < R; r0 += 4) {
        const int rr = R - r0 < 4 ? R - r0 : 4, H = rr <= 3 && n > 8 ? 2 : 1;
        for (int half = 0; half < 2 && 8 * half < n; half += H)
            kernel(w, t, half, qx + (size_t)r0 * 32, dx + r0, ds + r0, corr ? corr + r0 : NULL, R,
                   y + (size_t)r0 * ldy + 8 * half, ldy, n - 8 * half, rr, H);
    }
}

/* the table's q8il_fn of each kernel */
#define Q8IL256_ROWS(NAME)                                                                                         \
    TARGET_AVX2 static void NAME##_rows(const qmat *w, int t, const int8_t *qx, const float *dx, const float *ds,  \
                                        const int32_t *corr, float *y, int ldy, int n, int R) {                    \
        run256_q8il(NAME, w, t, qx, dx, ds, corr, y, ldy, n, R);                                                   \
    }
Q8IL256_ROWS(q8il256_q4)
Q8IL256_ROWS(q8il256_q4m)
Q8IL256_ROWS(q8il256_q4c)
Q8IL256_ROWS(q8il256_u8m)
Q8IL256_ROWS(q8il256_u8c)
Q8IL256_ROWS(q8il256_u8s)
Q8IL256_ROWS(q8il256_u8)
Q8IL256_ROWS(q8il256_q5)
Q8IL256_ROWS(q8il256_q5m)
Q8IL256_ROWS(q8il256_q5c)
#undef Q8IL256_ROWS

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

/* run256 over up to 8 rows, four at a time */
TARGET_AVX2 static void tiles256(const qmat *w, int t0, int TT, const float *x, int ldx, const acts *a, int mode,
                                 float *y, int ldy, int R, int n) {
    for (int s = 0; s < R; s += 4) {
        acts as = *a;
        if (mode == MODE_Q8 && a->qx) { /* the activations of rows s.. ([row][w->in] and [row][w->in / 32]) */
            const size_t nb = (size_t)w->in / 32;
            as.qx += (size_t)s * w->in;
            as.dx += (size_t)s * nb;
            as.dsum += (size_t)s * nb;
            as.isum += (size_t)s * nb * 2;
        }
        run256(w, t0, TT, x + (size_t)s * ldx, ldx, &as, mode, y + (size_t)s * ldy, ldy, R - s < 4 ? R - s : 4, n);
    }
}

const qkernels qk_avx2 = {
    .isa = ISA_AVX2,
    .quantize = quantize_rows_256,
    .tiles = tiles256,
    .q8il =
        {
            [KIND_Q4] = {[Q8IL_PLAIN] = q8il256_q4_rows, [Q8IL_M] = q8il256_q4m_rows, [Q8IL_C] = q8il256_q4c_rows},
            [KIND_U8] = {[Q8IL_PLAIN] = q8il256_u8_rows, [Q8IL_M] = q8il256_u8m_rows, [Q8IL_C] = q8il256_u8c_rows,
                         [Q8IL_S] = q8il256_u8s_rows},
            [KIND_Q5] = {[Q8IL_PLAIN] = q8il256_q5_rows, [Q8IL_M] = q8il256_q5m_rows, [Q8IL_C] = q8il256_q5c_rows},
            /* KIND_Q6 (blocks of 16): q8q6_256, through run256 */
        },
    .tiles_for = {{0, 4, 2, 1, 1, 1, 1, 1, 1}, {0, 4, 2, 1, 1, 1, 1, 1, 1}},
    .row_max = logits_max_avx2,
    .find = logits_find_avx2,
    .rows = rows_avx2,
    .rms_norm = rms_norm_avx2,
    .silu_mul = silu_mul_avx2,
    .gelu_mul = gelu_mul_avx2,
    .store_half = store_half_avx2,
    .attn = &attn_avx2,
    .sample = &sample_avx2,
};
#endif /* SPECWISE_X86 */
