/* Edge-wise BAM on the CPU (common/attention/kernels/cpu_edge_bam.py): the two passes of the Triton kernels of
 * common/attention/kernels/edge_bam.py (Fan et al., 2020, Sec. 3.2-3.3) over edges sorted by target, one
 * target node's segment (all heads) per iteration of an OpenMP loop.
 *
 * edge_bam_forward: per head, the segment log-sum-exps of the scores s, of the noisy scores z = s + scale n and
 * of the contextual prior's logits r (online over blocks of edges); then the weights W = exp(z - lse(z)) and the
 * KL of every entry (Eq. 4, the closed forms of common/attention/bam.py), written as the segment's share of the
 * mean over all entries: (sum of the entries' KL + const * entries) * inv_count.
 *
 * edge_bam_backward: the softmax backward of W and the log-softmax backwards of the KL through
 * log p = s - lse(s) and log pi = r - lse(r) (r is log pi already with prior_normalized).
 *
 * Scores, prior logits, given noise, weights and gradients are [edges, heads] float32 and contiguous; lse is
 * [nodes, 3, heads] (s, z, r). The noise n of entry i = edge * heads + head (Weibull: log(-log u); Lognormal:
 * N(0, 1), Box-Muller on the word pairs (2p, 2p + 1)) comes from word i % 4 of Philox4x32-10 with counter
 * (i / 4, i >> 34, 0, 0) and the 64-bit seed as key, and is drawn again in the backward pass. A segment that
 * fits in one block keeps its entries between a pass's two sweeps.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "philox.h"

#if defined(ATTN_LIBMVEC) && defined(__GNUC__) && !defined(__clang__)
/* glibc's vector math library (libmvec, linked with -lmvec): 8-wide logf/expf/sinf/cosf in the loops below */
float logf(float) __attribute__((__simd__("notinbranch")));
float expf(float) __attribute__((__simd__("notinbranch")));
float sinf(float) __attribute__((__simd__("notinbranch")));
float cosf(float) __attribute__((__simd__("notinbranch")));
#endif

#define NOISE_NONE 0
#define NOISE_WEIBULL 1
#define NOISE_NORMAL 2
#define NOISE_GIVEN 3
#define KL_NONE 0
#define KL_WEIBULL 1
#define KL_LOGNORMAL 2
#define MAX_HEADS 64                           /* cpu_edge_bam.MAX_HEADS */
#define WORDS (4 * PHILOX_COUNTERS)            /* the words of one philox_lanes call */
#define ENTRIES (WORDS - 4)                    /* entries of a block at most: their words from an aligned start */
#define LOG_TINY (-87.33654475f)               /* log of the smallest normal float: alpha's floor */

typedef struct {
    int heads, noise, prior, prior_normalized, kl, centred;
    float scale, c0, c1, c2, konst, inv_count;
    uint64_t seed;
} spec_t;

/* the standard log-noise of entries [i0, i0 + n), n <= ENTRIES, into `noise` */
static void draw_noise(float *noise, int64_t i0, int64_t n, const spec_t *sp, const float *given) {
    if (sp->noise == NOISE_GIVEN) {
        memcpy(noise, given + i0, sizeof(float) * n);
        return;
    }
    const int64_t start = i0 & ~(int64_t)3, skip = i0 - start, counters = (skip + n + 3) / 4;
    uint32_t lane[4][PHILOX_COUNTERS];
    float all[WORDS];
    philox_lanes(lane, (counters + 15) & ~(int64_t)15, (uint32_t)(start >> 2), (uint32_t)(start >> 34), 0, 0,
                 (uint32_t)sp->seed, (uint32_t)(sp->seed >> 32));
    if (sp->noise == NOISE_WEIBULL) {
        for (int l = 0; l < 4; ++l) {
#pragma omp simd
            for (int64_t b = 0; b < counters; ++b) all[4 * b + l] = logf(-logf(open_uniform(lane[l][b])));
        }
    } else { /* Box-Muller: words 4b, 4b + 1 and 4b + 2, 4b + 3 */
        float radius[2][PHILOX_COUNTERS], angle[2][PHILOX_COUNTERS];
        for (int p = 0; p < 2; ++p) {
#pragma omp simd
            for (int64_t b = 0; b < counters; ++b) {
                radius[p][b] = sqrtf(-2.0f * logf(open_uniform(lane[2 * p][b])));
                angle[p][b] = 6.2831853071795864f * open_uniform(lane[2 * p + 1][b]);
            }
#pragma omp simd
            for (int64_t b = 0; b < counters; ++b) all[4 * b + 2 * p] = radius[p][b] * cosf(angle[p][b]);
#pragma omp simd
            for (int64_t b = 0; b < counters; ++b) all[4 * b + 2 * p + 1] = radius[p][b] * sinf(angle[p][b]);
        }
    }
    memcpy(noise, all + skip, sizeof(float) * n);
}

