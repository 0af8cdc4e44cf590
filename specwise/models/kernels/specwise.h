/*
 * Every function the native library exports, declared here once; every .c file of the library includes this header,
 * so the compiler checks each definition against its declaration. Python binds each one with ctypes (in
 * kernels/__init__.py, kernels/quant.py and drafters/suffix.py); tests/test_native_interface.py checks those
 * bindings against the prototypes below and that the built library exports exactly these functions.
 *
 * Conventions: matrices are row-major; k is a pass's row count; `threads` the OpenMP threads to use; the quantized
 * entry points return 0 on success or a status (SW_* of quant.h, or the codes their comments in the .c files give).
 */
#ifndef SPECWISE_H
#define SPECWISE_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h" /* qmat, qpack, qarch */

/* ---- float32 kernels (smallgemm.c, llama.c; built on x86-64 only, need AVX2, FMA and F16C) ---- */

/* y[k][out] = x[k][in] . w[out][in]^T (+ bias[out], or NULL), float32 weights. */
void specwise_small_gemm(const float *x, const float *w, const float *bias, float *y, int k, int in, int out,
                         int threads);
/* The same with w stored as float16. */
void specwise_small_gemm_f16(const float *x, const uint16_t *w, const float *bias, float *y, int k, int in, int out,
                             int threads);
/* The float32 decoder layers of a Llama-family model over k rows at positions start.. (0, or 1: head_dim > 512). */
int specwise_llama_layers(int n_layers, int hidden, int n_heads, int n_kv, int head_dim, int inter, float eps,
                          const float *const *attn_norm, const float *const *qkv_w, const float *const *qkv_b,
                          const float *const *o_w, const float *const *o_b, const float *const *mlp_norm,
                          const float *const *gate_up_w, const float *const *down_w, float *k_cache,
                          float *v_cache, int capacity, const float *cos_t, const float *sin_t, float *x, int k,
                          int start, float *scratch, float *scores, int threads, int half);

/* ---- quantized weights and products (quant_repack.c, quant_gemm.c; the logits scan: logits.c) ---- */

/* The best instruction path this CPU supports (ISA_*). */
int specwise_q_isa_supported(void);
/* The instruction path in use. */
int specwise_q_isa(void);
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

/* ---- quantized decoder layers (qllama.c) ---- */

/* Enable (1) or disable (0) the layers' timings; copies the sums so far into out[3] (if not NULL). */
void specwise_qllama_timings(int enable, double *out);
/* Floats of scratch the decoder layers need for k rows: specwise_qllama_rows's and specwise_llama_layers's (both
 * carve h, tmp, qkv, attn, gate/up and act from it alike; built on every platform). */
size_t specwise_qllama_scratch_floats(int hidden, int n_heads, int n_kv, int head_dim, int inter, int k);
/* The decoder layers over k rows, each with its own cache and position (a ragged batch). */
int specwise_qllama_rows(int n_layers, int hidden, int n_heads, int n_kv, int head_dim, int inter, float eps,
                         const float *const *attn_norm, const qmat *weights, const float *const *qkv_b,
                         const float *const *mlp_norm, float *const *k_rows, float *const *v_rows, const int *cap,
                         const int *pos, const float *cos_t, const float *sin_t, float *x, int k, float *scratch,
                         float *scores, int threads, int mode, int kv_half, const qarch *arch);
/* The RMS norm of k rows of n (the layers' own, also the final norm of a batch's pass). */
void specwise_rms_norm_rows(const float *x, const float *w, float *y, int k, int n, float eps);
/* One sequence's whole pass: embedding rows, the layers (specwise_qllama_rows's arguments), final norm, output layer. */
int specwise_qllama_forward(int n_layers, int hidden, int n_heads, int n_kv, int head_dim, int inter, float eps,
                            const float *const *attn_norm, const qmat *weights, const float *const *qkv_b,
                            const float *const *mlp_norm, float *const *k_rows, float *const *v_rows, const int *cap,
                            const int *pos, const float *cos_t, const float *sin_t, float *x, int k, float *scratch,
                            float *scores, int threads, int mode, int kv_half, const qarch *arch, const qmat *embed,
                            const int64_t *ids, const float *final_norm, float final_eps, int keep, float *features,
                            const qmat *head, float *logits);
/* The head drafter's step over n positions: fused input, its layer, out norm, and optionally the output layer. */
int specwise_head_step(int hidden, int n_heads, int n_kv, int head_dim, int inter, float eps, const float *attn_norm,
                       const qmat *weights, const float *mlp_norm, float *k_cache, float *v_cache, int cap, int start,
                       const float *cos_t, const float *sin_t, const float *features, const float *emb, int n,
                       const float *feature_norm, const float *embed_norm, const qmat *fc, const float *out_norm,
                       float *pred, float *scratch, float *scores, int threads, const qmat *out_w, float *logits,
                       int64_t *best, float *top_prob);

/* ---- sampling (sample.c) ---- */

/* Use the portable loops only (1) or the best the CPU has (0). */
void specwise_probs_portable(int on);
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
/* Draft up to k tokens from the most frequent continuations of a match, with their confidences and counts. */
int64_t specwise_suffix_draft(const uint32_t *text, int64_t n, const int32_t *sa, int64_t m, int64_t lo, int64_t hi,
                              int64_t depth, int64_t max_depth, int64_t k, double stop, double smooth, double half,
                              int64_t scan, int32_t *tokens, float *conf, int64_t *counts);

#endif
