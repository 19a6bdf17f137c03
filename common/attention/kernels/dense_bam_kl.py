r"""The BAM KL of a dense attention call, and the contextual prior, as two Triton kernels.

The closed forms are :mod:`common.attention.bam_stats`'s (Fan et al., 2020, Eq. 4, summed over the
visible keys of each query): with ``LSE_i`` (and ``S2_i``) from the attention kernel, every
query's term is a function of ``q_i``, ``LSE_i``, ``S2_i`` and a few sums over the keys of its
(batch, head), and the layer's sum over the queries needs only sums over the queries
(``sum_i q_i``, ``sum_i LSE_i``, ``sum_i LSE_i q_i``, ``sum_i LSE_i^2``, ``sum_i S2_i``). So
:func:`_kl_forward` runs one program per (batch, head) after the attention: a pass over its
queries, a pass over its keys for the prior's normaliser and one for the prior's sums, written to a
statistics buffer; the program that finishes last adds the (batch, head) sums in a fixed order and
writes ``KL = sum / count + const``. The contextual prior ``F2(act(F1(k_j)))`` (BAM Sec. 3.3) is
computed in the kernel from the network's weights.

The KL is linear in its upstream gradient ``g``, so :func:`_kl_backward` needs nothing but the saved
sums: its programs over blocks of queries write what the attention's backward kernel reads (``D_i =
dO_i . O_i``, the KL's ``dLSE_i`` and ``dS2_i``) and start the float32 ``dQ`` with the KL's direct
term; its programs over blocks of keys write the KL's share of ``dK`` (the attention's backward adds
its own) and add the prior network's weight gradients (float32 atomics).

Kinds of KL: :data:`KL_WEIBULL_FIXED`, :data:`KL_WEIBULL_CONTEXTUAL`, :data:`KL_LOGNORMAL_FIXED`,
:data:`KL_LOGNORMAL_CONTEXTUAL`; no causal mask (:mod:`common.attention.dense_bam` computes that case's
KL from the rows' ``LSE_i`` with PyTorch's operators).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import launch
from .edge_bam import _digamma, _lgamma

KL_NONE, KL_WEIBULL_FIXED, KL_WEIBULL_CONTEXTUAL, KL_LOGNORMAL_FIXED, KL_LOGNORMAL_CONTEXTUAL = 0, 1, 2, 3, 4
LOGNORMAL = (KL_LOGNORMAL_FIXED, KL_LOGNORMAL_CONTEXTUAL)
ACTIVATIONS = {"relu": 0, "leaky_relu": 1, "tanh": 2}
#: Per (batch, head): four vectors of ``BLOCK_D`` floats (the visible keys' sum, the prior-weighted keys' sum,
#: the queries' sum, ``sum_i u_i q_i``), then these scalars.
_N, _A, _G, _LSE_R, _L, _S0, _U, _PART, _COUNT = range(9)
_SCALARS = 16
#: After the (batch, head) rows: the finishing ticket and the layer's entry count.
_TICKET, _TOTAL_COUNT = 0, 1
LOG2E = 1.4426950408889634


def stats_size(batch_heads: int, n_q: int, head_d: int) -> int:
    """Floats of the statistics buffer: three rows per query (the attention's), the (batch, head) sums, two."""
    return 3 * batch_heads * n_q + batch_heads * (4 * block_d(head_d) + _SCALARS) + 2


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
def _kl_forward(Q, K, MASK, STATS, KL, W1, B1, W2, B2,
                stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_mb, stride_mh, stride_mn,
                s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h,
                H, n_q, n_k, head_d, d_mid, scale, beta, log_beta, log_tiny, alpha0, c_w, kl_scale, offset, const,
                KL_KIND: tl.constexpr, HAS_MASK: tl.constexpr, SCOPE_ALL: tl.constexpr, ACT: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """The KL sums of one (batch, head); the last program to finish writes the layer's KL."""
    bh = tl.program_id(0).to(tl.int64)
    BH = tl.num_programs(0)
    b, h = bh // H, bh % H
    PRIOR: tl.constexpr = KL_KIND == 2 or KL_KIND == 4
    offs_d = tl.arange(0, BLOCK_D)
    rows_lse = STATS + BH * n_q + bh * n_q
    st = STATS + 3 * BH * n_q + bh * (4 * BLOCK_D + 16)
    # the queries: sum_i q_i, sum_i LSE_i, sum_i LSE_i q_i, sum_i LSE_i^2, sum_i S2_i
    q_sum, lse_q = tl.zeros((BLOCK_D,), tl.float32), tl.zeros((BLOCK_D,), tl.float32)
    l_sum, ll_sum, s2_sum = 0.0, 0.0, 0.0
    for start in range(0, n_q, BLOCK_R):
        offs_r = start + tl.arange(0, BLOCK_R)
        ok = offs_r < n_q
        q = tl.load(Q + b * stride_qb + h * stride_qh + offs_r[:, None] * stride_qm + offs_d[None, :],
                    mask=ok[:, None] & (offs_d[None, :] < head_d), other=0.0).to(tl.float32)
        lse = tl.load(rows_lse + offs_r, mask=ok, other=0.0)
        lse = tl.where(lse > float("-inf"), lse, 0.0)  # rows without keys: all of them or none (a key mask)
        q_sum += tl.sum(q, 0)
        l_sum += tl.sum(lse)
        if KL_KIND >= 3:
            lse_q += tl.sum(q * lse[:, None], 0)
            ll_sum += tl.sum(lse * lse)
            s2_sum += tl.sum(tl.load(rows_lse + BH * n_q + offs_r, mask=ok, other=0.0))
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
                g_sum += tl.sum(tl.where(visible, _lgamma(tl.where(visible, a, 1.0)), 0.0))
                c_sum += tl.sum(a[:, None] * k, 0)
                d_a = rows * (_digamma(tl.where(visible, a, 1.0)) + c_w) - scale * qk + l_sum
                d_pi = tl.where(visible & (log_a >= log_tiny), beta * d_a, 0.0)
                s0 += tl.sum(tl.where(visible, tl.exp(log_pi) * d_pi, 0.0))
            else:  # t_j = log pi_j
                t = tl.where(visible, log_pi, 0.0)
                a_sum += tl.sum(t)
                g_sum += tl.sum(t * t)
                c_sum += tl.sum(t[:, None] * k, 0)
                s0 += tl.sum(tl.where(visible, kl_scale * (2.0 * rows * t - 2.0 * scale * qk - 2.0 * u_sum), 0.0))
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
    glob = STATS + 3 * BH * n_q + BH * (4 * BLOCK_D + 16)
    if tl.atomic_add(glob, 1.0, sem="acq_rel") == BH - 1:  # the last program: the layer's sum, in a fixed order
        total, count = 0.0, 0.0
        for start in range(0, BH, 256):
            idx = start + tl.arange(0, 256)
            where = STATS + 3 * BH * n_q + idx.to(tl.int64) * (4 * BLOCK_D + 16) + 4 * BLOCK_D
            total += tl.sum(tl.load(where + 7, mask=idx < BH, other=0.0, cache_modifier=".cg"))
            count += tl.sum(tl.load(where + 8, mask=idx < BH, other=0.0, cache_modifier=".cg"))
        tl.store(glob + 1, count)
        tl.store(KL, total / tl.maximum(count, 1.0) + const)


@triton.jit
def _kl_backward(Q, K, MASK, OUT, DO, STATS, D_STATS, D_KL, GRADS, DQ, DK, W1, B1, W2, B2, DW1, DB1, DW2, DB2,
                 stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_mb, stride_mh, stride_mn,
                 stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom,
                 s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h,
                 H, n_q, n_k, head_d, head_dv, d_mid, scale, beta, log_beta, log_tiny, alpha0, c_w, kl_scale, offset,
                 KL_KIND: tl.constexpr, HAS_MASK: tl.constexpr, SCOPE_ALL: tl.constexpr, ACT: tl.constexpr,
                 HAS_D_ROWS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_DV: tl.constexpr):
    """Programs over blocks of queries write ``GRADS`` (``D_i``, ``dLSE_i``, ``LSE_i`` in base 2 or +inf, ``dS2_i``)
    and start ``DQ`` with the KL's term; programs over blocks of keys write the KL's ``dK`` and add the prior
    network's gradients."""
    pid, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    BH = tl.num_programs(1)
    b, h = bh // H, bh % H
    PRIOR: tl.constexpr = KL_KIND == 2 or KL_KIND == 4
    offs_d = tl.arange(0, BLOCK_D)
    row_blocks = tl.cdiv(n_q, BLOCK_R)
    st = STATS + 3 * BH * n_q + bh * (4 * BLOCK_D + 16)
    scalars = st + 4 * BLOCK_D
    g, n, rows = 0.0, 0.0, 0.0
    if KL_KIND != 0:  # the upstream gradient per entry of the mean
        count = tl.load(STATS + 3 * BH * n_q + BH * (4 * BLOCK_D + 16) + 1)
        n = tl.load(scalars + 0)
        g = tl.where(n > 0, tl.load(D_KL).to(tl.float32) / tl.maximum(count, 1.0), 0.0)
        rows = tl.where(n > 0, n_q * 1.0, 0.0)
    if pid < row_blocks:
        offs_r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
        ok = offs_r < n_q
        offs_dv = tl.arange(0, BLOCK_DV)
        o = tl.load(OUT + b * stride_ob + h * stride_oh + offs_r[:, None] * stride_om + offs_dv[None, :],
                    mask=ok[:, None] & (offs_dv[None, :] < head_dv), other=0.0).to(tl.float32)
        do = tl.load(DO + b * stride_dob + h * stride_doh + offs_r[:, None] * stride_dom + offs_dv[None, :],
                     mask=ok[:, None] & (offs_dv[None, :] < head_dv), other=0.0).to(tl.float32)
        stat = BH * n_q
        at = bh * n_q + offs_r
        lse = tl.load(STATS + stat + at, mask=ok, other=float("-inf"))
        d_lse = tl.zeros((BLOCK_R,), tl.float32)
        d_sq = tl.zeros((BLOCK_R,), tl.float32)
        if HAS_D_ROWS:
            d_lse += tl.load(D_STATS + stat + at, mask=ok, other=0.0)
            d_sq += tl.load(D_STATS + 2 * stat + at, mask=ok, other=0.0)
        dq = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
        if KL_KIND == 1:
            d_lse += g * alpha0 * n
            dq += (-g * alpha0 * scale * tl.load(st + offs_d))[None, :]
        elif KL_KIND == 2:
            d_lse += g * tl.load(scalars + 1)
            dq += (-g * scale * tl.load(st + BLOCK_D + offs_d))[None, :]
        elif KL_KIND >= 3:
            q = tl.load(Q + b * stride_qb + h * stride_qh + offs_r[:, None] * stride_qm + offs_d[None, :],
                        mask=ok[:, None] & (offs_d[None, :] < head_d), other=0.0).to(tl.float32)
            k_sum = tl.load(st + offs_d)
            u = offset - tl.where(lse > float("-inf"), lse, 0.0)
            p0 = scale * tl.sum(q * k_sum[None, :], 1)
            t_sum = 0.0
            if KL_KIND == 4:
                t_sum = tl.load(scalars + 1)
            d_sq += g * kl_scale
            d_lse += -g * kl_scale * (2.0 * (p0 - t_sum) + 2.0 * n * u)
            dq += (g * kl_scale * scale * 2.0) * u[:, None] * k_sum[None, :]
            if KL_KIND == 4:
                dq += (-2.0 * g * kl_scale * scale * tl.load(st + BLOCK_D + offs_d))[None, :]
        tl.store(GRADS + at, tl.sum(o * do, 1), mask=ok)
        tl.store(GRADS + stat + at, d_lse, mask=ok)
        tl.store(GRADS + 2 * stat + at, tl.where(lse > float("-inf"), lse * 1.4426950408889634, float("inf")), mask=ok)
        tl.store(GRADS + 3 * stat + at, d_sq, mask=ok)
        tl.store(DQ + bh * n_q * head_d + offs_r[:, None] * head_d + offs_d[None, :], dq,
                 mask=ok[:, None] & (offs_d[None, :] < head_d))
    elif KL_KIND != 0:
        offs_k, k, exists, visible = _keys(K, MASK, b, h, (pid - row_blocks) * BLOCK_K, n_k, head_d, stride_kb,
                                           stride_kh, stride_kn, stride_mb, stride_mh, stride_mn, HAS_MASK, BLOCK_K,
                                           BLOCK_D)
        q_sum = tl.load(st + 2 * BLOCK_D + offs_d)
        zero = tl.zeros((BLOCK_K, BLOCK_D), tl.float32)
        if KL_KIND == 1:
            dk = zero + (-g * alpha0 * scale) * q_sum[None, :]
        elif KL_KIND == 3:
            dk = zero + (2.0 * g * kl_scale * scale) * tl.load(st + 3 * BLOCK_D + offs_d)[None, :]
        else:
            log_pi = _prior_logits(k, W1, B1, W2, B2, h, s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h, head_d, d_mid,
                                   ACT, BLOCK_D) - tl.load(scalars + 3)
            pi = tl.where(exists if SCOPE_ALL else visible, tl.exp(log_pi), 0.0)
            qk = tl.sum(k * q_sum[None, :], 1)
            s0 = tl.load(scalars + 5)
            if KL_KIND == 2:
                log_a = tl.where(visible, log_pi + log_beta, 0.0)
                a = tl.where(visible, tl.exp(tl.maximum(log_a, log_tiny)), 0.0)
                d_a = rows * (_digamma(tl.where(visible, a, 1.0)) + c_w) - scale * qk + tl.load(scalars + 4)
                d_pi = tl.where(visible & (log_a >= log_tiny), g * beta * d_a, 0.0)
                d_r = pi * (d_pi - g * s0)
                dk = zero + (-g * scale) * a[:, None] * q_sum[None, :]
            else:
                t = tl.where(visible, log_pi, 0.0)
                d_t = tl.where(visible, g * kl_scale * (2.0 * rows * t - 2.0 * scale * qk
                                                         - 2.0 * tl.load(scalars + 6)), 0.0)
                d_r = d_t - pi * (g * s0)
                dk = (g * kl_scale * scale) * (2.0 * tl.load(st + 3 * BLOCK_D + offs_d)[None, :]
                                               - 2.0 * t[:, None] * q_sum[None, :])
            dk = tl.where(visible[:, None], dk, 0.0)  # the closed form's own terms; the prior's follow
            d_r = tl.where(exists, d_r, 0.0)
            for j in range(d_mid):  # the network's backward pass, one hidden unit at a time
                w, pre = _hidden_unit(k, W1, B1, h, j, s1h, s1i, s1j, sb1h, sb1j, head_d, BLOCK_D)
                d_pre = d_r * tl.load(W2 + h * s2h + j * s2j).to(tl.float32) * _activation_grad(pre, ACT)
                dk += d_pre[:, None] * w[None, :]
                tl.atomic_add(DW1 + h * s1h + offs_d * s1i + j * s1j, tl.sum(k * d_pre[:, None], 0),
                              mask=offs_d < head_d, sem="relaxed")
                tl.atomic_add(DB1 + h * sb1h + j * sb1j, tl.sum(d_pre), sem="relaxed")
                tl.atomic_add(DW2 + h * s2h + j * s2j, tl.sum(d_r * _activation(pre, ACT)), sem="relaxed")
            tl.atomic_add(DB2 + h * sb2h, tl.sum(d_r), sem="relaxed")
        if not PRIOR:
            dk = tl.where(visible[:, None], dk, 0.0)
        tl.store(DK + bh * n_k * head_d + offs_k[:, None] * head_d + offs_d[None, :], dk.to(DK.dtype.element_ty),
                 mask=exists[:, None] & (offs_d[None, :] < head_d))


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


def _blocks(n_q: int, n_k: int, head_d: int) -> dict:
    """Blocks of queries and keys of 2048 float32 values (no spilled register on an A100 at head size 64)."""
    rows = max(16, min(64, 2048 // block_d(head_d)))
    return dict(BLOCK_R=min(rows, max(16, triton.next_power_of_2(n_q))),
                BLOCK_K=min(rows, max(16, triton.next_power_of_2(n_k))))


def kl_forward(q: Tensor, k: Tensor, key_mask: Optional[Tensor], stats: Tensor, kl: Tensor, prior: list,
               kl_kind: int, kl_constants: list, scope_all: bool, activation: int, scale: float) -> None:
    """Write the (batch, head) sums into ``stats`` (:func:`stats_size` floats, zeroed, whose first rows hold the
    attention's ``LSE_i`` and ``S2_i``) and the layer's KL into ``kl`` (a float32 scalar)."""
    from .dense_bam import _mask_args, _strides
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    beta, log_beta, log_tiny, alpha0, c_w, kl_scale, offset, const = kl_constants
    w1, b1, w2, b2, *prior_strides = _prior_args(prior)
    d_mid = 0 if w1 is None else b1.shape[-1]
    mask_args = _mask_args(q, key_mask)
    weights = (w1, b1, w2, b2) if w1 is not None else (q,) * 4
    launch("dense_bam", _kl_forward, (B * H,), q, k, mask_args[0], stats, kl, *weights, *_strides(q), *_strides(k), *mask_args[1:], *prior_strides,
           H, n_q, n_k, d, d_mid, scale, beta, log_beta, log_tiny, alpha0, c_w, kl_scale, offset, const,
           KL_KIND=kl_kind, HAS_MASK=key_mask is not None, SCOPE_ALL=scope_all, ACT=activation,
           BLOCK_D=block_d(d), **_blocks(n_q, n_k, d))


def kl_backward(q: Tensor, k: Tensor, key_mask: Optional[Tensor], out: Tensor, d_out: Tensor, stats: Tensor,
                d_stats: Optional[Tensor], d_kl: Optional[Tensor], grads: Tensor, dq: Tensor, dk: Tensor,
                prior: list, d_prior: list, kl_kind: int, kl_constants: list, scope_all: bool, activation: int,
                scale: float) -> None:
    """Fill ``grads [4, B*H, Q]`` and start the float32 ``dq [B*H, Q, d]``; with a KL (``kl_kind``, ``d_kl``) also
    write the KL's ``dk [B*H, K, d]`` and add the prior's gradients to the zeroed float32 ``d_prior``."""
    from .dense_bam import _mask_args, _strides
    B, H, n_q, d = q.shape
    n_k, dv = k.shape[2], out.shape[3]
    beta, log_beta, log_tiny, alpha0, c_w, kl_scale, offset, _ = kl_constants
    w1, b1, w2, b2, *prior_strides = _prior_args(prior)
    d_mid = 0 if w1 is None else b1.shape[-1]
    blocks = _blocks(n_q, n_k, d)
    kind = kl_kind if d_kl is not None else KL_NONE
    key_blocks = triton.cdiv(n_k, blocks["BLOCK_K"]) if kind != KL_NONE else 0
    mask_args = _mask_args(q, key_mask)
    tensors = (w1, b1, w2, b2, *d_prior) if w1 is not None else (q,) * 8
    launch("dense_bam", _kl_backward, (triton.cdiv(n_q, blocks["BLOCK_R"]) + key_blocks, B * H), q, k, mask_args[0],
           out, d_out, stats, q if d_stats is None else d_stats, q if d_kl is None else d_kl, grads, dq, dk, *tensors,
           *_strides(q), *_strides(k), *mask_args[1:], *_strides(out), *_strides(d_out), *prior_strides,
           H, n_q, n_k, d, dv, d_mid, scale, beta, log_beta, log_tiny, alpha0, c_w, kl_scale, offset,
           KL_KIND=kind, HAS_MASK=key_mask is not None, SCOPE_ALL=scope_all, ACT=activation,
           HAS_D_ROWS=d_stats is not None, BLOCK_D=block_d(d), BLOCK_DV=max(16, triton.next_power_of_2(dv)), **blocks)
