/*
 * Every function the native library exports, declared here once; every .c file of the library includes this header,
 * so the compiler checks each definition against its declaration. Python binds each one with ctypes (kernels/abi.py:
 * a Structure per struct and every signature; the suffix index's in drafters/suffix/index.py); tests/test_bindings.py
 * parses this header and checks those bindings against its prototypes and structs, and that the built library
 * exports exactly these functions.
 *
 * Conventions: matrices are row-major; k is a pass's row count; `threads` the OpenMP threads to use; the quantized
 * entry points return 0 on success or a status (SW_* of quant.h, or the codes their comments in the .c files give).
 */
#ifndef SPECWISE_H
#define SPECWISE_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h" /* qmat, qpack, qarch */

/* ---- quantized weights and products (quant_repack.c, quant_gemm.c, and smallgemm.c for float rows; the logits
 * scan: logits.c). A matrix is a qmat (quant.h) of any kind: GGUF blocks re-packed into tiles, or float32 / float16
 * rows (KIND_ROWS). Every kernel runs on the one instruction path of the library's table, chosen once. ---- */

/* The best instruction path this CPU supports (ISA_*). */
int specwise_q_isa_supported(void);
/* The instruction path in use. */
int specwise_q_isa(void);
/* 1 where the path in use is AVX-512 and the CPU has AVX512_BF16 (qrun's ATTN_BF16 runs), else 0 */
int specwise_attention_bf16_supported(void);
/* Use `isa` (clamped to what the CPU supports; -1: the best); returns the path now in use. */
int specwise_q_set_isa(int isa);
/* The tiled layout of a GGML type (kind, block, offset, has_m, half, raw block and bytes, sub); -1: unsupported. */
int specwise_q_layout(int type, int *kind, int *block, int *offset, int *has_m, int *half, int *raw_block,
                      int *raw_bytes, int *sub);
/* Bytes of each part of the tiles of a tensor of this type and shape. */
int specwise_q_sizes(int type, int64_t out, int64_t in, int64_t *q_bytes, int64_t *s_bytes, int64_t *m_bytes,
                     int64_t *sd_bytes, int64_t *md_bytes);
/* Re-pack rows first .. first + count - 1 of a GGUF tensor's raw blocks into the tiles dst describes. */
int specwise_q_repack(const qpack *dst, const uint8_t *raw, int64_t raw_bytes, int64_t first, int64_t count);
/* Re-pack every tensor of jobs[0 .. n - 1] in one call (no caller code between them); *failed: the first job refused. */
int specwise_q_repack_jobs(const qjob *jobs, int64_t n, int64_t *failed);
/* y[k][sum of outs] = x[k][in] . [W_0; W_1; ...]^T (+ bias) in `mode` (MODE_EXACT or MODE_Q8). */
int specwise_q_gemm(const qmat *parts, int nparts, const float *x, const float *bias, float *y, int k, int mode,
                    int threads);
/* Row `row` of a re-packed tensor as float32. */
int specwise_q_row(const qmat *w, int64_t row, float *out);
/* Rows ids[0 .. n - 1] of a re-packed tensor as float32 [n][in]. */
int specwise_q_gather(const qmat *w, const int64_t *ids, int64_t n, float *out);
/* Rows of a re-packed tensor re-quantized to GGUF Q4_0 blocks (a draft model's narrowed weights). */
int specwise_q_requantize_q4_0(const qmat *w, int64_t first, int64_t count, uint8_t *out, int64_t out_bytes);
/* Sum of |w| over elements [first, first + n) of the flattened tensor (-1: out of memory, -2: out of range). */
double specwise_q_abs_sum(const qmat *w, int64_t first, int64_t n);
/* Each row's argmax of n logits, and flags for NaN (1), +inf (2) and a row all -inf (4). */
int specwise_logits_scan(const float *x, int rows, int n, int64_t *argmax);

/* ---- the decoder layers (qllama.c): one layer for every native model, its weights qmats of any kind ---- */

/* The layer kernels take their arguments in structs: what is fixed for a model (its shape and weights, filled once
 * at load) apart from what changes with each call (a pass's rows, the work buffers, the run options). Every count
 * and size is 64-bit, and every entry point checks them against each other before it touches memory.
 *
 * Status codes of specwise_qllama_rows, specwise_qllama_forward and specwise_head_step (0: success):
 *   1  head_dim over 512
 *   2  a row id outside the embedding, or it is not a readable matrix (forward); n outside 1..64 (head step)
 *   3  NaN logits (head step)
 *   4  an output layer the kernels cannot read (forward)
 *   5  a shape, count, weight, pointer or row position that does not fit the others
 *   6  a work buffer (scratch, scores) smaller than the call needs
 *   7  a buffer of the call's own (x, features, logits, the rotary tables) smaller than the call needs */
