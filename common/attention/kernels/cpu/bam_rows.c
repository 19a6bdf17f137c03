/* Fused row kernels of dense BAM attention on the CPU (common/attention/kernels/cpu_bam.py).
 *
 * bam_sample: for each score row s_i of a chunk, in one visit of the row,
 *     z_ij = s_ij + noise_scale * n_ij,   w_i = softmax(z_i),   LSEz_i = log sum_j exp(z_ij),
 *     LSE_i = log sum_j exp(s_ij),   S2_i = sum_j s_ij^2 (over the finite s_ij),
 * with the standard log-noise n_ij (log(-log u), Weibull; or N(0, 1), Lognormal) and the
 * dropout scale drawn from Philox4x32-10 (Salmon et al., 2011; the generator of Triton's
 * tl.randint4x) keyed by the 64-bit seed, counter (j / 4, query, group, stream): one call gives the
 * words of four adjacent keys, so a sample depends on (seed, group, query, key) only.
 *
 * bam_grad: d_s_ij = (d_w_ij keep_ij - d_norm_i) w_ij + d_lse_i exp(s_ij - LSE_i) + 2 d_sq_i s_ij
 * (the last term only where s_ij is finite), in place of d_w.
 *
 * bam_regrad: the backward pass of a tile whose weights were not kept, in one visit of each row:
 * the forward's weights again from its noise and LSEz_i, w_ij = exp(z_ij - LSEz_i), their dropped
 * form w_ij keep_ij into w (for dV), and bam_grad's d_s in place of d_w. Its keys start at k0 (a
 * multiple of 4): the noise of key k0 + j; so the tile may be a block of the row's keys.
 *
 * Rows are [n_groups x n_rows] of `cols` floats, contiguous, split over `threads` OpenMP threads
 * (the runtime PyTorch's own operators use, where the compiler links the same libgomp). Masked
 * keys are -inf in s: they get exactly zero weight; a row without a finite score gets zero
 * weights and LSE = LSEz = -inf.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "philox.h"

#include "libmvec.h"

#define NOISE_NONE 0
#define NOISE_WEIBULL 1
#define NOISE_NORMAL 2
#define STREAM_NOISE 0u
#define STREAM_DROPOUT 1u
#define BLOCK (4 * PHILOX_COUNTERS) /* keys per inner block: its words stay in the L1 cache */

/* the words of keys [j0, j0 + 4 nq) of row (group, query) in `stream`: word j % 4 of counter
 * (j / 4, query, group, stream) for key j, at words[j - j0] (j0 a multiple of 4) */
static void row_words(uint32_t *words, int64_t j0, int64_t nq, uint64_t seed, uint32_t query, uint32_t group,
                      uint32_t stream) {
    uint32_t lane[4][PHILOX_COUNTERS];
    philox_lanes(lane, (nq + 15) & ~(int64_t)15, (uint32_t)(j0 >> 2), query, group, stream, (uint32_t)seed,
                 (uint32_t)(seed >> 32));
    for (int64_t b = 0; b < nq; ++b)
        for (int l = 0; l < 4; ++l) words[4 * b + l] = lane[l][b];
}

/* the standard log-noise of `n` keys (n a multiple of 4) from their words, into `out` */
static void log_noise(float *out, const uint32_t *words, int64_t n, int kind) {
    if (kind == NOISE_WEIBULL) {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) out[j] = logf(-logf(open_uniform(words[j])));
        return;
    }
    /* Box-Muller on the word pairs (2p, 2p + 1): radius sqrt(-2 log u1), angle 2 pi u2; cos and
     * sin in separate loops (in one, the compiler merges them into a sincosf it cannot vectorize) */
    float radius[BLOCK / 2], angle[BLOCK / 2];
#pragma omp simd
    for (int64_t p = 0; p < n / 2; ++p) {
        radius[p] = sqrtf(-2.0f * logf(open_uniform(words[2 * p])));
        angle[p] = 6.2831853071795864f * open_uniform(words[2 * p + 1]);
    }
#pragma omp simd
    for (int64_t p = 0; p < n / 2; ++p) out[2 * p] = radius[p] * cosf(angle[p]);
#pragma omp simd
    for (int64_t p = 0; p < n / 2; ++p) out[2 * p + 1] = radius[p] * sinf(angle[p]);
}

/* the standard log-noise of keys [j0, j0 + n) of row (group, query), n <= BLOCK, into `noise`
 * (zeros for NOISE_NONE); `words` is scratch */
static void noise_block(float *noise, uint32_t *words, int64_t j0, int64_t n, uint64_t seed, uint32_t query,
                        uint32_t group, int kind) {
    const int64_t n4 = (n + 3) & ~(int64_t)3;
    if (kind == NOISE_NONE) {
        memset(noise, 0, sizeof(float) * n4);
        return;
    }
    row_words(words, j0, n4 / 4, seed, query, group, STREAM_NOISE);
    log_noise(noise, words, n4, kind);
}

/* the dropout scales of keys [j0, j0 + n) of row (group, query), n <= BLOCK: [u >= p] / (1 - p) */
static void keep_block(float *keep, uint32_t *words, int64_t j0, int64_t n, uint64_t seed, uint32_t query,
                       uint32_t group, uint32_t drop_threshold, float drop_scale) {
    row_words(words, j0, ((n + 3) & ~(int64_t)3) / 4, seed, query, group, STREAM_DROPOUT);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) keep[j] = (words[j] & 0xFFFFFFu) >= drop_threshold ? drop_scale : 0.0f;
}

/* d_s of n entries of row `row` in place of d (see bam_grad); keep and the per-row lse/d_lse and
 * d_sq (the LSE and square-sum terms) are optional */
