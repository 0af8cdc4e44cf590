/* Sampling distributions over a full vocabulary in one native pass per row: temperature, top-k, softmax, top-p,
 * min-p and renormalisation, in the order and with the tie rules of specwise.sampling.probs_from_logits.
 *
 * The torch version runs a chain of tensor operations (and sorts for top-k / top-p), several milliseconds a step
 * over 49,152 or 151,936 logits; here each row is read a few times in cache. Every sum runs over eight fixed
 * lanes and exp is one polynomial written with explicit fmaf, so the result does not depend on the instruction
 * path (ISO C: no contraction of a * b + c), nor on how many rows share a call. The path is the library's one choice
 * (its table, qkernels.sample, chosen once: the best the CPU supports, or what specwise_q_set_isa set): each loop
 * is compiled once per path with that path's target attribute, and AVX2 and AVX-512 also scale and exponentiate with AVX2 intrinsics.
 * Top-k keeps the values at least as large as the k-th largest (ties kept); top-p keeps the most likely tokens
 * while the mass ranked before them is below top_p, and every token as likely as the least likely kept one.
 */

#include <stdint.h>

#include "specwise.h"

#include "quant_internal.h" /* the target attributes */

#define LANES 8

/* exp(x) for x <= 0 (0 below -86, where it is under 5e-38: such a token is never drawn): 2^j * p(r), x = j ln2 + r, |r| <= ln2 / 2,
 * p the Taylor polynomial of degree 7 (truncation below 6e-9 relative). */
static inline float exp_neg(float x) {
    if (!(x > -86.0f)) return 0.0f; /* also -inf */
    const float j = nearbyintf(x * 1.44269504088896341f);
    float p = exp_reduced(j, x);
    int32_t bits;
    memcpy(&bits, &p, 4);
    bits += (int32_t)j * (1 << 23); /* times 2^j: j >= -124 here and p in [0.7, 1.42], so the result is normal */
    memcpy(&p, &bits, 4);
    return p;
}

/* y = x / t (x / 1 is x); returns whether a +inf appeared (an overflow of the division). */
INLINE int scale_row(const float *x, int n, float t, float *y) {
    int inf = 0;
    for (int i = 0; i < n; i++) {
        y[i] = x[i] / t;
        inf |= y[i] == INFINITY;
    }
    return inf;
}

INLINE float row_max(const float *y, int n) {
    float m[LANES];
    for (int l = 0; l < LANES; l++) m[l] = -INFINITY;
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) m[l] = y[i + l] > m[l] ? y[i + l] : m[l];
    for (; i < n; i++) m[0] = y[i] > m[0] ? y[i] : m[0];
    float best = m[0];
    for (int l = 1; l < LANES; l++) best = m[l] > best ? m[l] : best;
    return best;
}

/* Sums run over eight float lanes in chunks of CHUNK values; each chunk's lanes, added in order, go into a double
 * total (float lanes alone drift by 1e-5 over 150,000 values, enough to move the top-p boundary). */
#define CHUNK 256

static inline void flush(float s[LANES], double *total) {
    float c = 0.0f;
    for (int l = 0; l < LANES; l++) {
        c += s[l];
        s[l] = 0.0f;
    }
    *total += c;
}

/* y = exp(y - max); returns their sum */
INLINE double exp_row(float *y, int n, float max) {
    float s[LANES] = {0};
    double total = 0.0;
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int l = 0; l < LANES; l++) {
            y[i + l] = exp_neg(y[i + l] - max);
            s[l] += y[i + l];
        }
        if ((i + LANES) % CHUNK == 0) flush(s, &total);
    }
    flush(s, &total);
    for (; i < n; i++) {
        y[i] = exp_neg(y[i] - max);
        total += y[i];
    }
    return total;
}

#ifdef SPECWISE_X86

/* exp_neg on eight lanes: the same operations in the same order (fma is fmaf, the rounding is nearbyintf's) */
TARGET_AVX2 static inline __m256 exp_neg8(__m256 x) {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-86.0f), _CMP_GT_OQ);
    const __m256 j = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 p = exp_reduced256(j, x);
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_and_ps(j, keep)), 23);
    p = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
    return _mm256_and_ps(p, keep);
}