enum { QL_OK = 0, QL_EHEAD = 1, QL_EIDS = 2, QL_ENAN = 3, QL_EOUTPUT = 4, QL_EFIT = 5, QL_EWORK = 6, QL_EBUFFER = 7 };

/* The most rows of one call of the layer kernels (Python passes up to 64). */
#define QL_MAX_ROWS 1024

/* The shape of a stack of decoder layers. */
typedef struct {
    int64_t layers;   /* decoder layers, >= 1 */
    int64_t hidden;   /* the residual stream's width, >= 32 */
    int64_t heads;    /* query heads, a multiple of kv_heads */
    int64_t kv_heads; /* key-value heads, >= 1 */
    int64_t head_dim; /* a head's width: even, 2 .. 512 */
    int64_t inter;    /* the feed-forward's width */
    float eps;        /* the RMS norms' epsilon */
} qshape;

/* The layers' weights; each array has one entry per layer. The matrices are qmats of any kind (quant.h): a GGUF
 * model's re-packed blocks, or a float32 model's rows (KIND_ROWS, float32 or float16: then run->mode is MODE_EXACT
 * and the products are float32 whatever it is). */
typedef struct {
    const float *const *attn_norm; /* [hidden] each */
    const qmat *weights;           /* 7 per layer: q, k, v, o, gate, up, down */
    int64_t n_weights;             /* entries of weights: 7 * layers */
    const float *const *qkv_bias;  /* the q, k, v outputs' bias (NULL: none) each, or NULL: no layer has one */
    const float *const *o_bias;    /* the o output's bias (NULL: none) each, or NULL: no layer has one */
    const float *const *mlp_norm;  /* [hidden] each */
    const qarch *arch;             /* what the layers do beyond the Llama layer, or NULL */
} qlayers;

/* A pass's rows: row r is at position pos[r] of the sequence whose caches ([layers, kv_heads, cap[r], head_dim])
 * start at k_rows[r] and v_rows[r]. */
typedef struct {
    float *x;                           /* [rows, hidden]: the residual stream, updated in place */
    int64_t x_floats;                   /* floats at x */
    int64_t rows;                       /* 0 .. QL_MAX_ROWS */
    float *const *k_rows;               /* [rows] */
    float *const *v_rows;               /* [rows] */
    const int64_t *cap;                 /* [rows]: positions the row's caches hold, 1 .. 2^30 */
    const int64_t *pos;                 /* [rows]: 0 .. cap[r] - 1, and below table_rows */
    const float *cos, *sin;             /* rotary tables [table_rows, head_dim], the rotate-half sign in sin */
    const float *cos_local, *sin_local; /* those of the windowed layers (their own base; table_rows too), or NULL */
    int64_t table_rows;                 /* positions the rotary tables hold */
    int32_t kv_half;                    /* the caches hold float16 (1) or float32 (0) */
} qrows;

/* The work buffers, with the floats each holds. */
typedef struct {
    float *scratch;         /* at least specwise_qllama_scratch_floats(shape, rows) (the head step: see there) */
    int64_t scratch_floats;
    float *scores;          /* at least heads * rows * (the largest position + 1) */
    int64_t scores_floats;
} qwork;

/* How a call runs. */
typedef struct {
    int64_t threads;   /* OpenMP threads, 1 .. 4096 */
    int32_t mode;      /* MODE_EXACT or MODE_Q8 */
    int32_t attention; /* ATTN_FLOAT32 (0), or ATTN_BF16 (1) where specwise_attention_bf16_supported() */
} qrun;

/* The attention's arithmetic: float32 products, or bfloat16 products summed in float32 (AVX512_BF16 only). */
enum { ATTN_FLOAT32 = 0, ATTN_BF16 = 1 };


/* A model's weights outside its layers (specwise_qllama_forward). */
typedef struct {
    const qmat *embed;      /* [vocab, hidden] */
    const float *final_norm; /* [hidden] */
    float final_eps;
    const qmat *head;       /* the output layer [out, hidden] */
} qmodel;

/* One sequence's pass: its tokens and what it returns. */
typedef struct {
    const int64_t *ids;      /* [rows]: the tokens */
    int64_t keep;            /* logits of the last keep rows, 0 .. rows */
    float *features;         /* NULL, or [rows, hidden]: every row's final norm */
    int64_t features_floats; /* floats at features */
    float *logits;           /* [keep, head->out] */
    int64_t logits_floats;   /* floats at logits */
} qpass;

