/* Edge-wise BAM on the CPU (common/attention/kernels/cpu_edge_bam.py): the two passes of the Triton kernels of
 * common/attention/kernels/edge_bam.py (Fan et al., 2020, Sec. 3.2-3.3) over edges sorted by target.
 *
 * edge_bam_forward: per target node and head, the log-sum-exps of the scores s, of the noisy scores
 * z = s + scale n and of the contextual prior's logits r; the weights W = exp(z - lse(z)) and the KL of every
 * entry (Eq. 4, the closed forms of common/attention/bam.py), written as each node's share of the mean over
 * all entries: (sum of its entries' KL + const * entries) * inv_count.
 *
 * edge_bam_backward: the softmax backward of W and the log-softmax backwards of the KL through
 * log p = s - lse(s) and log pi = r - lse(r) (r is log pi already with prior_normalized).
 *
 * Scores, prior logits, given noise, weights and gradients are [edges, heads] float32 and contiguous; lse is
 * [nodes, 3, heads] (s, z, r). An OpenMP iteration takes RANGE nodes and visits them in spans of whole
 * segments of at most SPAN entries, so that the vector loops run over many short segments at once; a
 * longer segment is visited block by block, twice (its statistics first, online, then its entries). The
 * noise n of entry i = edge * heads + head (Weibull: log(-log u); Lognormal: N(0, 1) by Box-Muller on the
 * word pairs (2p, 2p + 1)) is word i % 4 of Philox4x32-10 with counter (i / 4, i >> 34, 0, 0) and the 64-bit
 * seed as key: it depends on the entry only, and the backward pass draws it again.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "philox.h"

#include "libmvec.h"

#define NOISE_NONE 0
#define NOISE_WEIBULL 1
#define NOISE_NORMAL 2
#define NOISE_GIVEN 3
#define KL_NONE 0
#define KL_WEIBULL 1
#define KL_LOGNORMAL 2
#define MAX_HEADS 64                 /* cpu_edge_bam.MAX_HEADS */
#define SPAN 1024                    /* entries of a span at most (a multiple of MAX_HEADS) */
#define RANGE 64                     /* nodes per OpenMP iteration, so per span at most */
#define WORDS (4 * PHILOX_COUNTERS)  /* the words of one philox_lanes call */
#define LOG_TINY (-87.33654475f)     /* log of the smallest normal float: alpha's floor */

typedef struct {
    int heads, noise, prior, prior_normalized, kl, centred;
    float scale, c0, c1, c2, konst, inv_count, g_kl; /* g_kl: the mean KL's gradient per entry (backward) */
    uint64_t seed;
    const int64_t *ptr;
    const float *s, *r, *given, *lse_in, *g_w; /* inputs: lse_in and g_w of the backward pass */
    float *w, *lse, *shares, *d_s, *d_r;       /* outputs: w, lse, the KL shares forward; d_s, d_r backward */
} spec_t;

/* entries [i0, i0 + n) of nodes [n0, n1): the nodes' whole segments, or a block of one long segment */
typedef struct {
    int64_t i0, n, n0, n1;
    float s[SPAN], z[SPAN], r[SPAN];
} span_t;