TARGET_AVX2 static double exp_row_avx2(float *y, int n, float max) {
    __m256 s = _mm256_setzero_ps();
    const __m256 m = _mm256_set1_ps(max);
    double total = 0.0;
    float lanes[LANES];
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        __m256 v = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(y + i), m));
        _mm256_storeu_ps(y + i, v);
        s = _mm256_add_ps(s, v);
        if ((i + LANES) % CHUNK == 0) {
            _mm256_storeu_ps(lanes, s);
            flush(lanes, &total);
            s = _mm256_setzero_ps();
        }
    }
    _mm256_storeu_ps(lanes, s);
    flush(lanes, &total);
    for (; i < n; i++) {
        y[i] = exp_neg(y[i] - max);
        total += y[i];
    }
    return total;
}

TARGET_AVX2 static float scale_max_avx2(const float *x, int n, float t, float *y, int *inf) {
    const __m256 tv = _mm256_set1_ps(t), pinf = _mm256_set1_ps(INFINITY);
    __m256 m = _mm256_set1_ps(-INFINITY), bad = _mm256_setzero_ps();
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        __m256 v = _mm256_div_ps(_mm256_loadu_ps(x + i), tv);
        _mm256_storeu_ps(y + i, v);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, pinf, _CMP_EQ_OQ));
        m = _mm256_max_ps(v, m); /* NaN-free input: the same as the portable comparison */
    }
    float lanes[LANES];
    _mm256_storeu_ps(lanes, m);
    if (_mm256_movemask_ps(bad)) *inf = 1;
    float best = -INFINITY;
    for (; i < n; i++) {
        y[i] = x[i] / t;
        if (y[i] == INFINITY) *inf = 1;
        best = y[i] > best ? y[i] : best;
    }
    for (int l = 0; l < LANES; l++) best = lanes[l] > best ? lanes[l] : best;
    return best;
}
#endif

INLINE double sum_row(const float *y, int n) {
    float s[LANES] = {0};
    double total = 0.0;
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int l = 0; l < LANES; l++) s[l] += y[i + l];
        if ((i + LANES) % CHUNK == 0) flush(s, &total);
    }
    flush(s, &total);
    for (; i < n; i++) total += y[i];
    return total;
}

INLINE void divide_row(float *y, int n, float d) {
    for (int i = 0; i < n; i++) y[i] = y[i] / d;
}

/* y[i] = 0 where y[i] < threshold (value is -INFINITY or 0 per caller) */
INLINE void drop_below(float *y, int n, float threshold, float value) {
    for (int i = 0; i < n; i++) y[i] = y[i] < threshold ? value : y[i];
}

/* One path's loops over a row: scale by 1 / t with the row's max (*inf = 1 when a +inf appears), exp(y - max) with
 * the sum, max, sum, divide, drop below a threshold. */
struct sample_loops {
    float (*scale_max)(const float *x, int n, float t, float *y, int *inf);
    double (*exp_row)(float *y, int n, float max);
    float (*row_max)(const float *y, int n);
    double (*sum_row)(const float *y, int n);
    void (*divide_row)(float *y, int n, float d);
    void (*drop_below)(float *y, int n, float threshold, float value);
};
typedef struct sample_loops row_loops;

/* The loops above compiled for one path (TARGET: its attribute) */
#define ROW_LOOPS(SUFFIX, TARGET)                                                                                \
    TARGET static float row_max##SUFFIX(const float *y, int n) { return row_max(y, n); }                        \
    TARGET static double sum_row##SUFFIX(const float *y, int n) { return sum_row(y, n); }                       \
    TARGET static void divide_row##SUFFIX(float *y, int n, float d) { divide_row(y, n, d); }                     \
    TARGET static void drop_below##SUFFIX(float *y, int n, float threshold, float value) {                       \
        drop_below(y, n, threshold, value);                                                                      \
    }
ROW_LOOPS(_portable, )
#ifdef SPECWISE_X86
ROW_LOOPS(_avx2, TARGET_AVX2)
ROW_LOOPS(_avx512, TARGET_AVX512)
#endif
#undef ROW_LOOPS

static float scale_max_portable(const float *x, int n, float t, float *y, int *inf) {
    *inf = scale_row(x, n, t, y);
    return row_max(y, n);
}

static double exp_row_portable(float *y, int n, float max) { return exp_row(y, n, max); }

/* each path's loops, which the library's table of that path holds (qkernels.sample) */
const struct sample_loops sample_portable = {scale_max_portable, exp_row_portable, row_max_portable,
                                             sum_row_portable, divide_row_portable, drop_below_portable};
#ifdef SPECWISE_X86
const struct sample_loops sample_avx2 = {scale_max_avx2, exp_row_avx2, row_max_avx2, sum_row_avx2, divide_row_avx2,
                                         drop_below_avx2};
