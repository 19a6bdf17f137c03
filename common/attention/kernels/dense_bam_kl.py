r"""The BAM KL of a dense attention call and the contextual prior, as Triton functions that the attention kernels
(:mod:`common.attention.kernels.dense_bam`) call.

The closed forms are :mod:`common.attention.bam_stats`'s (Fan et al., 2020, Eq. 4, summed over the
visible keys of each query): with ``LSE_i`` (and ``S2_i``) from the attention, every query's term is a
function of ``q_i``, ``LSE_i``, ``S2_i`` and a few sums over the keys of its (batch, head), and the
layer's sum over the queries needs only sums over the queries (``sum_i q_i``, ``sum_i LSE_i``,
``sum_i LSE_i q_i``, ``sum_i LSE_i^2``, ``sum_i S2_i``). So in the forward kernel the program that
finishes a (batch, head)'s last block of queries runs :func:`kl_sums` for it: a pass over its
queries, a pass over its keys for the prior's normaliser and one for the prior's sums, written to the
statistics buffer; the program that finishes the last (batch, head) adds their sums in a fixed order
and writes ``KL = sum / count + const``. The contextual prior ``F2(act(F1(k_j)))`` (BAM Sec. 3.3) is
computed from the network's weights, one hidden unit at a time.

The KL is linear in its upstream gradient ``g``, so the backward kernel needs nothing but the saved
sums: :func:`kl_key_gradients` gives a block of keys' share of ``dK`` (and adds the prior network's
weight gradients, float32 atomics), the score gradient takes each query's ``dLSE_i`` from a row that
:func:`kl_sums` writes (and ``dS2_i``, a constant), and :func:`kl_query_term` gives the KL's direct
share of ``dQ``.

Kinds of KL: :data:`KL_WEIBULL_FIXED`, :data:`KL_WEIBULL_CONTEXTUAL`, :data:`KL_LOGNORMAL_FIXED`,
:data:`KL_LOGNORMAL_CONTEXTUAL`; no causal mask (:mod:`common.attention.dense_bam` computes that case's
KL from the rows' ``LSE_i`` with PyTorch's operators).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .jit_utils import digamma, lgamma

KL_NONE, KL_WEIBULL_FIXED, KL_WEIBULL_CONTEXTUAL, KL_LOGNORMAL_FIXED, KL_LOGNORMAL_CONTEXTUAL = 0, 1, 2, 3, 4
LOGNORMAL = (KL_LOGNORMAL_FIXED, KL_LOGNORMAL_CONTEXTUAL)
ACTIVATIONS = {"relu": 0, "leaky_relu": 1, "tanh": 2}
#: The statistics buffer (float32, zeroed): four rows per query (the attention's noisy log2-normaliser, ``LSE_i``,
#: ``S2_i``, and the KL's ``d KL / d LSE_i`` per unit of upstream gradient and entry), then per (batch, head) four vectors of ``BLOCK_D`` floats (the visible keys' sum, the prior-weighted
#: keys' sum, the queries' sum, ``sum_i u_i q_i``) and 16 scalars (those of :func:`kl_sums`, then at
#: :data:`QUERY_TICKET` the count of the forward's finished blocks of queries), then the layer's finishing ticket and
#: entry count.
_SCALARS = 16
QUERY_TICKET = tl.constexpr(9)
ROW_STATS = tl.constexpr(4)


def stats_size(batch_heads: int, n_q: int, head_d: int) -> int:
    """Floats of the statistics buffer."""
    return ROW_STATS * batch_heads * n_q + batch_heads * (4 * block_d(head_d) + _SCALARS) + 2


@triton.jit
def per_head(STATS, BH, n_q, bh, BLOCK_D: tl.constexpr):
    """The (batch, head)'s sums in the statistics buffer."""
    return STATS + ROW_STATS * BH * n_q + bh * (4 * BLOCK_D + 16)


def block_d(head_d: int) -> int:
    return max(16, triton.next_power_of_2(head_d))


@triton.jit
def _activation(x, ACT: tl.constexpr):
    if ACT == 0:
        return tl.maximum(x, 0.0)
    elif ACT == 1:
        return tl.where(x > 0, x, 0.1 * x)
    else:
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _activation_grad(x, ACT: tl.constexpr):
    if ACT == 0:
        return tl.where(x > 0, 1.0, 0.0)
    elif ACT == 1:
        return tl.where(x > 0, 1.0, 0.1)
    else:
        t = 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
        return 1.0 - t * t