/* the standard log-noise of entries [i0, i0 + n), n <= WORDS - 4, into `noise` */
static void draw_words(float *noise, int64_t i0, int64_t n, const spec_t *sp) {
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

/* a span's scores, prior logits (when given) and noisy scores */
static void load(span_t *sn, const spec_t *sp) {
    memcpy(sn->s, sp->s + sn->i0, sizeof(float) * sn->n);
    if (sp->prior) memcpy(sn->r, sp->r + sn->i0, sizeof(float) * sn->n);
    if (sp->noise == NOISE_NONE) {
        memcpy(sn->z, sn->s, sizeof(float) * sn->n);
        return;
    }
    if (sp->noise == NOISE_GIVEN) {
        memcpy(sn->z, sp->given + sn->i0, sizeof(float) * sn->n);
    } else {
        for (int64_t k = 0; k < sn->n; k += WORDS - 4)
            draw_words(sn->z + k, sn->i0 + k, sn->n - k < WORDS - 4 ? sn->n - k : WORDS - 4, sp);
    }
    const float scale = sp->scale;
#pragma omp simd
    for (int64_t k = 0; k < sn->n; ++k) sn->z[k] = sn->s[k] + scale * sn->z[k];
}

/* node j's entries within the span: [*a, *b) */
static inline void node_entries(const span_t *sn, const spec_t *sp, int64_t j, int64_t *a, int64_t *b) {
    const int64_t lo = sp->ptr[j] * sp->heads, hi = sp->ptr[j + 1] * sp->heads;
    *a = (lo > sn->i0 ? lo : sn->i0) - sn->i0;
    *b = (hi < sn->i0 + sn->n ? hi : sn->i0 + sn->n) - sn->i0;
}

/* per node and head: m = max(m, x over the node's entries) */
static void heads_max(const span_t *sn, const spec_t *sp, const float *restrict x, float *restrict m) {
    const int heads = sp->heads;
    for (int64_t j = sn->n0; j < sn->n1; ++j) {
        int64_t a, b;
        node_entries(sn, sp, j, &a, &b);
        float *mj = m + (j - sn->n0) * heads;
        for (int64_t k = a; k < b; k += heads)
            for (int h = 0; h < heads; ++h) mj[h] = x[k + h] > mj[h] ? x[k + h] : mj[h];
    }
}

/* per node and head: total += x over the node's entries */
static void heads_sum(const span_t *sn, const spec_t *sp, const float *restrict x, float *restrict total) {
    const int heads = sp->heads;
    for (int64_t j = sn->n0; j < sn->n1; ++j) {
        int64_t a, b;
        node_entries(sn, sp, j, &a, &b);
        float *tj = total + (j - sn->n0) * heads;
        for (int64_t k = a; k < b; k += heads)
            for (int h = 0; h < heads; ++h) tj[h] += x[k + h];
    }
}

/* out[k] = v[node of k][head of k] over the span's entries; v's rows `stride` apart */
static void tile(const span_t *sn, const spec_t *sp, const float *restrict v, int64_t stride, float *restrict out) {
    const int heads = sp->heads;
    for (int64_t j = sn->n0; j < sn->n1; ++j) {
        int64_t a, b;
        node_entries(sn, sp, j, &a, &b);
        const float *vj = v + (j - sn->n0) * stride;
        for (int64_t k = a; k < b; k += heads)
            for (int h = 0; h < heads; ++h) out[k + h] = vj[h];
    }
}

/* one step of the per-node-and-head streaming log-sum-exp (maxima m, sums l) over the span's entries x; the
 * terms exp(x - the new maxima) into e */
static void online_lse(const span_t *sn, const spec_t *sp, const float *x, float *m, float *l, float *e) {
    const int64_t cells = (sn->n1 - sn->n0) * sp->heads;
    float top[RANGE * MAX_HEADS], part[RANGE * MAX_HEADS], shift[SPAN];
    memcpy(top, m, sizeof(float) * cells);
    heads_max(sn, sp, x, top);
    for (int64_t c = 0; c < cells; ++c) top[c] = top[c] == -INFINITY ? 0.0f : top[c]; /* no term yet */
    tile(sn, sp, top, sp->heads, shift);
#pragma omp simd
    for (int64_t k = 0; k < sn->n; ++k) e[k] = expf(x[k] - shift[k]);
    memset(part, 0, sizeof(float) * cells);
    heads_sum(sn, sp, e, part);
#pragma omp simd
    for (int64_t c = 0; c < cells; ++c) {
        l[c] = (m[c] == -INFINITY ? 0.0f : l[c] * expf(m[c] - top[c])) + part[c];
        m[c] = l[c] > 0.0f ? top[c] : -INFINITY;
    }
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

/* what a pass needs of a span's entries besides s, z, r */
typedef struct {
    float w[SPAN], logp[SPAN], log_pi[SPAN], p[SPAN], pi[SPAN];
} probs_t;

/* the entries' KL value and its derivatives in log p and log pi (each output may be NULL) */
static void kl_terms(int64_t n, const spec_t *sp, const probs_t *q, float *value, float *d_logp, float *d_log_pi) {
    const float c0 = sp->c0, c1 = sp->c1, c2 = sp->c2, beta = expf(c0);
    if (sp->kl == KL_WEIBULL && sp->prior) { /* alpha = beta pi, kept above the smallest normal float */
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) {
            const float beta_p = beta * q->p[k], floor = q->log_pi[k] + c0 < LOG_TINY;
            const float alpha = floor ? FLT_MIN : beta * q->pi[k];
            if (value) value[k] = beta_p + lgamma_positive(alpha) + alpha * (c1 - q->logp[k]);
            if (d_logp) d_logp[k] = beta_p - alpha;
            if (d_log_pi) d_log_pi[k] = floor ? 0.0f : (digamma_positive(alpha) + c1 - q->logp[k]) * alpha;
        }
    } else if (sp->kl == KL_WEIBULL) {
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) {
            const float beta_p = beta * q->p[k];
            if (value) value[k] = beta_p - c2 * q->logp[k];
            if (d_logp) d_logp[k] = beta_p - c2;
        }
    } else {
        const int prior = sp->prior;
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) {
            const float diff = q->logp[k] + c1 - (prior ? q->log_pi[k] : 0.0f);
            if (value) value[k] = c0 * diff * diff;
            if (d_logp) d_logp[k] = 2.0f * c0 * diff;
            if (d_log_pi) d_log_pi[k] = -2.0f * c0 * diff;
        }
    }
}