const struct sample_loops sample_avx512 = {scale_max_avx2, exp_row_avx2, row_max_avx512, sum_row_avx512,
                                           divide_row_avx512, drop_below_avx512};
#endif

/* The k-th largest of y[0 .. n - 1] (1 <= k < n): a min-heap of the k largest seen. */
static float kth_largest(const float *y, int n, int k, float *heap) {
    for (int i = 0; i < k; i++) { /* heapify the first k */
        int c = i;
        heap[c] = y[i];
        while (c > 0 && heap[(c - 1) / 2] > heap[c]) {
            float t = heap[c];
            heap[c] = heap[(c - 1) / 2];
            heap[(c - 1) / 2] = t;
            c = (c - 1) / 2;
        }
    }
    for (int i = k; i < n; i++) {
        if (!(y[i] > heap[0])) continue;
        heap[0] = y[i];
        int c = 0;
        for (;;) {
            int a = 2 * c + 1, b = a + 1, s = c;
            if (a < k && heap[a] < heap[s]) s = a;
            if (b < k && heap[b] < heap[s]) s = b;
            if (s == c) break;
            float t = heap[c];
            heap[c] = heap[s];
            heap[s] = t;
            c = s;
        }
    }
    return heap[0];
}

static int desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Buckets of non-negative floats by their top bits (exponent and three mantissa bits): ordered like the values. */
#define BUCKET_SHIFT 20
#define N_BUCKETS (1 << (31 - BUCKET_SHIFT))

/* The least likely kept probability of the nucleus top_p of p (sum 1): tokens in decreasing order are kept
 * while the mass before them is below top_p; a tie group is kept when the mass strictly above it is.
 * Only values of at least (1 - top_p) / n can be kept (below that, more than top_p lies above), so those are
 * gathered first (usually a small part of the vocabulary), bucketed by their top bits, and only the bucket where
 * the mass crosses top_p is sorted. members: room for 3n floats. */
static float top_p_threshold(const float *p, int n, double top_p, double *mass, float *members) {
    const float floor = (float)(0.5 * (1.0 - top_p) / n);
    int m = 0;
    for (int i = 0; i < n; i++) { /* branch-free gathering */
        members[m] = p[i];
        m += p[i] >= floor;
    }
    if (m == 0) return 0.0f;
    /* two rounds of buckets (the top 11 bits, then the next 11 of the bucket where the mass crosses top_p), so
     * that the values left to sort share their top 22 bits: few even for a flat distribution */
    double above = 0.0; /* mass of the values above the current group */
    float *group = members;
    int g = m;
    const int shifts[2] = {20, 9};
    double crossing = 0.0;
    for (int level = 0; level < 2; level++) {
        const int shift = shifts[level];
        memset(mass, 0, sizeof(double) * N_BUCKETS);
        for (int i = 0; i < g; i++) {
            uint32_t bits;
            memcpy(&bits, &group[i], 4);
            mass[(bits >> shift) & (N_BUCKETS - 1)] += group[i];
        }
        int b = N_BUCKETS - 1;
        for (; b > 0; b--) {
            if (mass[b] > 0.0 && above + mass[b] >= top_p) break;
            above += mass[b];
        }
        crossing = mass[b];
        /* values in buckets above b have less than top_p above them (kept); values below b at least top_p
         * (dropped): only bucket b goes on */
        float *next = group + g;
        int h = 0;
        for (int i = 0; i < g; i++) {
            uint32_t bits;
            memcpy(&bits, &group[i], 4);
            next[h] = group[i];
            h += (int)((bits >> shift) & (N_BUCKETS - 1)) == b;
        }
        group = next;
        g = h;
    }
    if (g == 0 || !(above + crossing >= top_p)) return 0.0f; /* rounding left the mass short: keep everything */
    qsort(group, (size_t)g, sizeof(float), desc);
    float threshold = group[0];
    double before = above; /* mass ranked before group[i] */
    for (int i = 1; i < g; i++) {
        before += group[i - 1];
        if (group[i] != group[i - 1]) { /* a new tie group: kept when the mass above it is below top_p */
            if (!(before < top_p)) break;
            threshold = group[i];
        }
    }
    return threshold;
}

/* Probabilities [rows][n] under temperature t (> 0), top_k (0: off), top_p (1: off), min_p (0: off).
 * Returns 0, 1 when dividing by the temperature overflows to +inf, 2 when out of memory. */
