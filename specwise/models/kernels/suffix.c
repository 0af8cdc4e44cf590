/* Search of a suffix array over token ids, for the `suffix` drafter (specwise/drafters/suffix.py).
 *
 * text: n token ids (uint32); sequences are separated by SEP (0xFFFFFFFF) and the text ends with one.
 * sa: the m start positions of the suffixes that begin with a token (not a separator), sorted by their first
 * `depth` tokens at least (the drafter never compares further).
 *
 * An index is a file, so untrusted input: the Python loader checks it before it gets here, and every entry point
 * checks again what it reads. Sizes are 64-bit; each sa entry is checked against n before the text is read at it
 * (one compare per probe), a comparison stops at the end of the text, and a call with sizes, ranges or entries out
 * of bounds returns SUFFIX_BAD (-1) without reading outside its arrays.
 */
#include <stdint.h>

#include "specwise.h"

#define SEP 0xFFFFFFFFu
#define SUFFIX_BAD (-1)
#define SUFFIX_ABI 3 /* the entry points' signatures: the Python binding checks it before declaring them */

int specwise_suffix_abi(void) { return SUFFIX_ABI; }

/* sa[i] when it is a position of the text, else -1 */
static inline int64_t position(const int32_t *sa, int64_t i, int64_t n) {
    int64_t pos = sa[i];
    return (uint64_t)pos < (uint64_t)n ? pos : -1;
}

/* -1, 0, 1: the first `len` tokens of the suffix at `pos` (0 <= pos < n) against pattern p[0..len); a suffix that
 * reaches the end of the text first sorts first */
static int cmp_suffix(const uint32_t *text, int64_t n, int64_t pos, const uint32_t *p, int64_t len) {
    int64_t stop = n - pos < len ? n - pos : len;
    for (int64_t j = 0; j < stop; j++) {
        uint32_t a = text[pos + j], b = p[j];
        if (a != b) return a < b ? -1 : 1;
    }
    return stop < len ? -1 : 0;
}

/* [lo, hi) of the suffixes whose first `len` tokens are p, within [lo, hi) given; SUFFIX_BAD when an entry probed
 * is outside the text */
static int range_of(const uint32_t *text, int64_t n, const int32_t *sa, const uint32_t *p, int64_t len, int64_t *lo,
                    int64_t *hi) {
    int64_t a = *lo, b = *hi;
    while (a < b) { /* first suffix >= p */
        int64_t mid = a + (b - a) / 2, pos = position(sa, mid, n);
        if (pos < 0) return SUFFIX_BAD;
        if (cmp_suffix(text, n, pos, p, len) < 0) a = mid + 1;
        else b = mid;
    }
    int64_t first = a;
    b = *hi;
    while (a < b) { /* first suffix > p */
        int64_t mid = a + (b - a) / 2, pos = position(sa, mid, n);
        if (pos < 0) return SUFFIX_BAD;
        if (cmp_suffix(text, n, pos, p, len) <= 0) a = mid + 1;
        else b = mid;
    }
    *lo = first;
    *hi = a;
    return 0;
}

/* The longest L in [min_len, plen] such that the last L tokens of ctx[0..plen) occur in the text (0 if none), and
 * the range [*lo, *hi) of their occurrences in sa. Occurrence is monotone in L (a suffix of an occurring pattern
 * occurs), so L is found by bisection. SUFFIX_BAD: sizes out of bounds (m > n, plen >= 2^31) or an sa entry
 * outside the text. */
int64_t specwise_suffix_match(const uint32_t *text, int64_t n, const int32_t *sa, int64_t m, const uint32_t *ctx,
                              int64_t plen, int64_t min_len, int64_t *lo, int64_t *hi) {
    if (n < 0 || m < 0 || m > n || plen < 0 || plen > INT32_MAX || !lo || !hi) return SUFFIX_BAD;
    if ((m > 0 && (!text || !sa)) || (plen > 0 && !ctx)) return SUFFIX_BAD;
    int64_t good = 0, bad = plen + 1; /* good: a length known to occur (0: the empty pattern), bad: one that does not */
    int64_t good_lo = 0, good_hi = m;
    if (min_len < 1) min_len = 1;
    if (plen < min_len) return 0;
    int64_t probe = min_len; /* the shortest length first: most contexts have no match at all */
    while (bad - good > 1) {
        int64_t a = 0, b = m;
        if (range_of(text, n, sa, ctx + plen - probe, probe, &a, &b) < 0) return SUFFIX_BAD;
        if (a < b) {
            good = probe, good_lo = a, good_hi = b;
        } else {
            bad = probe;
            if (probe == min_len) return 0;
        }
        probe = good + (bad - good) / 2;
        if (probe < min_len) probe = min_len;
    }
    if (good < min_len) return 0;
    *lo = good_lo;
    *hi = good_hi;
    return good;
}

/* the token at offset `depth` (0 <= depth <= n) of the suffix sa[i] into *t; SUFFIX_BAD when that is outside the
 * text */
static inline int token_at(const uint32_t *text, int64_t n, const int32_t *sa, int64_t i, int64_t depth,
                           uint32_t *t) {
    int64_t pos = position(sa, i, n);
    if (pos < 0 || depth >= n - pos) return SUFFIX_BAD;
    *t = text[pos + depth];
    return 0;
}