/* the weights and, with a KL, log p, p, log pi and pi of a span's entries, from the log-sum-exps `lse` of its
 * nodes ([RANGE][3][heads]); with `e` (the terms exp(x - max) of z, s and r whose sums were `l`, [3][RANGE]
 * [heads]), the weights and probabilities are those terms over their sums, else exp(x - lse) */
static void probabilities(const span_t *sn, const spec_t *sp, const float *lse, float (*e)[SPAN], const float *l,
                          probs_t *q) {
    const int64_t n = sn->n, stride = 3 * sp->heads, cells = (sn->n1 - sn->n0) * sp->heads;
    float t[SPAN], inv[RANGE * MAX_HEADS];
#define OVER_SUMS(which, out) /* out = e[which] / l[which] */                          \
    do {                                                                              \
        for (int64_t c = 0; c < cells; ++c) /* (no term: none to weigh) */            \
            inv[c] = l[(which) * cells + c] > 0.0f ? 1.0f / l[(which) * cells + c] : 0.0f; \
        tile(sn, sp, inv, sp->heads, t);                                              \
        _Pragma("omp simd") for (int64_t k = 0; k < n; ++k) out[k] = e[which][k] * t[k]; \
    } while (0)
    if (e) {
        OVER_SUMS(1, q->w);
    } else {
        tile(sn, sp, lse + sp->heads, stride, t);
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) q->w[k] = expf(sn->z[k] - t[k]);
    }
    if (sp->kl == KL_NONE) return;
    tile(sn, sp, lse, stride, t);
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) q->logp[k] = sn->s[k] - t[k];
    if (e) {
        OVER_SUMS(0, q->p);
    } else {
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) q->p[k] = expf(q->logp[k]);
    }
    if (!sp->prior) return;
    if (sp->prior_normalized) {
        memcpy(q->log_pi, sn->r, sizeof(float) * n);
    } else {
        tile(sn, sp, lse + 2 * sp->heads, stride, t);
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) q->log_pi[k] = sn->r[k] - t[k];
    }
    if (e && !sp->prior_normalized) {
        OVER_SUMS(2, q->pi);
    } else {
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) q->pi[k] = expf(q->log_pi[k]);
    }
#undef OVER_SUMS
}

/* a group of spans: one span of whole segments, or (blocks > 1) the blocks of one long segment, `first` its
 * first span (its i0, n0 and n1) */
typedef void (*visit_fn)(span_t *first, int64_t blocks, const spec_t *sp);

/* block b of a long segment */
static void block_of(span_t *sn, const span_t *first, int64_t b, const spec_t *sp) {
    const int64_t per = (SPAN / sp->heads) * sp->heads, end = sp->ptr[first->n0 + 1] * sp->heads;
    sn->n0 = first->n0, sn->n1 = first->n1, sn->i0 = first->i0 + b * per;
    sn->n = end - sn->i0 < per ? end - sn->i0 : per;
}

/* the groups of nodes [n0, n1) (at most RANGE): whole segments while they fit in SPAN entries, a longer one alone */
static void visit_range(int64_t n0, int64_t n1, const spec_t *sp, visit_fn visit) {
    const int64_t *ptr = sp->ptr, heads = sp->heads, per = SPAN / heads;
    span_t sn;
    for (int64_t j = n0, end; j < n1; j = end) {
        for (end = j; end < n1 && (ptr[end + 1] - ptr[j]) * heads <= SPAN; ++end) {
        }
        sn.i0 = ptr[j] * heads, sn.n0 = j;
        if (end > j) { /* nodes [j, end), whole */
            sn.n = (ptr[end] - ptr[j]) * heads, sn.n1 = end;
            visit(&sn, 1, sp);
        } else { /* node j alone, block by block */
            sn.n1 = end = j + 1;
            visit(&sn, (ptr[j + 1] - ptr[j] + per - 1) / per, sp);
        }
    }
}