int specwise_probs(const float *logits, int rows, int n, float t, int top_k, double top_p, float min_p, float *out) {
    float *heap = NULL, *members = NULL;
    double *mass = NULL;
    if (top_k > 0 && top_k < n) heap = malloc(sizeof(float) * (size_t)top_k);
    if (top_p < 1.0) {
        members = malloc(sizeof(float) * 3 * (size_t)n);
        mass = malloc(sizeof(double) * N_BUCKETS);
    }
    if ((top_k > 0 && top_k < n && !heap) || (top_p < 1.0 && (!members || !mass))) {
        free(heap); free(members); free(mass);
        return 2;
    }
    const row_loops *K = q_kernels()->sample;
    int status = 0;
    for (int r = 0; r < rows && !status; r++) {
        const float *x = logits + (size_t)r * n;
        float *y = out + (size_t)r * n;
        int inf = 0;
        const float max = K->scale_max(x, n, t, y, &inf);
        if (inf) {
            status = 1;
            break;
        }
        if (heap) K->drop_below(y, n, kth_largest(y, n, top_k, heap), -INFINITY); /* the largest stays: max holds */
        const double total = K->exp_row(y, n, max);
        K->divide_row(y, n, (float)total);
        if (members) {
            const float threshold = top_p_threshold(y, n, top_p, mass, members);
            K->drop_below(y, n, threshold, 0.0f);
        }
        if (min_p > 0.0f) K->drop_below(y, n, min_p * K->row_max(y, n), 0.0f);
        if (members || min_p > 0.0f) K->divide_row(y, n, (float)K->sum_row(y, n));
    }
    free(heap); free(members); free(mass);
    return status;
}

/* ---- drawing a token ---------------------------------------------------------------------------------------- */

/* For each row of probabilities p[rows][n] (need not sum to 1) and uniform u[row] in [0, 1): the first token whose
 * cumulative probability exceeds u * total, the inverse-CDF draw. Sums are in double: per chunk of CHUNK values in
 * four lanes, then the chunks in order, then the values of the chosen chunk one by one (should rounding leave the
 * scan short inside that chunk, its last token of positive probability is taken). A token of probability 0 is
 * never drawn. Returns 0, or 1 when a row is negative somewhere, not finite, or all zero. */
int specwise_sample(const float *probs, int rows, int n, const double *u, int64_t *out) {
    const int chunks = (n + CHUNK - 1) / CHUNK;
    double *totals = malloc(sizeof(double) * (size_t)chunks);
    if (!totals) return 2;
    int status = 0;
    for (int r = 0; r < rows && !status; r++) {
        const float *p = probs + (size_t)r * n;
        double total = 0.0;
        int bad = 0;
        for (int c = 0; c < chunks; c++) {
            const int lo = c * CHUNK, hi = lo + CHUNK < n ? lo + CHUNK : n;
            double a[4] = {0.0, 0.0, 0.0, 0.0};
            int i = lo;
            for (; i + 4 <= hi; i += 4)
                for (int l = 0; l < 4; l++) {
                    bad |= !(p[i + l] >= 0.0f) || p[i + l] == INFINITY;
                    a[l] += p[i + l];
                }
            for (; i < hi; i++) {
                bad |= !(p[i] >= 0.0f) || p[i] == INFINITY;
                a[0] += p[i];
            }
            totals[c] = (a[0] + a[1]) + (a[2] + a[3]);
            total += totals[c];
        }
        if (bad || !(total > 0.0) || !isfinite(total)) {
            status = 1;
            break;
        }
        const double target = u[r] * total;
        double run = 0.0;
        int c = 0;
        while (c < chunks - 1 && !(run + totals[c] > target)) run += totals[c++];
        const int lo = c * CHUNK, hi = lo + CHUNK < n ? lo + CHUNK : n;
        int pick = -1, last = -1;
        for (int i = lo; i < hi; i++) {
            if (p[i] > 0.0f) last = i;
            run += p[i];
            if (run > target && p[i] > 0.0f) {
                pick = i;
                break;
            }
        }
        if (pick < 0) { /* rounding: the target lies in the last ulps of the chunk, or the chunk is all zero */
            pick = last;
            for (int j = c; pick < 0 && j >= 0; j--)
                for (int i = (j == c ? hi : (j + 1) * CHUNK) - 1; i >= j * CHUNK; i--)
                    if (p[i] > 0.0f) {
                        pick = i;
                        break;
                    }
        }
        out[r] = pick;
    }
    free(totals);
    return status;
}