/* [lo, hi) narrowed to the suffixes whose token at offset `depth` is t (the range is sorted at that offset) */
static int narrow(const uint32_t *text, int64_t n, const int32_t *sa, int64_t depth, uint32_t t, int64_t *lo,
                  int64_t *hi) {
    int64_t a = *lo, b = *hi;
    uint32_t u;
    while (a < b) {
        int64_t mid = a + (b - a) / 2;
        if (token_at(text, n, sa, mid, depth, &u) < 0) return SUFFIX_BAD;
        if (u < t) a = mid + 1;
        else b = mid;
    }
    int64_t first = a;
    b = *hi;
    while (a < b) {
        int64_t mid = a + (b - a) / 2;
        if (token_at(text, n, sa, mid, depth, &u) < 0) return SUFFIX_BAD;
        if (u <= t) a = mid + 1;
        else b = mid;
    }
    *lo = first;
    *hi = a;
    return 0;
}

/* The most frequent token at offset `depth` in [lo, hi) into *best: exact for ranges up to `scan` suffixes; for
 * larger ones the mode of `scan` evenly spaced samples (the range is sorted by that token, so the samples hit each
 * token in proportion to its count). SEP when the most frequent "token" is the end of a sequence. */
static int mode_at(const uint32_t *text, int64_t n, const int32_t *sa, int64_t depth, int64_t lo, int64_t hi,
                   int64_t scan, uint32_t *best) {
    int64_t r = hi - lo;
    uint32_t run_tok = SEP, t;
    int64_t best_n = 0, run_n = 0;
    int64_t count = r <= scan ? r : scan;
    *best = SEP;
    for (int64_t j = 0; j < count; j++) {
        int64_t i = r <= scan ? lo + j : lo + (r * j + r / 2) / scan;
        if (token_at(text, n, sa, i, depth, &t) < 0) return SUFFIX_BAD;
        if (t == run_tok) {
            run_n++;
        } else {
            run_tok = t;
            run_n = 1;
        }
        if (run_n > best_n) { /* ties: the smaller token (it came first) */
            best_n = run_n;
            *best = run_tok;
        }
    }
    return 0;
}

/* Draft up to opts->k tokens following a match of opts->depth tokens whose occurrences are sa[lo..hi): each token
 * is the most frequent continuation of the pattern so far, which then grows by it (the range narrows to its
 * occurrences). conf[i] = (count(token | pattern) + smooth * prior) / (count(pattern) + smooth), with the prior
 * L / (L + half) of a pattern of L tokens (a longer match is more often followed the same way);
 * counts[2i], counts[2i + 1] = count(token | pattern), count(pattern). Stops at k tokens, at `max_depth`, when the
 * most frequent continuation is the end of a sequence, or before a token that would bring the product of
 * confidences below `stop`. Returns the number of tokens drafted, or SUFFIX_BAD: a struct missing, sizes out of
 * bounds (m > n, m >= 2^31, [lo, hi) not within [0, m), depth > n, scan < 1, k over the outputs' capacity) or an
 * sa entry outside the text. */
int64_t specwise_suffix_draft(const sfxindex *index, int64_t lo, int64_t hi, const sfxdraft *opts,
                              const sfxout *out) {
    if (!index || !opts || !out) return SUFFIX_BAD;
    const uint32_t *text = index->text;
    const int32_t *sa = index->sa;
    const int64_t n = index->n, m = index->m, k = opts->k, scan = opts->scan, max_depth = opts->max_depth;
    const double stop = opts->stop, smooth = opts->smooth, half = opts->half;
    int64_t depth = opts->depth;
    if (n < 0 || m < 0 || m > n || m > INT32_MAX || lo < 0 || lo > hi || hi > m) return SUFFIX_BAD;
    if (depth < 0 || depth > n || k < 0 || k > out->capacity || scan < 1 || scan > INT32_MAX) return SUFFIX_BAD;
    if ((hi > lo && (!text || !sa)) || (k > 0 && (!out->tokens || !out->conf || !out->counts))) return SUFFIX_BAD;
    int32_t *tokens = out->tokens;
    float *conf = out->conf;
    int64_t *counts = out->counts;
    double reach = 1.0;
    int64_t drafted = 0;
    while (drafted < k && depth < max_depth && hi > lo) {
        uint32_t t;
        if (mode_at(text, n, sa, depth, lo, hi, scan, &t) < 0) return SUFFIX_BAD;
        if (t == SEP) break;
        int64_t a = lo, b = hi;
        if (narrow(text, n, sa, depth, t, &a, &b) < 0) return SUFFIX_BAD;
        double prior = (double)depth / ((double)depth + half);
        double q = ((double)(b - a) + smooth * prior) / ((double)(hi - lo) + smooth);
        if (reach * q < stop) break;
        reach *= q;
        tokens[drafted] = (int32_t)t;
        conf[drafted] = (float)q;
        counts[2 * drafted] = b - a;
        counts[2 * drafted + 1] = hi - lo;
        drafted++;
        lo = a, hi = b, depth++;
    }
    return drafted;
}