/* log Gamma(x) for x > 0: six recurrence steps up (one log of their product), then Stirling's series */
static inline float lgamma_positive(float x) {
    float product = 1.0f;
    for (int i = 0; i < 6; ++i) {
        const int small = x < 6.0f;
        product = small ? product * x : product;
        x = small ? x + 1.0f : x;
    }
    const float inv = 1.0f / x, inv2 = inv * inv;
    const float series = inv * (1.0f / 12 - inv2 * (1.0f / 360 - inv2 * (1.0f / 1260 - inv2 / 1680)));
    return (x - 0.5f) * logf(x) - x + 0.9189385332046727f + series - logf(product);
}

/* psi(x) for x > 0: six recurrence steps up, then the asymptotic series */
static inline float digamma_positive(float x) {
    float shift = 0.0f;
    for (int i = 0; i < 6; ++i) {
        const int small = x < 6.0f;
        shift = small ? shift - 1.0f / x : shift;
        x = small ? x + 1.0f : x;
    }
    const float inv = 1.0f / x, inv2 = inv * inv;
    const float series =
        inv2 * (1.0f / 12 - inv2 * (1.0f / 120 - inv2 * (1.0f / 252 - inv2 * (1.0f / 240 - inv2 / 132))));
    return shift + logf(x) - 0.5f * inv - series;
}

/* a block of a segment: edges [e0, e0 + edges), its entries [e0 heads, +n) as scores, noisy scores and prior
 * logits (the prior's only when given) */
typedef struct {
    int64_t i0, n;
    float s[ENTRIES], z[ENTRIES], r[ENTRIES];
} block_t;

static void load(block_t *blk, int64_t e0, int64_t edges, const spec_t *sp, const float *s, const float *r,
                 const float *given) {
    blk->i0 = e0 * sp->heads;
    blk->n = edges * sp->heads;
    memcpy(blk->s, s + blk->i0, sizeof(float) * blk->n);
    if (sp->prior) memcpy(blk->r, r + blk->i0, sizeof(float) * blk->n);
    if (sp->noise == NOISE_NONE) {
        memcpy(blk->z, blk->s, sizeof(float) * blk->n);
        return;
    }
    draw_noise(blk->z, blk->i0, blk->n, sp, given);
    const float scale = sp->scale;
#pragma omp simd
    for (int64_t k = 0; k < blk->n; ++k) blk->z[k] = blk->s[k] + scale * blk->z[k];
}

/* per-head values repeated along a block's entries: out[k] = v[k % heads] */
static void tile(float *out, const float *v, int64_t n, int heads) {
    for (int64_t k = 0; k < n; k += heads) memcpy(out + k, v, sizeof(float) * heads);
}

/* per-head sums of a block's entries: sums[h] += x[e heads + h] */
static void add_heads(float *sums, const float *x, int64_t n, int heads) {
    for (int64_t k = 0; k < n; k += heads)
        for (int h = 0; h < heads; ++h) sums[h] += x[k + h];
}

/* one step of the per-head streaming log-sum-exp (max m, sum l) over a block's entries x */
static void online_lse(float *m, float *l, const float *x, int64_t n, int heads) {
    float top[MAX_HEADS], shift[ENTRIES], e[ENTRIES], part[MAX_HEADS];
    for (int h = 0; h < heads; ++h) top[h] = m[h];
    for (int64_t k = 0; k < n; k += heads)
        for (int h = 0; h < heads; ++h) top[h] = x[k + h] > top[h] ? x[k + h] : top[h];
    for (int h = 0; h < heads; ++h) top[h] = top[h] == -INFINITY ? 0.0f : top[h]; /* (no term yet: l stays 0) */
    tile(shift, top, n, heads);
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) e[k] = expf(x[k] - shift[k]);
    memset(part, 0, sizeof(float) * heads);
    add_heads(part, e, n, heads);
    for (int h = 0; h < heads; ++h) {
        l[h] = (m[h] == -INFINITY ? 0.0f : l[h] * expf(m[h] - top[h])) + part[h];
        m[h] = l[h] > 0.0f ? top[h] : -INFINITY;
    }
}

/* the log-sum-exps from their running maxima and sums: 0 for a head without a term */
static void finish_lse(float *out, const float *m, const float *l, int heads) {
    for (int h = 0; h < heads; ++h) out[h] = l[h] > 0.0f ? m[h] + logf(l[h]) : 0.0f;
}