/* The head drafter's weights around its layer (specwise_head_step). */
typedef struct {
    const float *feature_norm, *embed_norm; /* [hidden] each: the norms of the fused input's two halves */
    const qmat *fc;                         /* [hidden, 2 hidden]: the fused input's projection */
    const float *out_norm;                  /* [hidden] */
} qhead;

/* One step of the head: n positions at start .. start + n - 1 of its cache. */
typedef struct {
    const float *features, *emb; /* [n, hidden] each: the target's features, the tokens' embeddings */
    int64_t n;                   /* 1 .. 64 */
    float *k_cache, *v_cache;    /* [kv_heads, cap, head_dim], float32 */
    int64_t cap, start;          /* start + n <= cap */
    const float *cos, *sin;      /* [table_rows, head_dim] */
    int64_t table_rows;          /* at least start + n */
    float *pred;                 /* [n, hidden]: the predicted features */
} qstep;

/* The output layer over a step's last row. */
typedef struct {
    const qmat *out_w;     /* [out, hidden], or NULL: none (and the rest unused) */
    float *logits;         /* [out_w->out] */
    int64_t logits_floats; /* floats at logits */
    int64_t *best;         /* the logits' argmax */
    float *top_prob;       /* NULL, or the softmax's largest probability */
} qlogits;

/* Enable (1) or disable (0) the layers' timings; copies the sums so far into out[3] (if not NULL). */
void specwise_qllama_timings(int enable, double *out);
/* Floats of scratch the decoder layers need for `rows` rows (h, tmp, qkv, attn, gate/up and act are carved from
 * it); -1 for a shape or a row count out of range. */
int64_t specwise_qllama_scratch_floats(const qshape *shape, int64_t rows);
/* The decoder layers over a pass's rows, each with its own cache and position (a ragged batch). */
int specwise_qllama_rows(const qshape *shape, const qlayers *layers, const qrows *rows, const qwork *work,
                         const qrun *run);
/* The attention of one layer alone (the layers' own loops; tiling -1: theirs, 0: per row, 1: tiled; with run's
 * ATTN_BF16 always the bfloat16 tiled loops): the queries in qkv [rows][(heads + 2 kv_heads) head_dim] against each
 * row's cache into attn [rows][heads head_dim]. */
int specwise_qllama_attention(const qshape *shape, const qrows *rows, int64_t layer, int64_t window, float scale,
                              const float *qkv, float *attn, const qwork *work, const qrun *run, int64_t tiling);
/* The RMS norm of k rows of n (the layers' own, also the final norm of a batch's pass). */
void specwise_rms_norm_rows(const float *x, const float *w, float *y, int k, int n, float eps);
/* One sequence's whole pass: embedding rows, the layers (specwise_qllama_rows's), final norm, output layer. */
int specwise_qllama_forward(const qshape *shape, const qlayers *layers, const qrows *rows, const qwork *work,
                            const qrun *run, const qmodel *model, const qpass *pass);
/* The head drafter's step over n positions: fused input, its layer, out norm, and optionally the output layer. */
int specwise_head_step(const qshape *shape, const qlayers *layer, const qhead *head, const qstep *step,
                       const qwork *work, const qrun *run, const qlogits *out);

/* ---- sampling (sample.c) ---- */

/* Probabilities [rows][n] under temperature t, top_k (0: off), top_p (1: off), min_p (0: off). */
int specwise_probs(const float *logits, int rows, int n, float t, int top_k, double top_p, float min_p, float *out);
/* Each row's inverse-CDF draw of its probabilities with uniform u[row]. */
int specwise_sample(const float *probs, int rows, int n, const double *u, int64_t *out);

/* ---- suffix index search (suffix.c) ---- */

/* The version of the suffix functions' arguments (Python refuses a library of another). */
int specwise_suffix_abi(void);
/* The longest match of the context's end in the text, and the range [*lo, *hi) of its occurrences in sa. */
int64_t specwise_suffix_match(const uint32_t *text, int64_t n, const int32_t *sa, int64_t m, const uint32_t *ctx,
                              int64_t plen, int64_t min_len, int64_t *lo, int64_t *hi);
/* A suffix index in memory: n token ids (sequences each followed by 0xFFFFFFFF) and the m positions of its suffix
 * array (m <= n, m < 2^31). */
typedef struct {
    const uint32_t *text; /* [n] */
    int64_t n;
    const int32_t *sa; /* [m] */
    int64_t m;
} sfxindex;

/* How a draft continues a match. */
typedef struct {
    int64_t depth;             /* the match's length, 0 .. n */
    int64_t max_depth;         /* the longest pattern a draft grows to (the depth the suffix array is sorted by) */
    int64_t k;                 /* the most tokens to draft, 0 .. the outputs' capacity */
    double stop, smooth, half; /* the product of confidences to stay above; the confidences' prior */
    int64_t scan;              /* continuations counted exactly in ranges up to this size, else sampled; >= 1 */
} sfxdraft;

