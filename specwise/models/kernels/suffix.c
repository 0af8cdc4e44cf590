/* Search of a suffix array over token ids, for the `suffix` drafter (specwise/drafters/suffix.py).
 *
 * text: n token ids (uint32); sequences are separated by SEP (0xFFFFFFFF) and the text ends with one.
 * sa: the m start positions of the suffixes that begin with a token (not a separator), sorted by their first
 * `depth` tokens at least (the drafter never compares further). A pattern never holds SEP, so a comparison stops
 * at the separator that ends a sequence at the latest: no read past the text.
 */
#include <stdint.h>

#define SEP 0xFFFFFFFFu

/* -1, 0, 1: the first `len` tokens of the suffix at `pos` against pattern p[0..len) */
static int cmp_suffix(const uint32_t *text, int64_t pos, const uint32_t *p, int len) {
    for (int j = 0; j < len; j++) {
        uint32_t a = text[pos + j], b = p[j];
        if (a != b) return a < b ? -1 : 1;
    }
    return 0;
}

/* [lo, hi) of the suffixes whose first `len` tokens are p, within [lo, hi) given */
static void range_of(const uint32_t *text, const int32_t *sa, const uint32_t *p, int len, int64_t *lo,
                     int64_t *hi) {
    int64_t a = *lo, b = *hi;
    while (a < b) { /* first suffix >= p */
        int64_t mid = a + (b - a) / 2;
        if (cmp_suffix(text, sa[mid], p, len) < 0) a = mid + 1;
        else b = mid;
    }
    int64_t first = a;
    b = *hi;
    while (a < b) { /* first suffix > p */
        int64_t mid = a + (b - a) / 2;
        if (cmp_suffix(text, sa[mid], p, len) <= 0) a = mid + 1;
        else b = mid;
    }
    *lo = first;
    *hi = a;
}

/* The longest L in [min_len, plen] such that the last L tokens of ctx[0..plen) occur in the text (0 if none), and
 * the range [*lo, *hi) of their occurrences in sa. Occurrence is monotone in L (a suffix of an occurring pattern
 * occurs), so L is found by bisection. */
int specwise_suffix_match(const uint32_t *text, const int32_t *sa, int64_t m, const uint32_t *ctx, int plen,
                          int min_len, int64_t *lo, int64_t *hi) {
    int good = 0, bad = plen + 1; /* good: a length known to occur (0: the empty pattern), bad: one that does not */
    int64_t good_lo = 0, good_hi = m;
    if (min_len < 1) min_len = 1;
    if (plen < min_len) return 0;
    int probe = min_len; /* the shortest length first: most contexts have no match at all */
    while (bad - good > 1) {
        int64_t a = 0, b = m;
        range_of(text, sa, ctx + plen - probe, probe, &a, &b);
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

/* [lo, hi) narrowed to the suffixes whose token at offset `depth` is t (the range is sorted at that offset) */
static void narrow(const uint32_t *text, const int32_t *sa, int depth, uint32_t t, int64_t *lo, int64_t *hi) {
    int64_t a = *lo, b = *hi;
    while (a < b) {
        int64_t mid = a + (b - a) / 2;
        if (text[sa[mid] + depth] < t) a = mid + 1;
        else b = mid;
    }
    int64_t first = a;
    b = *hi;
    while (a < b) {
        int64_t mid = a + (b - a) / 2;
        if (text[sa[mid] + depth] <= t) a = mid + 1;
        else b = mid;
    }
    *lo = first;
    *hi = a;
}

/* The most frequent token at offset `depth` in [lo, hi): exact for ranges up to `scan` suffixes; for larger ones the
 * mode of `scan` evenly spaced samples (the range is sorted by that token, so the samples hit each token in
 * proportion to its count). SEP when the most frequent "token" is the end of a sequence. */
static uint32_t mode_at(const uint32_t *text, const int32_t *sa, int depth, int64_t lo, int64_t hi, int scan) {
    int64_t r = hi - lo;
    uint32_t best = SEP, run_tok = SEP;
    int64_t best_n = 0, run_n = 0;
    int64_t count = r <= scan ? r : scan;
    for (int64_t j = 0; j < count; j++) {
        int64_t i = r <= scan ? lo + j : lo + (r * j + r / 2) / scan;
        uint32_t t = text[sa[i] + depth];
        if (t == run_tok) {
            run_n++;
        } else {
            run_tok = t;
            run_n = 1;
        }
        if (run_n > best_n) { /* ties: the smaller token (it came first) */
            best_n = run_n;
            best = run_tok;
        }
    }
    return best;
}

/* Draft up to k tokens following a match of `depth` tokens whose occurrences are sa[lo..hi): each token is the
 * most frequent continuation of the pattern so far, which then grows by it (the range narrows to its occurrences).
 * conf[i] = (count(token | pattern) + smooth * prior) / (count(pattern) + smooth), with the prior
 * L / (L + half) of a pattern of L tokens (a longer match is more often followed the same way);
 * counts[2i], counts[2i + 1] = count(token | pattern), count(pattern). Stops at k tokens, at
 * `max_depth`, when the most frequent continuation is the end of a sequence, or before a token that would bring
 * the product of confidences below `stop`. Returns the number of tokens drafted. */
int specwise_suffix_draft(const uint32_t *text, const int32_t *sa, int64_t lo, int64_t hi, int depth, int max_depth,
                          int k, double stop, double smooth, double half, int scan, int32_t *tokens, float *conf,
                          int64_t *counts) {
    double reach = 1.0;
    int out = 0;
    while (out < k && depth < max_depth && hi > lo) {
        uint32_t t = mode_at(text, sa, depth, lo, hi, scan);
        if (t == SEP) break;
        int64_t a = lo, b = hi;
        narrow(text, sa, depth, t, &a, &b);
        double prior = (double)depth / ((double)depth + half);
        double q = ((double)(b - a) + smooth * prior) / ((double)(hi - lo) + smooth);
        if (reach * q < stop) break;
        reach *= q;
        tokens[out] = (int32_t)t;
        conf[out] = (float)q;
        counts[2 * out] = b - a;
        counts[2 * out + 1] = hi - lo;
        out++;
        lo = a, hi = b, depth++;
    }
    return out;
}