/* per entry of a block: log p, log pi, the KL value and its derivatives in log p and log pi (any may be NULL) */
static void kl_terms(const block_t *blk, const spec_t *sp, const float *lse, float *logp, float *log_pi,
                     float *value, float *d_logp, float *d_log_pi) {
    const int64_t n = blk->n;
    float ls[ENTRIES], lr[ENTRIES];
    tile(ls, lse, n, sp->heads);
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) logp[k] = blk->s[k] - ls[k];
    if (sp->prior) {
        tile(lr, lse + 2 * sp->heads, n, sp->heads);
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) log_pi[k] = blk->r[k] - (sp->prior_normalized ? 0.0f : lr[k]);
    }
    const float c0 = sp->c0, c1 = sp->c1, c2 = sp->c2;
    if (sp->kl == KL_WEIBULL && sp->prior) {
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) {
            const float beta_p = expf(logp[k] + c0), log_alpha = log_pi[k] + c0;
            const float alpha = expf(log_alpha > LOG_TINY ? log_alpha : LOG_TINY);
            if (value) value[k] = beta_p + lgamma_positive(alpha) + alpha * (c1 - logp[k]);
            if (d_logp) d_logp[k] = beta_p - alpha;
            if (d_log_pi) d_log_pi[k] = log_alpha < LOG_TINY ? 0.0f : (digamma_positive(alpha) + c1 - logp[k]) * alpha;
        }
    } else if (sp->kl == KL_WEIBULL) {
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) {
            const float beta_p = expf(logp[k] + c0);
            if (value) value[k] = beta_p - c2 * logp[k];
            if (d_logp) d_logp[k] = beta_p - c2;
        }
    } else {
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) {
            const float diff = logp[k] + c1 - (sp->prior ? log_pi[k] : 0.0f);
            if (value) value[k] = c0 * diff * diff;
            if (d_logp) d_logp[k] = 2.0f * c0 * diff;
            if (d_log_pi) d_log_pi[k] = -2.0f * c0 * diff;
        }
    }
}

static void forward_node(int64_t node, const int64_t *ptr, const spec_t *sp, const float *s, const float *r,
                         const float *given, float *w, float *lse, float *kl) {
    const int heads = sp->heads;
    const int64_t first = ptr[node], last = ptr[node + 1], step = ENTRIES / heads;
    float m[3][MAX_HEADS], l[3][MAX_HEADS], *out = lse + node * 3 * heads;
    for (int q = 0; q < 3; ++q)
        for (int h = 0; h < heads; ++h) m[q][h] = -INFINITY, l[q][h] = 0.0f;
    block_t blk;
    for (int64_t e0 = first; e0 < last; e0 += step) {
        load(&blk, e0, last - e0 < step ? last - e0 : step, sp, s, r, given);
        online_lse(m[1], l[1], blk.z, blk.n, heads);
        if (sp->kl != KL_NONE) online_lse(m[0], l[0], blk.s, blk.n, heads);
        if (sp->kl != KL_NONE && sp->prior && !sp->prior_normalized) online_lse(m[2], l[2], blk.r, blk.n, heads);
    }
    for (int q = 0; q < 3; ++q) finish_lse(out + q * heads, m[q], l[q], heads);
    float total = 0.0f;
    for (int64_t e0 = first; e0 < last; e0 += step) {
        if (last - first > step) load(&blk, e0, last - e0 < step ? last - e0 : step, sp, s, r, given);
        float lz[ENTRIES], logp[ENTRIES], log_pi[ENTRIES], value[ENTRIES];
        tile(lz, out + heads, blk.n, heads);
        float *wi = w + blk.i0;
#pragma omp simd
        for (int64_t k = 0; k < blk.n; ++k) wi[k] = expf(blk.z[k] - lz[k]);
        if (sp->kl == KL_NONE) continue;
        kl_terms(&blk, sp, out, logp, log_pi, value, 0, 0);
#pragma omp simd reduction(+ : total)
        for (int64_t k = 0; k < blk.n; ++k) total += value[k];
    }
    kl[node] = (total + sp->konst * (float)((last - first) * heads)) * sp->inv_count;
}