/* the forward pass of a group: its weights, the log-sum-exps and the nodes' KL shares */
static void forward_group(span_t *first, int64_t blocks, const spec_t *sp) {
    const int heads = sp->heads;
    const int64_t nodes = first->n1 - first->n0, cells = nodes * heads;
    float m[3][RANGE * MAX_HEADS], l[3 * RANGE * MAX_HEADS], log_l[3][RANGE * MAX_HEADS];
    float lse[RANGE * 3 * MAX_HEADS], e[3][SPAN], value[SPAN], total[RANGE] = {0};
    probs_t q;
    span_t blk, *sn = blocks == 1 ? first : &blk;
    for (int c = 0; c < 3; ++c)
        for (int64_t k = 0; k < cells; ++k) m[c][k] = -INFINITY, l[c * cells + k] = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) { /* the statistics */
        if (blocks > 1) block_of(sn, first, b, sp);
        load(sn, sp);
        online_lse(sn, sp, sn->z, m[1], l + cells, e[1]);
        if (sp->kl != KL_NONE) online_lse(sn, sp, sn->s, m[0], l, e[0]);
        if (sp->kl != KL_NONE && sp->prior && !sp->prior_normalized)
            online_lse(sn, sp, sn->r, m[2], l + 2 * cells, e[2]);
    }
    for (int c = 0; c < 3; ++c) {
#pragma omp simd
        for (int64_t k = 0; k < cells; ++k) log_l[c][k] = logf(l[c * cells + k] > 0.0f ? l[c * cells + k] : 1.0f);
        for (int64_t j = 0; j < nodes; ++j)
            for (int h = 0; h < heads; ++h) { /* 0 for a head without a term */
                const int64_t at = j * heads + h;
                lse[(3 * j + c) * heads + h] = l[c * cells + at] > 0.0f ? m[c][at] + log_l[c][at] : 0.0f;
            }
    }
    memcpy(sp->lse + first->n0 * 3 * heads, lse, sizeof(float) * 3 * cells);
    for (int64_t b = 0; b < blocks; ++b) { /* the entries */
        if (blocks > 1) {
            block_of(sn, first, b, sp);
            load(sn, sp);
        }
        probabilities(sn, sp, lse, blocks == 1 ? e : 0, l, &q); /* one block: its terms over their sums */
        memcpy(sp->w + sn->i0, q.w, sizeof(float) * sn->n);
        if (sp->kl == KL_NONE) continue;
        kl_terms(sn->n, sp, &q, value, 0, 0);
        for (int64_t j = sn->n0; j < sn->n1; ++j) {
            int64_t a, z;
            node_entries(sn, sp, j, &a, &z);
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t k = a; k < z; ++k) sum += value[k];
            total[j - sn->n0] += sum;
        }
    }
    for (int64_t j = first->n0; j < first->n1; ++j) {
        const float entries = (float)((sp->ptr[j + 1] - sp->ptr[j]) * heads);
        sp->shares[j] = (total[j - first->n0] + sp->konst * entries) * sp->inv_count;
    }
}