@triton.jit
def _keys(K, MASK, b, h, start, n_k, head_d, stride_kb, stride_kh, stride_kn, stride_mb, stride_mh, stride_mn,
          HAS_MASK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """A block of keys as float32, which exist, and which are visible."""
    offs_k, offs_d = start + tl.arange(0, BLOCK_K), tl.arange(0, BLOCK_D)
    exists = offs_k < n_k
    k = tl.load(K + b * stride_kb + h * stride_kh + offs_k[:, None] * stride_kn + offs_d[None, :],
                mask=exists[:, None] & (offs_d[None, :] < head_d), other=0.0).to(tl.float32)
    visible = exists
    if HAS_MASK:
        visible = visible & (tl.load(MASK + b * stride_mb + h * stride_mh + offs_k * stride_mn, mask=exists,
                                     other=0) != 0)
    return offs_k, k, exists, visible


@triton.jit
def _hidden_unit(k, W1, B1, h, j, s1h, s1i, s1j, sb1h, sb1j, head_d, BLOCK_D: tl.constexpr):
    """Unit ``j`` of the prior network's hidden layer for a block of keys: its weights ``W1[:, j]`` and input."""
    offs_d = tl.arange(0, BLOCK_D)
    w = tl.load(W1 + h * s1h + offs_d * s1i + j * s1j, mask=offs_d < head_d, other=0.0).to(tl.float32)
    return w, tl.sum(k * w[None, :], 1) + tl.load(B1 + h * sb1h + j * sb1j).to(tl.float32)


@triton.jit
def _prior_logits(k, W1, B1, W2, B2, h, s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h, head_d, d_mid,
                  ACT: tl.constexpr, BLOCK_D: tl.constexpr):
    """``r_j = w2 . act(W1^T k_j + b1) + b2`` for a block of keys (one hidden unit at a time: few registers)."""
    r = tl.zeros((k.shape[0],), tl.float32) + tl.load(B2 + h * sb2h).to(tl.float32)
    for j in range(d_mid):
        _, pre = _hidden_unit(k, W1, B1, h, j, s1h, s1i, s1j, sb1h, sb1j, head_d, BLOCK_D)
        r += _activation(pre, ACT) * tl.load(W2 + h * s2h + j * s2j).to(tl.float32)
    return r


@triton.jit
def kl_sums(Q, K, MASK, STATS, KL, W1, B1, W2, B2, b, h, bh, BH,
            stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_mb, stride_mh, stride_mn,
            s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h,
            n_q, n_k, head_d, d_mid, scale, beta, log_beta, log_tiny, alpha0, c_w, kl_scale, offset, const,
            KL_KIND: tl.constexpr, HAS_MASK: tl.constexpr, SCOPE_ALL: tl.constexpr, ACT: tl.constexpr,
            BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """The KL sums of (batch, head) ``bh`` once its rows' ``LSE_i`` and ``S2_i`` are written (by other programs:
    they are read past the L1 cache); the last (batch, head) to finish writes the layer's KL."""
    BLOCK_K: tl.constexpr = BLOCK_R
    PRIOR: tl.constexpr = KL_KIND == 2 or KL_KIND == 4
    offs_d = tl.arange(0, BLOCK_D)
    rows_lse = STATS + BH * n_q + bh * n_q
    st = per_head(STATS, BH, n_q, bh, BLOCK_D)
    # the queries: sum_i q_i, sum_i LSE_i, sum_i LSE_i q_i, sum_i LSE_i^2, sum_i S2_i
    q_sum, lse_q = tl.zeros((BLOCK_D,), tl.float32), tl.zeros((BLOCK_D,), tl.float32)
    l_sum, ll_sum, s2_sum = 0.0, 0.0, 0.0
    for start in range(0, n_q, BLOCK_R):
        offs_r = start + tl.arange(0, BLOCK_R)
        ok = offs_r < n_q
        q = tl.load(Q + b * stride_qb + h * stride_qh + offs_r[:, None] * stride_qm + offs_d[None, :],
                    mask=ok[:, None] & (offs_d[None, :] < head_d), other=0.0).to(tl.float32)
        lse = tl.load(rows_lse + offs_r, mask=ok, other=0.0, cache_modifier=".cg")
        lse = tl.where(lse > float("-inf"), lse, 0.0)  # rows without keys: all of them or none (a key mask)
        q_sum += tl.sum(q, 0)
        l_sum += tl.sum(lse)
        if KL_KIND >= 3:
            lse_q += tl.sum(q * lse[:, None], 0)
            ll_sum += tl.sum(lse * lse)
            s2_sum += tl.sum(tl.load(rows_lse + BH * n_q + offs_r, mask=ok, other=0.0, cache_modifier=".cg"))
    # the keys, first pass: the visible count and sum, and the prior logits' normaliser
    n, k_sum = 0.0, tl.zeros((BLOCK_D,), tl.float32)
    m_r, l_r = float("-inf"), 0.0
    for start in range(0, n_k, BLOCK_K):
        offs_k, k, exists, visible = _keys(K, MASK, b, h, start, n_k, head_d, stride_kb, stride_kh, stride_kn,
                                           stride_mb, stride_mh, stride_mn, HAS_MASK, BLOCK_K, BLOCK_D)
        n += tl.sum(visible.to(tl.float32))
        k_sum += tl.sum(tl.where(visible[:, None], k, 0.0), 0)
        if PRIOR:
            r = _prior_logits(k, W1, B1, W2, B2, h, s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h, head_d, d_mid, ACT,
                              BLOCK_D)
            r = tl.where(exists if SCOPE_ALL else visible, r, float("-inf"))
            m_new = tl.maximum(m_r, tl.max(r))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            l_r = l_r * tl.exp(m_r - m_safe) + tl.sum(tl.exp(r - m_safe))
            m_r = m_new
    rows = tl.where(n > 0, n_q * 1.0, 0.0)  # queries with at least one key
    u_sum = rows * offset - l_sum
    u_q = offset * q_sum - lse_q  # sum_i u_i q_i, u_i = offset - LSE_i
    lse_r = tl.where(l_r > 0, tl.where(m_r == float("-inf"), 0.0, m_r) + tl.log(tl.where(l_r > 0, l_r, 1.0)), 0.0)
    # second pass: the prior's sums, and what its backward pass needs (s0)
    a_sum, g_sum, s0 = 0.0, 0.0, 0.0
    c_sum = tl.zeros((BLOCK_D,), tl.float32)
    if PRIOR:
        for start in range(0, n_k, BLOCK_K):
            offs_k, k, exists, visible = _keys(K, MASK, b, h, start, n_k, head_d, stride_kb, stride_kh, stride_kn,
                                               stride_mb, stride_mh, stride_mn, HAS_MASK, BLOCK_K, BLOCK_D)
            log_pi = _prior_logits(k, W1, B1, W2, B2, h, s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h, head_d, d_mid,
                                   ACT, BLOCK_D) - lse_r
            qk = tl.sum(k * q_sum[None, :], 1)
            if KL_KIND == 2:  # a_j = beta pi_j, kept above the smallest normal float
                log_a = tl.where(visible, log_pi + log_beta, 0.0)
                a = tl.where(visible, tl.exp(tl.maximum(log_a, log_tiny)), 0.0)
                a_sum += tl.sum(a)
                g_sum += tl.sum(tl.where(visible, lgamma(tl.where(visible, a, 1.0)), 0.0))
                c_sum += tl.sum(a[:, None] * k, 0)
                d_a = rows * (digamma(tl.where(visible, a, 1.0)) + c_w) - scale * qk + l_sum
                d_pi = tl.where(visible & (log_a >= log_tiny), beta * d_a, 0.0)
                s0 += tl.sum(tl.where(visible, tl.exp(log_pi) * d_pi, 0.0))
            else:  # t_j = log pi_j
                t = tl.where(visible, log_pi, 0.0)
                a_sum += tl.sum(t)
                g_sum += tl.sum(t * t)
                c_sum += tl.sum(t[:, None] * k, 0)
                s0 += tl.sum(tl.where(visible, kl_scale * (2.0 * rows * t - 2.0 * scale * qk - 2.0 * u_sum), 0.0))
    # d KL_bh / d LSE_i of every query, for the backward pass (per unit of the mean's upstream gradient)
    for start in range(0, n_q, BLOCK_R):
        offs_r = start + tl.arange(0, BLOCK_R)
        ok = offs_r < n_q
        if KL_KIND == 1:
            c = tl.zeros((BLOCK_R,), tl.float32) + alpha0 * n
        elif KL_KIND == 2:
            c = tl.zeros((BLOCK_R,), tl.float32) + a_sum
        else:  # -(2 (P0_i - t_sum) + 2 n u_i) kl_scale, P0_i = scale q_i . sum_j k_j
            q = tl.load(Q + b * stride_qb + h * stride_qh + offs_r[:, None] * stride_qm + offs_d[None, :],
                        mask=ok[:, None] & (offs_d[None, :] < head_d), other=0.0).to(tl.float32)
            lse = tl.load(rows_lse + offs_r, mask=ok, other=0.0, cache_modifier=".cg")
            u = offset - tl.where(lse > float("-inf"), lse, 0.0)
            t_sum = 0.0
            if KL_KIND == 4:
                t_sum = a_sum
            c = -kl_scale * (2.0 * (scale * tl.sum(q * k_sum[None, :], 1) - t_sum) + 2.0 * n * u)
        tl.store(rows_lse + 2 * BH * n_q + offs_r, tl.where(n > 0, c, 0.0), mask=ok)
    # the (batch, head)'s sum over its queries of the closed forms
    if KL_KIND == 1:
        part = rows * beta - alpha0 * (scale * tl.sum(q_sum * k_sum) - n * l_sum)
    elif KL_KIND == 2:
        part = rows * (beta + g_sum + c_w * a_sum) - scale * tl.sum(q_sum * c_sum) + a_sum * l_sum
    else:
        uu = rows * offset * offset - 2.0 * offset * l_sum + ll_sum
        part = s2_sum + 2.0 * scale * tl.sum(u_q * k_sum) + n * uu
        if KL_KIND == 4:
            part += -2.0 * scale * tl.sum(q_sum * c_sum) + rows * g_sum - 2.0 * a_sum * u_sum
        part = kl_scale * part
    part = tl.where(n > 0, part, 0.0)
    tl.store(st + offs_d, k_sum)
    tl.store(st + BLOCK_D + offs_d, c_sum)
    tl.store(st + 2 * BLOCK_D + offs_d, q_sum)
    tl.store(st + 3 * BLOCK_D + offs_d, u_q)
    scalars = st + 4 * BLOCK_D
    tl.store(scalars + 0, n)
    tl.store(scalars + 1, a_sum)
    tl.store(scalars + 2, g_sum)
    tl.store(scalars + 3, lse_r)
    tl.store(scalars + 4, l_sum)
    tl.store(scalars + 5, s0)
    tl.store(scalars + 6, u_sum)
    tl.store(scalars + 7, part)
    tl.store(scalars + 8, rows * n)
    tl.debug_barrier()
    glob = STATS + ROW_STATS * BH * n_q + BH * (4 * BLOCK_D + 16)
    if tl.atomic_add(glob, 1.0, sem="acq_rel") == BH - 1:  # the last program: the layer's sum, in a fixed order
        total, count = 0.0, 0.0
        for start in range(0, BH, 256):
            idx = start + tl.arange(0, 256)
            where = STATS + ROW_STATS * BH * n_q + idx.to(tl.int64) * (4 * BLOCK_D + 16) + 4 * BLOCK_D
            total += tl.sum(tl.load(where + 7, mask=idx < BH, other=0.0, cache_modifier=".cg"))
            count += tl.sum(tl.load(where + 8, mask=idx < BH, other=0.0, cache_modifier=".cg"))
        tl.store(glob + 1, count)
        tl.store(KL, total / tl.maximum(count, 1.0) + const)


@triton.jit
def kl_gradient_scale(STATS, D_KL, BH, n_q, bh, BLOCK_D: tl.constexpr):
    """The upstream gradient per entry of the KL's mean, ``g / count`` (0 for a (batch, head) without a visible key),
    and the (batch, head)'s visible key count."""
    st = per_head(STATS, BH, n_q, bh, BLOCK_D)
    n = tl.load(st + 4 * BLOCK_D)
    count = tl.load(STATS + ROW_STATS * BH * n_q + BH * (4 * BLOCK_D + 16) + 1)
    return tl.where(n > 0, tl.load(D_KL).to(tl.float32) / tl.maximum(count, 1.0), 0.0), n


@triton.jit
def kl_key_gradients(k, exists, visible, g, n, st, h, n_q, head_d, d_mid, W1, B1, W2, B2, DW1, DB1, DW2, DB2,
                     s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h, scale, beta, log_beta, log_tiny, alpha0, c_w, kl_scale,
                     KL_KIND: tl.constexpr, SCOPE_ALL: tl.constexpr, ACT: tl.constexpr, BLOCK_D: tl.constexpr):
    """The KL's gradient for a block of keys ``k`` (float32 ``[BLOCK_K, BLOCK_D]``); adds the prior network's."""
    offs_d = tl.arange(0, BLOCK_D)
    scalars = st + 4 * BLOCK_D
    q_sum = tl.load(st + 2 * BLOCK_D + offs_d)
    rows = tl.where(n > 0, n_q * 1.0, 0.0)
    zero = tl.zeros(k.shape, tl.float32)
    if KL_KIND == 1:
        dk = tl.where(visible[:, None], zero + (-g * alpha0 * scale) * q_sum[None, :], 0.0)
    elif KL_KIND == 3:
        dk = tl.where(visible[:, None], zero + (2.0 * g * kl_scale * scale) * tl.load(st + 3 * BLOCK_D + offs_d)[None, :],
                      0.0)
    else:
        log_pi = _prior_logits(k, W1, B1, W2, B2, h, s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h, head_d, d_mid, ACT,
                               BLOCK_D) - tl.load(scalars + 3)
        pi = tl.where(exists if SCOPE_ALL else visible, tl.exp(log_pi), 0.0)
        qk = tl.sum(k * q_sum[None, :], 1)
        s0 = tl.load(scalars + 5)
        if KL_KIND == 2:
            log_a = tl.where(visible, log_pi + log_beta, 0.0)
            a = tl.where(visible, tl.exp(tl.maximum(log_a, log_tiny)), 0.0)
            d_a = rows * (digamma(tl.where(visible, a, 1.0)) + c_w) - scale * qk + tl.load(scalars + 4)
            d_pi = tl.where(visible & (log_a >= log_tiny), g * beta * d_a, 0.0)
            d_r = pi * (d_pi - g * s0)
            dk = zero + (-g * scale) * a[:, None] * q_sum[None, :]
        else:
            t = tl.where(visible, log_pi, 0.0)
            d_t = tl.where(visible, g * kl_scale * (2.0 * rows * t - 2.0 * scale * qk - 2.0 * tl.load(scalars + 6)), 0.0)
            d_r = d_t - pi * (g * s0)
            dk = (g * kl_scale * scale) * (2.0 * tl.load(st + 3 * BLOCK_D + offs_d)[None, :]
                                           - 2.0 * t[:, None] * q_sum[None, :])
        dk = tl.where(visible[:, None], dk, 0.0)  # the closed form's own terms; the prior's follow
        d_r = tl.where(exists, d_r, 0.0)
        for j in range(d_mid):  # the network's backward pass, one hidden unit at a time
            w, pre = _hidden_unit(k, W1, B1, h, j, s1h, s1i, s1j, sb1h, sb1j, head_d, BLOCK_D)
            d_pre = d_r * tl.load(W2 + h * s2h + j * s2j).to(tl.float32) * _activation_grad(pre, ACT)
            dk += d_pre[:, None] * w[None, :]
            tl.atomic_add(DW1 + h * s1h + offs_d * s1i + j * s1j, tl.sum(k * d_pre[:, None], 0), mask=offs_d < head_d,
                          sem="relaxed")
            tl.atomic_add(DB1 + h * sb1h + j * sb1j, tl.sum(d_pre), sem="relaxed")
            tl.atomic_add(DW2 + h * s2h + j * s2j, tl.sum(d_r * _activation(pre, ACT)), sem="relaxed")
        tl.atomic_add(DB2 + h * sb2h, tl.sum(d_r), sem="relaxed")
    return dk


@triton.jit
def kl_query_term(lse, g, n, st, scale, alpha0, kl_scale, offset, KL_KIND: tl.constexpr, BLOCK_D: tl.constexpr):
    """The KL's direct share of ``dQ`` for a block of queries (``[M, BLOCK_D]``; ``LSE_i`` in natural log)."""
    offs_d = tl.arange(0, BLOCK_D)
    zero = tl.zeros((lse.shape[0], BLOCK_D), tl.float32)
    if KL_KIND == 1:
        return zero + (-g * alpha0 * scale * tl.load(st + offs_d))[None, :]
    elif KL_KIND == 2:
        return zero + (-g * scale * tl.load(st + BLOCK_D + offs_d))[None, :]
    else:
        u = offset - tl.where(lse > float("-inf"), lse, 0.0)
        dq = (g * kl_scale * scale * 2.0) * u[:, None] * tl.load(st + offs_d)[None, :]
        if KL_KIND == 4:
            dq += (-2.0 * g * kl_scale * scale * tl.load(st + BLOCK_D + offs_d))[None, :]
        return dq


#: The KL's constants, in the order the operator takes them (:func:`constants`).
CONSTANTS = ("beta", "log_beta", "log_tiny", "alpha0", "c_w", "kl_scale", "offset", "const")


def constants(kernel) -> list:
    """The float constants of a :class:`~common.attention.bam.WeibullGammaKL` or ``LognormalKL``, in the order
    of :data:`CONSTANTS` (the log of float32's smallest normal number keeps ``beta pi_j`` finite under lgamma)."""
    log_tiny = math.log(torch.finfo(torch.float32).tiny)
    if kl_kind(kernel) in (KL_WEIBULL_FIXED, KL_WEIBULL_CONTEXTUAL):
        return [math.exp(kernel.log_beta), kernel.log_beta, log_tiny, kernel.alpha or 0.0, kernel.c, 0.0, 0.0,
                kernel.const]
    return [0.0, 0.0, log_tiny, 0.0, 0.0, kernel.scale, kernel.offset, kernel.const]


def kl_kind(kernel) -> int:
    """The kind of a :class:`~common.attention.bam.WeibullGammaKL` or ``LognormalKL``."""
    from ..bam import WeibullGammaKL
    if isinstance(kernel, WeibullGammaKL):
        return KL_WEIBULL_FIXED if kernel.alpha is not None else KL_WEIBULL_CONTEXTUAL
    return KL_LOGNORMAL_CONTEXTUAL if kernel.contextual else KL_LOGNORMAL_FIXED


def _prior_args(prior: list) -> tuple:
    """The four prior tensors ``(W1, b1, w2, b2)`` (``Linear`` layers shared by the heads, or per-head ``HeadLinear``
    ones) and their strides as ``(head, in, out)``, ``(head, out)``, ``(head, in)``, ``(head,)``; stand-ins without."""
    if not prior:
        return (None,) * 4 + (0,) * 8
    w1, b1, w2, b2 = prior
    if w1.dim() == 2:  # Linear(d, m).weight [m, d]; Linear(m, 1).weight [1, m]
        strides = (0, w1.stride(1), w1.stride(0), 0, b1.stride(0), 0, w2.stride(1), 0)
    else:  # HeadLinear: [H, d, m], [H, m], [H, m, 1], [H, 1]
        strides = (w1.stride(0), w1.stride(1), w1.stride(2), b1.stride(0), b1.stride(1), w2.stride(0), w2.stride(1),
                   b2.stride(0))
    return (w1, b1, w2, b2) + strides


def kl_block(head_d: int) -> int:
    """Queries or keys per step of :func:`kl_sums`: 2048 float32 values a block (no spilled register on an A100)."""
    return max(16, min(64, 2048 // block_d(head_d)))


def kl_args(prior: list, kl_kind: int, kl_constants: list, scope_all: bool, activation: int, head_d: int,
            stand_in: Tensor) -> tuple:
    """The arguments and constants the attention kernels take for the KL: the prior's tensors, strides and hidden
    size, the constants; ``stand_in`` takes the place of absent tensors."""
    w1, b1, w2, b2, *strides = _prior_args(prior)
    tensors = (w1, b1, w2, b2) if w1 is not None else (stand_in,) * 4
    d_mid = 0 if w1 is None else b1.shape[-1]
    return (*tensors, *strides, d_mid, *kl_constants), dict(KL_KIND=kl_kind, SCOPE_ALL=scope_all, ACT=activation,
                                                              KL_BLOCK=kl_block(head_d))