static void grad_row(float *d, const float *w, const float *keep, const float *s, float d_norm,
                     const float *lse_rows, const float *d_lse_rows, const float *d_sq_rows, int64_t row, int64_t n) {
    const float lse = lse_rows ? lse_rows[row] : -INFINITY, d_lse = lse_rows ? d_lse_rows[row] : 0.0f;
    const float d_sq = d_sq_rows ? d_sq_rows[row] : 0.0f;
    if (keep) {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) d[j] = (d[j] * keep[j] - d_norm) * w[j];
    } else {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) d[j] = (d[j] - d_norm) * w[j];
    }
    if (lse > -INFINITY && d_lse != 0.0f) {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) d[j] += d_lse * expf(s[j] - lse);
    }
    if (d_sq != 0.0f) {
        const float g = 2.0f * d_sq;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) d[j] += s[j] > -INFINITY ? g * s[j] : 0.0f;
    }
}

void bam_sample(const float *s, float *w, float *keep, float *lse, float *sq, float *lse_z, int64_t n_rows,
                int64_t cols, int64_t g0, int64_t r0, int64_t rows, int threads, uint64_t seed, int kind,
                float noise_scale, uint32_t drop_threshold, float drop_scale, int want_softmax) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
        uint32_t words[BLOCK];
        float noise[BLOCK];
        const float *si = s + row * cols;
        float *wi = w + row * cols, *ki = keep ? keep + row * cols : 0;
        const uint32_t group = (uint32_t)(g0 + row / n_rows), query = (uint32_t)(r0 + row % n_rows);
        float z_max = -INFINITY, s_max = -INFINITY;
        for (int64_t j0 = 0; j0 < cols; j0 += BLOCK) {
            const int64_t n = cols - j0 < BLOCK ? cols - j0 : BLOCK;
            noise_block(noise, words, j0, n, seed, query, group, kind);
#pragma omp simd reduction(max : z_max, s_max)
            for (int64_t j = 0; j < n; ++j) {
                float z = si[j0 + j] + noise_scale * noise[j];
                wi[j0 + j] = z;
                z_max = z > z_max ? z : z_max;
                s_max = si[j0 + j] > s_max ? si[j0 + j] : s_max;
            }
            if (ki) keep_block(ki + j0, words, j0, n, seed, query, group, drop_threshold, drop_scale);
        }
        if (lse) {
            float total = 0.0f;
            if (s_max > -INFINITY) {
#pragma omp simd reduction(+ : total)
                for (int64_t j = 0; j < cols; ++j) total += expf(si[j] - s_max);
            }
            lse[row] = s_max > -INFINITY ? s_max + logf(total) : -INFINITY;
        }
        if (sq) {
            float total = 0.0f;
#pragma omp simd reduction(+ : total)
            for (int64_t j = 0; j < cols; ++j) total += si[j] > -INFINITY ? si[j] * si[j] : 0.0f;
            sq[row] = total;
        }
        if (!want_softmax) continue;
        if (!(z_max > -INFINITY)) { /* no visible key: zero weights */
            memset(wi, 0, sizeof(float) * cols);
            if (lse_z) lse_z[row] = -INFINITY;
            continue;
        }
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t j = 0; j < cols; ++j) {
            float e = expf(wi[j] - z_max);
            wi[j] = e;
            total += e;
        }
        const float inv = 1.0f / total;
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) wi[j] *= inv;
        if (lse_z) lse_z[row] = z_max + logf(total);
    }
}

void bam_grad(float *d_w, const float *w, const float *keep, const float *s, const float *d_norm,
              const float *lse, const float *d_lse, const float *d_sq, int64_t cols, int64_t rows, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t at = row * cols;
        grad_row(d_w + at, w + at, keep ? keep + at : 0, s ? s + at : 0, d_norm[row], lse, d_lse, d_sq, row, cols);
    }
}

void bam_regrad(float *d_w, float *w, const float *s, const float *lse_z, const float *d_norm, const float *lse,
                const float *d_lse, const float *d_sq, int64_t n_rows, int64_t cols, int64_t g0, int64_t r0,
                int64_t k0, int64_t rows, int threads, uint64_t seed, int kind, float noise_scale,
                uint32_t drop_threshold, float drop_scale, int dropout) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
        uint32_t words[BLOCK];
        float noise[BLOCK], weight[BLOCK], keep[BLOCK];
        const uint32_t group = (uint32_t)(g0 + row / n_rows), query = (uint32_t)(r0 + row % n_rows);
        const float l = lse_z[row];
        for (int64_t j0 = 0; j0 < cols; j0 += BLOCK) {
            const int64_t n = cols - j0 < BLOCK ? cols - j0 : BLOCK, at = row * cols + j0;
            const float *si = s + at;
            float *wi = w + at, *wt = dropout ? weight : wi; /* the undropped weights: w itself without dropout */
            noise_block(noise, words, k0 + j0, n, seed, query, group, kind);
            if (l > -INFINITY) {
#pragma omp simd
                for (int64_t j = 0; j < n; ++j) wt[j] = expf(si[j] + noise_scale * noise[j] - l);
            } else {
                memset(wt, 0, sizeof(float) * n);
            }
            if (dropout) {
                keep_block(keep, words, k0 + j0, n, seed, query, group, drop_threshold, drop_scale);
#pragma omp simd
                for (int64_t j = 0; j < n; ++j) wi[j] = weight[j] * keep[j];
            }
            grad_row(d_w + at, wt, dropout ? keep : 0, si, d_norm[row], lse, d_lse, d_sq, row, n);
        }
    }
}