/* the backward pass of a group: the gradients of its scores and prior logits */
static void backward_group(span_t *first, int64_t blocks, const spec_t *sp) {
    const int heads = sp->heads, kl = sp->kl != KL_NONE, prior = kl && sp->prior;
    const int prior_sums = prior && !sp->prior_normalized, d_sums = kl && !sp->centred;
    const int64_t cells = (first->n1 - first->n0) * heads;
    const float *lse = sp->lse_in + first->n0 * 3 * heads, g_kl = sp->g_kl;
    float sum_gw[RANGE * MAX_HEADS], sum_d[RANGE * MAX_HEADS], sum_dpi[RANGE * MAX_HEADS];
    float gw[SPAN], d_logp[SPAN], d_log_pi[SPAN], t[SPAN];
    probs_t q;
    span_t blk, *sn = blocks == 1 ? first : &blk;
    memset(sum_gw, 0, sizeof(float) * cells);
    memset(sum_d, 0, sizeof(float) * cells);
    memset(sum_dpi, 0, sizeof(float) * cells);
    for (int64_t b = 0; b < blocks; ++b) { /* the segment sums of the three chain rules */
        if (blocks > 1) block_of(sn, first, b, sp);
        load(sn, sp);
        probabilities(sn, sp, lse, 0, 0, &q);
        if (sp->g_w) {
            const float *g = sp->g_w + sn->i0;
#pragma omp simd
            for (int64_t k = 0; k < sn->n; ++k) gw[k] = g[k] * q.w[k];
            heads_sum(sn, sp, gw, sum_gw);
        }
        if (!kl) continue;
        kl_terms(sn->n, sp, &q, 0, d_logp, prior ? d_log_pi : 0);
        if (d_sums) heads_sum(sn, sp, d_logp, sum_d);
        if (prior_sums) heads_sum(sn, sp, d_log_pi, sum_dpi);
    }
    for (int64_t b = 0; b < blocks; ++b) {
        if (blocks > 1) {
            block_of(sn, first, b, sp);
            load(sn, sp);
            probabilities(sn, sp, lse, 0, 0, &q);
            if (kl) kl_terms(sn->n, sp, &q, 0, d_logp, prior ? d_log_pi : 0);
        }
        float *ds = sp->d_s + sn->i0;
        if (sp->g_w) {
            const float *g = sp->g_w + sn->i0;
            tile(sn, sp, sum_gw, heads, t);
#pragma omp simd
            for (int64_t k = 0; k < sn->n; ++k) ds[k] = q.w[k] * (g[k] - t[k]);
        } else {
            memset(ds, 0, sizeof(float) * sn->n);
        }
        if (!kl) continue;
        if (d_sums) {
            tile(sn, sp, sum_d, heads, t);
#pragma omp simd
            for (int64_t k = 0; k < sn->n; ++k) ds[k] += g_kl * (d_logp[k] - q.p[k] * t[k]);
        } else { /* sum_j d_logp = 0 (alpha = beta pi): the log-softmax backward is the identity */
#pragma omp simd
            for (int64_t k = 0; k < sn->n; ++k) ds[k] += g_kl * d_logp[k];
        }
        if (!prior) continue;
        float *dr = sp->d_r + sn->i0;
        if (prior_sums) {
            tile(sn, sp, sum_dpi, heads, t);
#pragma omp simd
            for (int64_t k = 0; k < sn->n; ++k) dr[k] = g_kl * (d_log_pi[k] - q.pi[k] * t[k]);
        } else {
#pragma omp simd
            for (int64_t k = 0; k < sn->n; ++k) dr[k] = g_kl * d_log_pi[k];
        }
    }
}

static void run(const spec_t *sp, int64_t nodes, int threads, visit_fn visit) {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t n0 = 0; n0 < nodes; n0 += RANGE) visit_range(n0, n0 + RANGE < nodes ? n0 + RANGE : nodes, sp, visit);
}

void edge_bam_forward(const float *s, const float *r, const float *given, const int64_t *ptr, int64_t nodes,
                      int heads, float *w, float *lse, float *shares, int threads, uint64_t seed, int noise, int prior,
                      int prior_normalized, int kl_kind, float scale, float c0, float c1, float c2, float konst,
                      float inv_count) {
    const spec_t sp = {heads, noise, prior, prior_normalized, kl_kind, 0, scale, c0, c1, c2, konst, inv_count, 0.0f,
                       seed, ptr, s, r, given, 0, 0, w, lse, shares, 0, 0};
    run(&sp, nodes, threads, forward_group);
}

void edge_bam_backward(const float *s, const float *r, const float *given, const int64_t *ptr, int64_t nodes,
                       int heads, const float *lse, const float *g_w, const float *g_kl, float *d_s, float *d_r,
                       int threads, uint64_t seed, int noise, int prior, int prior_normalized, int kl_kind,
                       int centred, float scale, float c0, float c1, float c2, float inv_count) {
    /* without the KL's gradient, nothing flows back through the KL: the prior's gradient is zero */
    const spec_t sp = {heads, noise, prior, prior_normalized, kl_kind, centred, scale, c0, c1, c2, 0.0f, inv_count,
                       g_kl ? *g_kl * inv_count : 0.0f, seed, ptr, s, r, given, lse, g_w, 0, 0, 0, d_s, d_r};
    run(&sp, nodes, threads, backward_group);
}