static void backward_node(int64_t node, const int64_t *ptr, const spec_t *sp, const float *s, const float *r,
                          const float *given, const float *lse, const float *g_w, float g_kl, float *d_s,
                          float *d_r) {
    const int heads = sp->heads;
    const int64_t first = ptr[node], last = ptr[node + 1], step = ENTRIES / heads;
    const float *in = lse + node * 3 * heads;
    const int kl = sp->kl != KL_NONE, prior_sums = kl && sp->prior && !sp->prior_normalized;
    float sum_gw[MAX_HEADS] = {0}, sum_d[MAX_HEADS] = {0}, sum_dpi[MAX_HEADS] = {0};
    float lz[ENTRIES], wt[ENTRIES], logp[ENTRIES], log_pi[ENTRIES], d_logp[ENTRIES], d_log_pi[ENTRIES];
    block_t blk;
    for (int64_t e0 = first; e0 < last; e0 += step) { /* the segment sums of the three chain rules */
        load(&blk, e0, last - e0 < step ? last - e0 : step, sp, s, r, given);
        tile(lz, in + heads, blk.n, heads);
        if (g_w) {
            const float *g = g_w + blk.i0;
#pragma omp simd
            for (int64_t k = 0; k < blk.n; ++k) wt[k] = g[k] * expf(blk.z[k] - lz[k]);
            add_heads(sum_gw, wt, blk.n, heads);
        }
        if (kl && (!sp->centred || prior_sums)) {
            kl_terms(&blk, sp, in, logp, log_pi, 0, d_logp, sp->prior ? d_log_pi : 0);
            add_heads(sum_d, d_logp, blk.n, heads);
            if (prior_sums) add_heads(sum_dpi, d_log_pi, blk.n, heads);
        }
    }
    for (int64_t e0 = first; e0 < last; e0 += step) {
        if (last - first > step) load(&blk, e0, last - e0 < step ? last - e0 : step, sp, s, r, given);
        float *ds = d_s + blk.i0, t_gw[ENTRIES], t_d[ENTRIES];
        tile(lz, in + heads, blk.n, heads);
        if (g_w) {
            const float *g = g_w + blk.i0;
            tile(t_gw, sum_gw, blk.n, heads);
#pragma omp simd
            for (int64_t k = 0; k < blk.n; ++k) ds[k] = expf(blk.z[k] - lz[k]) * (g[k] - t_gw[k]);
        } else {
            memset(ds, 0, sizeof(float) * blk.n);
        }
        if (!kl) { /* no gradient of the KL: none for the prior either */
            if (sp->prior) memset(d_r + blk.i0, 0, sizeof(float) * blk.n);
            continue;
        }
        kl_terms(&blk, sp, in, logp, log_pi, 0, d_logp, sp->prior ? d_log_pi : 0);
        if (sp->centred) { /* sum_j d_logp = 0 (alpha = beta pi): the log-softmax backward is the identity */
#pragma omp simd
            for (int64_t k = 0; k < blk.n; ++k) ds[k] += g_kl * d_logp[k];
        } else {
            tile(t_d, sum_d, blk.n, heads);
#pragma omp simd
            for (int64_t k = 0; k < blk.n; ++k) ds[k] += g_kl * (d_logp[k] - expf(logp[k]) * t_d[k]);
        }
        if (!sp->prior) continue;
        float *dr = d_r + blk.i0;
        if (sp->prior_normalized) {
#pragma omp simd
            for (int64_t k = 0; k < blk.n; ++k) dr[k] = g_kl * d_log_pi[k];
        } else {
            tile(t_d, sum_dpi, blk.n, heads);
#pragma omp simd
            for (int64_t k = 0; k < blk.n; ++k) dr[k] = g_kl * (d_log_pi[k] - expf(log_pi[k]) * t_d[k]);
        }
    }
}

static spec_t make_spec(int heads, uint64_t seed, int noise, int prior, int prior_normalized, int kl, int centred,
                        float scale, float c0, float c1, float c2, float konst, float inv_count) {
    spec_t sp = {heads, noise, prior, prior_normalized, kl, centred, scale, c0, c1, c2, konst, inv_count, seed};
    return sp;
}

void edge_bam_forward(const float *s, const float *r, const float *given, const int64_t *ptr, int64_t nodes,
                      int heads, float *w, float *lse, float *kl, int threads, uint64_t seed, int noise, int prior,
                      int prior_normalized, int kl_kind, float scale, float c0, float c1, float c2, float konst,
                      float inv_count) {
    const spec_t sp = make_spec(heads, seed, noise, prior, prior_normalized, kl_kind, 0, scale, c0, c1, c2, konst,
                                inv_count);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 64)
    for (int64_t node = 0; node < nodes; ++node) forward_node(node, ptr, &sp, s, r, given, w, lse, kl);
}

void edge_bam_backward(const float *s, const float *r, const float *given, const int64_t *ptr, int64_t nodes,
                       int heads, const float *lse, const float *g_w, const float *g_kl, float *d_s, float *d_r,
                       int threads, uint64_t seed, int noise, int prior, int prior_normalized, int kl_kind,
                       int centred, float scale, float c0, float c1, float c2, float inv_count) {
    const spec_t sp = make_spec(heads, seed, noise, prior, prior_normalized, g_kl ? kl_kind : KL_NONE, centred,
                                scale, c0, c1, c2, 0.0f, inv_count);
    const float g = g_kl ? *g_kl * inv_count : 0.0f; /* the mean's gradient, per entry */
#pragma omp parallel for num_threads(threads) schedule(dynamic, 64)
    for (int64_t node = 0; node < nodes; ++node) backward_node(node, ptr, &sp, s, r, given, lse, g_w, g, d_s, d_r);
}
