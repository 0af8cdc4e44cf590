/*
 * Quantized weights in specwise's tiled layout, and the multi-row products over them (quant_*.c).
 *
 * Every GGUF block format is re-packed at load time into one of five kinds, in tiles of 16 output rows (one
 * vector lane per output row, so no horizontal sums):
 *   KIND_F32  float32 weights                  (F32, F16, BF16)             w = v
 *   KIND_Q4   4-bit q, blocks of 32 inputs     (Q4_0, Q4_1, Q4_K)           w = (q - offset) * s + m
 *   KIND_U8   8-bit q, blocks of 32            (Q8_0)
 *   KIND_Q6   6-bit q, blocks of 16            (Q6_K): 4 values in 3 bytes
 *   KIND_Q5   5-bit q, blocks of 32            (Q5_0, Q5_1, Q5_K): KIND_Q4's nibbles and a plane of fifth bits
 * with one scale s (and, for the asymmetric formats, one m) per output row and block. A sixth kind is not tiled:
 *   KIND_ROWS float32 or float16 rows as they are, row-major [out][in] (half: float16), any in: the float32
 *             models' weights (and a drafter's float16 copies), read in place
 * so that one decoder layer (specwise_qllama_rows) takes float and quantized weights alike, each matrix a qmat. The legacy formats store s and
 * m directly (float16, their own bits); the K-quants store them as the file does, compactly: one signed byte per
 * block (the 6-bit sub-scales sc and mins mn of Q4_K / Q5_K, the int8 scales of Q6_K) and, per output row and
 * super-block of 256 inputs, the float16 factors d (and dmin), so that s = d * sc and m = -(dmin * mn) in float32
 * (exact products, the values gguf computes). The conversion keeps the file's numbers: dequantizing the tiles gives
 * the values `gguf.quants.dequantize` gives, up to float rounding of one fused multiply-add.
 */
#ifndef SPECWISE_QUANT_H
#define SPECWISE_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { KIND_F32 = 0, KIND_Q4 = 1, KIND_U8 = 2, KIND_Q6 = 3, KIND_Q5 = 4, KIND_ROWS = 5 };
enum { MODE_EXACT = 0, MODE_Q8 = 1 };
enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
#define QTILE 16

typedef struct {
    int kind;    /* KIND_* */
    int block;   /* inputs per scale: 32, or 16 (KIND_Q6); 32 for KIND_F32 (accumulator split); 0 for KIND_ROWS */
    int offset;  /* q - offset is the signed value (0 for the asymmetric formats) */
    int has_m;   /* m present (asymmetric formats) */
    int half;    /* s and m (with sub: sd and md) stored as float16 (exact: the files' scales are float16);
                  * KIND_ROWS: the rows are float16 (1) or float32 (0) */
    int out;     /* output rows (not padded) */
    int in;      /* inputs, a multiple of 32 (KIND_ROWS: any, >= 1) */
    const uint8_t *q;  /* tiles of q (KIND_Q4, KIND_U8, KIND_Q6, KIND_Q5), of float32 weights (KIND_F32), or the rows
                        * (KIND_ROWS) */
    const void *s;     /* [tiles][blocks][16] scales */
    const void *m;     /* [tiles][blocks][16] offsets, or NULL */
    int sub;           /* 0: s and m are the scales (float16 when half, else float32); k > 0 (K-quants): s and m are
                        * int8 sub-scales [tiles][blocks][16], times the factors sd / md of their super-block of
                        * 2^k blocks */
    const void *sd;    /* [tiles][in / (block 2^sub)][16] factors d of s (float16 when half, else float32), or NULL */
    const void *md;    /* the same for m: -dmin (m = (-dmin) * mn = -(dmin * mn)), or NULL */
} qmat;

/* Status codes of the entry points that check their arguments (0 is success). */
enum { SW_OK = 0, SW_EARG = -1, SW_ENOMEM = -2, SW_ERANGE = -3 };

/* The largest output rows or inputs of one matrix: the tiles index rows and inputs with int. */
#define QMAX_DIM ((int64_t)1 << 30)

/* Where specwise_q_repack writes one tensor's tiles, with the bytes the caller allocated for each part (checked
 * against the layout specwise_q_sizes gives for type, out and in before anything is written). */
typedef struct {
    int32_t type;                  /* GGML type id */
    int64_t out, in;               /* the whole tensor's shape */
    uint8_t *q;                    /* tiles of q (or float32 weights) */
    void *s, *m, *sd, *md;         /* scales, offsets, the K-quants' factors (NULL where the layout has none) */
    int64_t q_bytes, s_bytes, m_bytes, sd_bytes, md_bytes; /* what each buffer holds */
} qpack;

/* One tensor to re-pack whole (specwise_q_repack_jobs): its tiles, and its raw blocks, row-major, raw_bytes of
 * them (e.g. a read-only mapping of the file); rows: NULL, or for each output row the row of raw it is (a
 * permutation, dst.out entries); release: 1 to hand raw's whole pages back once re-packed, for a read-only file
 * mapping only (its pages then leave the process's resident memory as the load goes on, and are read again from
 * the file if touched; anonymous memory would read back as zeros). */
typedef struct {
    qpack dst;
    const uint8_t *raw;
    int64_t raw_bytes;
    const int64_t *rows;
    int32_t release;
} qjob;

/* What a decoder layer does beyond the Llama layer (specwise_qllama_rows; NULL: the Llama layer). Every array has
 * one entry per layer; the windowed layers' rotary tables come with a pass's rows (qrows of specwise.h). */
enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };
typedef struct {
    const float *const *q_norm;         /* RMS norm of each query head [head_dim] before rotary (Qwen3, Gemma 3), or NULL */
    const float *const *k_norm;         /* the same for each key head, or NULL */
    const float *const *post_attn_norm; /* RMS norm of the attention's output before the residual (Gemma 3), or NULL */
    const float *const *post_mlp_norm;  /* the same for the feed-forward's output, or NULL */
    const int *window;                  /* sliding window: position p attends to p - window < j <= p (0: all), or NULL */
    float attn_scale;                   /* the scores' scale (0: 1 / sqrt(head_dim)) */
    float embed_scale;                  /* embedding rows times this in specwise_qllama_forward (0: 1) */
    int act;                            /* ACT_SILU (SwiGLU) or ACT_GELU_TANH (GeGLU) */
} qarch;

/* The exported functions are declared in specwise.h. */

/* float16 to float32, exactly (shared by the quant_*.c files and qllama.c) */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float to float16, rounding to nearest even (what F16C's vcvtps2ph does) */
static inline uint16_t f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 | ((a >> 13) & 0x3ff) : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to infinity */
    if (a < 0x38800000u) {                                  /* a float16 subnormal (or zero) */
        if (a < 0x33000000u) return (uint16_t)sign;
        const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - 0x38000000u;
    r += 0xfff + ((r >> 13) & 1);
    return (uint16_t)(sign | (r >> 13));
}

#endif
