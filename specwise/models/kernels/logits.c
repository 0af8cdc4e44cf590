/*
 * One read of a pass's logits: per row, the first largest value's index (torch.argmax's choice) and flags for NaN,
 * +inf and rows of -inf, with the kernels of the instruction path in use (q_kernels; the same results on all).
 */
#include "specwise.h"

#include "quant_internal.h"

/* The largest value of x[0 .. n - 1] ignoring NaN (-inf when all are -inf or NaN), and whether a NaN was seen. */
float logits_max_portable(const float *x, int n, int *nan) {
    float best = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] != x[i]) *nan = 1;
        else if (x[i] > best) best = x[i];
    }
    return best;
}

/* The first index i with x[i] == v (n when none). */
int logits_find_portable(const float *x, int n, float v) {
    int i = 0;
    while (i < n && x[i] != v) i++;
    return i;
}

#ifdef SPECWISE_X86
TARGET_AVX2 float logits_max_avx2(const float *x, int n, int *nan) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, bad = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
        m0 = _mm256_max_ps(m0, a);
        m1 = _mm256_max_ps(m1, b);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_max_ps(m0, m1));
    if (_mm256_movemask_ps(bad)) *nan = 1;
    float best = logits_max_portable(x + i, n - i, nan);
    for (int l = 0; l < 8; l++) best = lanes[l] > best ? lanes[l] : best;
    return best;
}

/* The first index i with x[i] == v (n when none). */
TARGET_AVX2 int logits_find_avx2(const float *x, int n, float v) {
    const __m256 t = _mm256_set1_ps(v);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_EQ_OQ));
        if (mask) return i + __builtin_ctz((unsigned)mask);
    }
    while (i < n && x[i] != v) i++;
    return i;
}
#endif

/* For each of `rows` rows of n logits: the index of the first largest value (torch.argmax's choice) in argmax.
 * Returns flags: 1 when a NaN was seen (argmax is then not set for that row: NaN has no order), 2 when +inf was
 * seen, 4 when some row is entirely -inf. One read of the logits replaces the several passes of a check for
 * invalid values followed by an argmax. */
int specwise_logits_scan(const float *x, int rows, int n, int64_t *argmax) {
    const qkernels *K = q_kernels(); /* AVX2's scan on the AVX2 and AVX-512 paths */
    int flags = 0;
    for (int r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * n;
        int nan = 0;
        const float best = K->row_max(row, n, &nan);
        if (nan) {
            flags |= 1;
            continue;
        }
        if (best == INFINITY) flags |= 2;
        if (best == -INFINITY) flags |= 4;
        argmax[r] = K->find(row, n, best);
    }
    return flags;
}