/* Where a draft goes. */
typedef struct {
    int32_t *tokens;  /* [capacity] */
    float *conf;      /* [capacity] */
    int64_t *counts;  /* [2 capacity] */
    int64_t capacity; /* the tokens the outputs hold */
} sfxout;

/* Draft up to opts->k tokens from the most frequent continuations of a match (its occurrences sa[lo .. hi)), with
 * their confidences and counts; the number drafted, or -1 for arguments out of bounds. */
int64_t specwise_suffix_draft(const sfxindex *index, int64_t lo, int64_t hi, const sfxdraft *opts,
                              const sfxout *out);

/* ---- SentencePiece-style BPE over a GGUF vocabulary (spm.c) ---- */

/* A token's kind bits (spmvocab.kinds). */
#define SPM_ADDED 1   /* matched whole in text before the rest is split (control, unknown and user-defined tokens) */
#define SPM_SPECIAL 2 /* left out of decoding that skips special tokens */
#define SPM_RSTRIP 4  /* takes the whitespace after it (Phi-3's special tokens) */

/* A vocabulary and its merges as the encoder reads them: every array is the caller's and is only read. */
typedef struct {
    const uint8_t *bytes;         /* the tokens' UTF-8 bytes, one after another */
    const uint32_t *offsets;      /* [n + 1]: token i is bytes[offsets[i] .. offsets[i + 1]) */
    int64_t n;                    /* tokens, 1 .. 2^31 - 2 */
    int64_t longest;              /* bytes of the longest token, at most 65,535 */
    const int32_t *table;         /* [table_size]: a token's bytes -> its id, open addressing (-1: empty slot) */
    int64_t table_size;           /* a power of two above n */
    const uint8_t *kinds;         /* [n]: SPM_* bits */
    const int32_t *groups;        /* [n]: derived merges' priority group per token (0 first), or NULL: the id */
    const int64_t *pair_keys;     /* [pairs_size]: the file's merges, left << 32 | right (-1: empty); NULL: derived */
    const int64_t *pair_values;   /* [pairs_size]: rank << 32 | the merged token's id */
    int64_t pairs_size;           /* a power of two, or 0 without the file's merges */
    const int64_t *added_lengths; /* [256]: bit k - 1 set where an added token of k bytes starts with that byte
                                   * (k < 64; bit 63: one of 64 bytes or more) */
    int64_t added_max;            /* bytes of the longest added token */
    const int32_t *byte_ids;      /* [256]: the id of each byte's token <0xXX>, or -1 */
    int32_t unk;                  /* the unknown token's id, or -1 */
    int32_t space_prefix;         /* 1: a U+2581 before each piece of text between added tokens */
} spmvocab;

/* Fill table (v->table_size slots) with the ids of v's tokens by their bytes. Returns how many tokens repeat an
 * earlier token's bytes, or -1 for a vocabulary out of range. */
int64_t specwise_spm_index(const spmvocab *v, int32_t *table);
/* The ids of n strings (strings[offsets[i] .. offsets[i + 1])) into ids, -1 for one that is no token; 0, or -1 for
 * arguments out of range. */
int64_t specwise_spm_lookup(const spmvocab *v, const uint8_t *strings, const int64_t *offsets, int64_t n,
                            int32_t *ids);
/* The file's merges: (left[i], right[i]) -> rank i and merged[i], into keys and values (v->pairs_size slots; a pair
 * given twice keeps its last rank). 0, or -1 for arguments out of range. */
int64_t specwise_spm_pairs(const spmvocab *v, const int32_t *left, const int32_t *right, const int32_t *merged,
                           int64_t m, int64_t *keys, int64_t *values);
/* The ids of n bytes of UTF-8 text (no BOS or EOS) into ids[cap] (cap >= 4 n + 3 is always enough), and where spans
 * is not NULL, each id's [start, stop) in the text for an added token (-1, -1 for the others). Returns the number of
 * ids, -1 for arguments out of range, -2 when memory runs out, -3 when cap is too small. */
int64_t specwise_spm_encode(const spmvocab *v, const uint8_t *text, int64_t n, int32_t *ids, int64_t cap,
                            int64_t *spans);
/* The UTF-8 text of n ids (ids outside the vocabulary are left out; special ones too with skip_special) into
 * out[cap]; returns its length (the text is cut at cap where it is longer), -1 for arguments out of range, or -2
 * when memory runs out. */
int64_t specwise_spm_decode(const spmvocab *v, const int64_t *ids, int64_t n, int skip_special, uint8_t *out,
                            int64_t cap);

#endif
