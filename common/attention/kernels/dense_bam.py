r"""Flash-attention kernels for dense BAM attention (see :mod:`common.attention.dense_bam`).

BAM's sample ``W = softmax(s + c n)`` (Fan et al., 2020, Sec. 3.2, in log space; ``n = log(-log u)``
for the Weibull posterior with ``c = 1/k``, ``n ~ N(0, 1)`` for the Lognormal with ``c = sigma``) is
attention with an additive random bias, so the kernels are FlashAttention-2's with the noise added
to each score tile:

* :func:`_forward`: one program per 128 queries (warps along the queries) streams over the keys
  with an online softmax in base 2 and writes the output and, per query, the noisy scores'
  log-normaliser (for the backward pass) and the KL's row statistics (the clean scores'
  ``LSE_i`` and ``S2_i = sum_j s_ij^2``, :mod:`common.attention.bam_stats`). Where the noise is
  bounded enough (:func:`shared_max`) the clean and noisy softmaxes share one running maximum.
* :func:`_backward`: one program per block of keys streams over the queries and computes the
  transposed score tile ``S^T = K Q^T`` once per step: ``dV``, ``dK`` stay in registers, ``dQ``
  is added to a float32 buffer with atomics (FlashAttention-2's scheme), so the noise is drawn
  once in the backward pass; ``dS = P (dP - D) + dLSE p + 2 dS2 s`` with ``D_i = dO_i . O_i``.

Noise: Philox4x32-7 (Random123's seven-round Philox, which passes BigCrush; FlashAttention's dropout
uses the same) keyed by the call's seed, a device tensor the kernels read (no host read; a CUDA
graph's replays draw fresh noise). One call at counter ``(k', q', batch*head, stream)`` feeds four
entries, ``(q + 8a, k + 8b)`` for ``a, b in {0, 1}`` with ``q' = 8 floor(q / 16) + q mod 8`` (and
``k'`` alike): those four lie in one thread's registers in the tensor cores' accumulator layout
whichever of queries and keys are the rows, so the forward and the transposed backward tiles draw
the same words for the same entry with no data movement, and the draws do not depend on the tiling.
Each 32-bit word gives a uniform ``u = (m + 1/2) 2^-23`` from its high 23 bits (never 0 or 1); the
Weibull log-noise is ``log2(-log2 u)``, which is ``(log(-log u) - log log 2) / log 2``: the offset
cancels in the softmax and ``log2 e`` is the base change, so the law is unchanged. The Lognormal
noise takes Box-Muller pairs, ``sqrt(-2 log u0) (cos, sin)(2 pi u1 - pi)`` from two words, two entries.
Dropout (``u >= p``) takes a second stream of 32-bit words. On a GPU ``log2``, ``sin`` and ``cos``
are the special-function unit's approximations (``lg2.approx``: relative error below 2^-22).

Arithmetic is float32 whatever the input dtype; products use the tensor cores with float32
accumulation (``tl.dot``); offsets are int64. :func:`tiles` picks tiles per dtype and head size.
:func:`standard_noise` writes the noise and dropout scale the kernels use, so tests can hand the
same draws to the materialised path.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from . import launch
from .dense_bam_kl import (KL_NONE, LOGNORMAL, QUERY_TICKET, kl_args, kl_gradient_scale, kl_key_gradients,
                           kl_query_term, kl_sums, per_head)

NOISE_NONE, NOISE_WEIBULL, NOISE_LOGNORMAL = 0, 1, 2
LOG2E = 1.4426950408889634
#: Philox stream of the dropout draws (the noise is stream 0).
_DROPOUT_STREAM = 1


# ------------------------------------------------------------------------------ random numbers ----
@triton.jit
def _pair_columns(x0, x1, R: tl.constexpr, C: tl.constexpr):
    """``[R, C]`` tiles -> ``[R, 2C]``: column ``16h + 8b + j`` is ``x_b[:, 8h + j]``."""
    x = tl.reshape(tl.join(x0, x1), (R, C // 8, 8, 2))
    return tl.reshape(tl.permute(x, (0, 1, 3, 2)), (R, 2 * C))


@triton.jit
def _pair_rows(x0, x1, R: tl.constexpr, C: tl.constexpr):
    """``[R, C]`` tiles -> ``[2R, C]``: row ``16g + 8a + i`` is ``x_a[8g + i, :]``."""
    x = tl.reshape(tl.join(x0, x1), (R // 8, 8, C, 2))
    return tl.reshape(tl.permute(x, (0, 3, 1, 2)), (2 * R, C))


@triton.jit
def _tile_of_four(x00, x01, x10, x11, ROWS_ARE_QUERIES: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """The ``[R, C]`` tile of the four ``[R/2, C/2]`` tiles ``x_ab`` (``a``: query half, ``b``: key half)."""
    if ROWS_ARE_QUERIES:
        return _pair_rows(_pair_columns(x00, x01, R // 2, C // 2), _pair_columns(x10, x11, R // 2, C // 2), R // 2, C)
    else:
        return _pair_rows(_pair_columns(x00, x10, R // 2, C // 2), _pair_columns(x01, x11, R // 2, C // 2), R // 2, C)


@triton.jit
def _philox(seed, bh, row0, col0, stream, ROWS_ARE_QUERIES: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """The four ``[R/2, C/2]`` word tiles of the Philox4x32-7 calls of the tile at ``(row0, col0)`` (multiples
    of 16), in the order ``x00, x01, x10, x11`` of :func:`_tile_of_four`. The same words either way: the forward's
    tiles take whole 64-bit products (:func:`_philox4x32_7`, about 3 instructions fewer per entry), the transposed
    tiles of the backward, whose registers are scarcer (register pairs made it spill), ``tl.philox``'s halves."""
    rows = (row0 // 2 + tl.arange(0, R // 2)).to(tl.uint32)
    cols = (col0 // 2 + tl.arange(0, C // 2)).to(tl.uint32)
    zero = tl.zeros([R // 2, C // 2], tl.uint32)
    if ROWS_ARE_QUERIES:
        keys, queries = cols[None, :] + zero, rows[:, None] + zero
    else:
        keys, queries = rows[:, None] + zero, cols[None, :] + zero
    if ROWS_ARE_QUERIES:
        return _philox4x32_7(keys, queries, bh.to(tl.uint32) + zero, stream + zero, seed)
    else:
        return tl.philox(seed, keys, queries, bh.to(tl.uint32) + zero, stream + zero, 7)


@triton.jit
def _philox4x32_7(c0, c1, c2, c3, seed):
    """Random123's Philox4x32 with seven rounds (``tl.philox(seed, c0, c1, c2, c3, 7)``'s words), each round's two
    32 x 32 -> 64-bit products taken whole (one ``IMAD.WIDE`` each instead of a high and a low half)."""
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    for _ in tl.static_range(7):
        p0 = c0.to(tl.uint64) * 0xD2511F53
        p2 = c2.to(tl.uint64) * 0xCD9E8D57
        c0, c1, c2, c3 = ((p2 >> 32).to(tl.uint32) ^ c1 ^ k0, p2.to(tl.uint32), (p0 >> 32).to(tl.uint32) ^ c3 ^ k1,
                          p0.to(tl.uint32))
        k0 = tl.add(k0, 0x9E3779B9, sanitize_overflow=False)
        k1 = tl.add(k1, 0xBB67AE85, sanitize_overflow=False)
    return c0, c1, c2, c3


@triton.jit
def _uniform(w):
    """``(m + 1/2) 2^-23`` in (0, 1) from the 23 high bits ``m`` of ``w``."""
    return (w >> 9 | 0x3F800000).to(tl.float32, bitcast=True) - (1.0 - 2.0 ** -24)


@triton.jit
def _log2(x, FAST: tl.constexpr):
    if FAST:
        return libdevice.fast_log2f(x)
    else:
        return tl.log2(x)


@triton.jit
def _weibull(w, FAST: tl.constexpr):
    """``log2(-log2 u)``: the Weibull log-noise in base 2, up to a constant."""
    return _log2(-_log2(_uniform(w), FAST), FAST)


@triton.jit
def _box_muller(w0, w1, FAST: tl.constexpr):
    """Two standard normals ``r cos(t)``, ``r sin(t)``, ``r = sqrt(-2 log u0)``, ``t = 2 pi u1 - pi`` (uniform on
    ``[-pi, pi)``, where the special-function unit's sine and cosine are most accurate)."""
    radius = tl.sqrt(-2.0 * 0.6931471805599453 * _log2(_uniform(w0), FAST))
    angle = 6.283185307179586 * _uniform(w1) - 3.141592653589793
    if FAST:
        return radius * libdevice.fast_cosf(angle), radius * libdevice.fast_sinf(angle)
    else:
        return radius * tl.cos(angle), radius * tl.sin(angle)


@triton.jit
def _noise(seed, bh, row0, col0, ROWS_ARE_QUERIES: tl.constexpr, R: tl.constexpr, C: tl.constexpr,
           NOISE: tl.constexpr, FAST: tl.constexpr):
    """The standard log-noise of a tile in base 2: ``log2(-log2 u)`` (Weibull) or ``log2(e) eps`` (Lognormal)."""
    w00, w01, w10, w11 = _philox(seed, bh, row0, col0, 0, ROWS_ARE_QUERIES, R, C)
    if NOISE == 1:
        n00, n01, n10, n11 = _weibull(w00, FAST), _weibull(w01, FAST), _weibull(w10, FAST), _weibull(w11, FAST)
    else:
        n00, n01 = _box_muller(w00, w01, FAST)
        n10, n11 = _box_muller(w10, w11, FAST)
        n00, n01, n10, n11 = n00 * 1.4426950408889634, n01 * 1.4426950408889634, n10 * 1.4426950408889634, \
            n11 * 1.4426950408889634
    return _tile_of_four(n00, n01, n10, n11, ROWS_ARE_QUERIES, R, C)


@triton.jit
def _kept(seed, bh, row0, col0, threshold, ROWS_ARE_QUERIES: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """Dropout's keep mask of a tile: a 32-bit word ``>= threshold = round(p 2^32)``."""
    w00, w01, w10, w11 = _philox(seed, bh, row0, col0, 1, ROWS_ARE_QUERIES, R, C)
    return _tile_of_four(w00, w01, w10, w11, ROWS_ARE_QUERIES, R, C) >= threshold.to(tl.uint32)


# ------------------------------------------------------------------------------------ forward ----
@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, FAST: tl.constexpr):
    """``a @ b`` accumulated in float32 (``PRECISION``: ``ieee``, ``tf32x3`` or ``tf32`` for float32 inputs). Triton's
    interpreter (``FAST`` off) multiplies bfloat16 operands wrongly: there they are float32 first (a product of
    two bfloat16 numbers is exact in float32, so only the order of the sums differs from the tensor cores)."""
    if FAST:
        return tl.dot(a, b, input_precision=PRECISION)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def _key_bias(mask_base, offs_n, n_k, stride_mn, HAS_MASK: tl.constexpr):
    """0 for the visible keys of a block, ``-inf`` for hidden ones and those past ``n_k``."""
    visible = offs_n < n_k
    if HAS_MASK:
        visible = visible & (tl.load(mask_base + offs_n * stride_mn, mask=offs_n < n_k, other=0) != 0)
    return tl.where(visible, 0.0, float("-inf"))


@triton.jit
def _forward_block(acc, m_n, l_n, m_c, l_c, sq, q, k_base, v_base, mask_base, seed, bh, row0, start, offs_m, offs_d,
                   offs_dv, n_k, head_d, head_dv, stride_kn, stride_vn, stride_mn, qk_scale, noise_scale, threshold,
                   HAS_MASK: tl.constexpr, DIAGONAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
                   WANT_LSE: tl.constexpr, WANT_SQ: tl.constexpr, SHARED_MAX: tl.constexpr, FAST: tl.constexpr,
                   PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key block of the online softmaxes (noisy ``m_n, l_n``, clean ``m_c, l_c``, base 2)."""
    offs_n = start + tl.arange(0, BLOCK_N)
    k_t = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None],
                  mask=(offs_n[None, :] < n_k) & (offs_d[:, None] < head_d), other=0.0)
    s = _dot(q, k_t, PRECISION, FAST)
    s2 = s * qk_scale + _key_bias(mask_base, offs_n, n_k, stride_mn, HAS_MASK)[None, :]
    if DIAGONAL:
        s2 = tl.where(offs_n[None, :] <= offs_m[:, None], s2, float("-inf"))
    z2 = s2
    if NOISE != 0:
        z2 = s2 + noise_scale * _noise(seed, bh, row0, start, True, BLOCK_M, BLOCK_N, NOISE, FAST)
    if WANT_LSE and SHARED_MAX:  # one running maximum, of the clean scores, for both softmaxes
        m_new = tl.maximum(m_n, tl.max(s2, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_n - m_safe)
        l_c = l_c * alpha + tl.sum(tl.exp2(s2 - m_safe[:, None]), 1)
        m_c = m_new
    else:
        if WANT_LSE:
            mc_new = tl.maximum(m_c, tl.max(s2, 1))
            mc_safe = tl.where(mc_new == float("-inf"), 0.0, mc_new)
            l_c = l_c * tl.exp2(m_c - mc_safe) + tl.sum(tl.exp2(s2 - mc_safe[:, None]), 1)
            m_c = mc_new
        m_new = tl.maximum(m_n, tl.max(z2, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_n - m_safe)
    p = tl.exp2(z2 - m_safe[:, None])
    l_n = l_n * alpha + tl.sum(p, 1)
    if DROPOUT:
        p = tl.where(_kept(seed, bh, row0, start, threshold, True, BLOCK_M, BLOCK_N), p, 0.0)
    v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_dv[None, :],
                mask=(offs_n[:, None] < n_k) & (offs_dv[None, :] < head_dv), other=0.0)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, FAST)
    if WANT_SQ:
        sq += tl.sum(tl.where(s2 > float("-inf"), s * s, 0.0), 1)
    return acc, m_new, l_n, m_c, l_c, sq


@triton.jit
def _forward(Q, K, V, MASK, OUT, STATS, SEED, KL,
             stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
             stride_ob, stride_oh, stride_om, stride_mb, stride_mh, stride_mn,
             H, n_q, n_k, head_d, head_dv, sm_scale, qk_scale, noise_scale, threshold, keep_scale,
             W1, B1, W2, B2, s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h, d_mid,
             beta, log_beta, log_tiny, alpha0, c_w, kl_scale, offset, const,
             HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
             WANT_LSE: tl.constexpr, WANT_SQ: tl.constexpr, SHARED_MAX: tl.constexpr, FAST: tl.constexpr,
             PRECISION: tl.constexpr, KL_KIND: tl.constexpr, SCOPE_ALL: tl.constexpr, ACT: tl.constexpr,
             KL_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_DV: tl.constexpr):
    """``OUT = dropout(softmax(s + c n)) V`` for one block of queries, and the rows of ``STATS``: the noisy
    log2-normaliser, ``LSE_i`` of the clean scores (natural log) and ``S2_i``. With a KL (``KL_KIND``), the program
    that finishes a (batch, head)'s last block of queries adds its KL sums (:func:`~.dense_bam_kl.kl_sums`)."""
    pid_m, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    BH = tl.num_programs(1)
    b, h = bh // H, bh % H
    seed = tl.load(SEED)
    row0 = pid_m * BLOCK_M
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < head_d), other=0.0)
    k_base, v_base = K + b * stride_kb + h * stride_kh, V + b * stride_vb + h * stride_vh
    mask_base = MASK + b * stride_mb + h * stride_mh
    m_n = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    m_c = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_n, l_c, sq = tl.zeros((BLOCK_M,), tl.float32), tl.zeros((BLOCK_M,), tl.float32), tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    diagonal = n_k  # keys [0, diagonal) are visible to every query of the block
    if CAUSAL:
        diagonal = tl.minimum(n_k, row0)
    for start in range(0, diagonal, BLOCK_N):
        acc, m_n, l_n, m_c, l_c, sq = _forward_block(
            acc, m_n, l_n, m_c, l_c, sq, q, k_base, v_base, mask_base, seed, bh, row0, start, offs_m, offs_d,
            offs_dv, n_k, head_d, head_dv, stride_kn, stride_vn, stride_mn, qk_scale, noise_scale, threshold,
            HAS_MASK, False, NOISE, DROPOUT, WANT_LSE, WANT_SQ, SHARED_MAX, FAST, PRECISION, BLOCK_M, BLOCK_N)
    if CAUSAL:
        for start in range(diagonal, tl.minimum(n_k, row0 + BLOCK_M), BLOCK_N):
            acc, m_n, l_n, m_c, l_c, sq = _forward_block(
                acc, m_n, l_n, m_c, l_c, sq, q, k_base, v_base, mask_base, seed, bh, row0, start, offs_m, offs_d,
                offs_dv, n_k, head_d, head_dv, stride_kn, stride_vn, stride_mn, qk_scale, noise_scale, threshold,
                HAS_MASK, True, NOISE, DROPOUT, WANT_LSE, WANT_SQ, SHARED_MAX, FAST, PRECISION, BLOCK_M, BLOCK_N)
    row_ok = offs_m < n_q
    l_safe = tl.where(l_n > 0, l_n, 1.0)
    out = acc * (keep_scale / l_safe)[:, None]
    tl.store(OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_dv[None, :],
             out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & (offs_dv[None, :] < head_dv))
    rows = STATS + bh * n_q + offs_m
    stat = BH * n_q  # the stride between the row statistics
    tl.store(rows, tl.where(l_n > 0, tl.where(m_n == float("-inf"), 0.0, m_n) + tl.log2(l_safe), 0.0), mask=row_ok)
    if WANT_LSE:
        lse = (tl.where(m_c == float("-inf"), 0.0, m_c) + tl.log2(tl.where(l_c > 0, l_c, 1.0))) * 0.6931471805599453
        tl.store(rows + stat, tl.where(l_c > 0, lse, float("-inf")), mask=row_ok)
    if WANT_SQ:
        tl.store(rows + 2 * stat, sq * sm_scale * sm_scale, mask=row_ok)
    if KL_KIND != 0:
        tl.debug_barrier()  # this block's rows are written
        ticket = per_head(STATS, BH, n_q, bh, BLOCK_D) + 4 * BLOCK_D + QUERY_TICKET
        if tl.atomic_add(ticket, 1.0, sem="acq_rel") == tl.num_programs(0) - 1:
            kl_sums(Q, K, MASK, STATS, KL, W1, B1, W2, B2, b, h, bh, BH, stride_qb, stride_qh, stride_qm, stride_kb,
                    stride_kh, stride_kn, stride_mb, stride_mh, stride_mn, s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h,
                    n_q, n_k, head_d, d_mid, sm_scale, beta, log_beta, log_tiny, alpha0, c_w, kl_scale, offset, const,
                    KL_KIND, HAS_MASK, SCOPE_ALL, ACT, KL_BLOCK, BLOCK_D)


# ----------------------------------------------------------------------------------- backward ----
@triton.jit
def _backward_block(dk, dv, k, v, key_bias, q_base, do_base, o_base, dq_base, STATS, D_STATS, seed, bh, key0,
                    start_m, offs_n, offs_d, offs_dv, n_q, head_d, head_dv, stride_qm, stride_dom, stride_om, stat,
                    sm_scale, qk_scale, noise_scale, threshold, keep_scale, g, kl_scale,
                    DIAGONAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr, WANT_LSE: tl.constexpr,
                    WANT_SQ: tl.constexpr, HAS_D_ROWS: tl.constexpr, KL_KIND: tl.constexpr, FAST: tl.constexpr,
                    PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One block of queries against the program's keys, on transposed tiles ``[keys, queries]``: ``dV``, ``dK``
    and the block's share of ``dQ`` (added atomically)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    row_ok = offs_m < n_q
    q_t = tl.load(q_base + offs_m[None, :] * stride_qm + offs_d[:, None],
                  mask=row_ok[None, :] & (offs_d[:, None] < head_d), other=0.0)
    s_t = _dot(k, q_t, PRECISION, FAST)
    s2_t = s_t * qk_scale + key_bias[:, None]
    if DIAGONAL:
        s2_t = tl.where(offs_n[:, None] <= offs_m[None, :], s2_t, float("-inf"))
    z2_t = s2_t
    if NOISE != 0:
        z2_t = s2_t + noise_scale * _noise(seed, bh, key0, start_m, False, BLOCK_N, BLOCK_M, NOISE, FAST)
    rows = bh * n_q + offs_m
    p_t = tl.exp2(z2_t - tl.load(STATS + rows, mask=row_ok, other=float("inf"))[None, :])
    do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_dv[None, :],
                 mask=row_ok[:, None] & (offs_dv[None, :] < head_dv), other=0.0)
    o = tl.load(o_base + offs_m[:, None] * stride_om + offs_dv[None, :],
                mask=row_ok[:, None] & (offs_dv[None, :] < head_dv), other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # D_i = dO_i . O_i
    dp_t = _dot(v, tl.trans(do), PRECISION, FAST)
    kept = p_t
    if DROPOUT:
        keep = _kept(seed, bh, key0, start_m, threshold, False, BLOCK_N, BLOCK_M)
        kept = tl.where(keep, p_t, 0.0)
        dp_t = tl.where(keep, dp_t * keep_scale, 0.0)
    dv += _dot(kept.to(do.dtype), do, PRECISION, FAST)
    ds_t = p_t * (dp_t - delta[None, :])
    if WANT_LSE:  # d LSE_i / d s_ij = exp(s_ij - LSE_i): the KL's (from its row) and any other
        lse = tl.load(STATS + stat + rows, mask=row_ok, other=float("-inf"))
        d_lse = tl.zeros((BLOCK_M,), tl.float32)
        if KL_KIND != 0:
            d_lse += g * tl.load(STATS + 3 * stat + rows, mask=row_ok, other=0.0)
        if HAS_D_ROWS:
            d_lse += tl.load(D_STATS + stat + rows, mask=row_ok, other=0.0)
        lse2 = tl.where(lse > float("-inf"), lse * 1.4426950408889634, float("inf"))
        ds_t += d_lse[None, :] * tl.exp2(s2_t - lse2[None, :])
    if WANT_SQ:  # d S2_i / d s_ij = 2 s_ij, with s_ij = s2_ij log(2) on visible entries
        d_sq = tl.zeros((BLOCK_M,), tl.float32)
        if KL_KIND != 0:
            d_sq += g * kl_scale
        if HAS_D_ROWS:
            d_sq += tl.load(D_STATS + 2 * stat + rows, mask=row_ok, other=0.0)
        ds_t += (2.0 * 0.6931471805599453) * d_sq[None, :] * tl.where(s2_t > float("-inf"), s2_t, 0.0)
    q = tl.trans(q_t)
    dk += _dot(ds_t.to(q.dtype), q, PRECISION, FAST)
    dq = _dot(tl.trans(ds_t).to(k.dtype), k, PRECISION, FAST)
    tl.atomic_add(dq_base + offs_m[:, None] * head_d + offs_d[None, :], dq * sm_scale,
                  mask=row_ok[:, None] & (offs_d[None, :] < head_d), sem="relaxed")
    return dk, dv


@triton.jit
def _backward(Q, K, V, MASK, OUT, DO, STATS, D_STATS, D_KL, DQ, DQ_OUT, DK, DV, SEED, DW1, DB1, DW2, DB2,
              stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
              stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom, stride_mb, stride_mh, stride_mn,
              H, n_q, n_k, head_d, head_dv, sm_scale, qk_scale, noise_scale, threshold, keep_scale,
              W1, B1, W2, B2, s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h, d_mid,
              beta, log_beta, log_tiny, alpha0, c_w, kl_scale, offset, const,
              HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
              WANT_LSE: tl.constexpr, WANT_SQ: tl.constexpr, HAS_D_ROWS: tl.constexpr, CONVERT_DQ: tl.constexpr,
              FAST: tl.constexpr, PRECISION: tl.constexpr, KL_KIND: tl.constexpr, SCOPE_ALL: tl.constexpr,
              ACT: tl.constexpr, KL_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The whole backward pass for one block of keys: ``dK``, ``dV``, the block's share of ``dQ`` (added to the
    zeroed float32 ``DQ [BH, n_q, head_d]``), the KL's gradients (:mod:`.dense_bam_kl`; the first block of keys adds
    its direct share of ``dQ``), and, with ``CONVERT_DQ``, the last block of a (batch, head) to finish writes its
    ``dQ`` to ``DQ_OUT`` in the inputs' dtype (the tickets are ``DQ``'s last ``BH`` floats). ``D_i = dO_i . O_i`` is
    computed in the loop."""
    pid_n, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    BH = tl.num_programs(1)
    b, h = bh // H, bh % H
    seed = tl.load(SEED)
    key0 = pid_n * BLOCK_N
    offs_n = key0 + tl.arange(0, BLOCK_N)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    col_ok = offs_n < n_k
    k = tl.load(K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=col_ok[:, None] & (offs_d[None, :] < head_d), other=0.0)
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_dv[None, :],
                mask=col_ok[:, None] & (offs_dv[None, :] < head_dv), other=0.0)
    mask_base = MASK + b * stride_mb + h * stride_mh
    key_bias = _key_bias(mask_base, offs_n, n_k, stride_mn, HAS_MASK)
    q_base, do_base = Q + b * stride_qb + h * stride_qh, DO + b * stride_dob + h * stride_doh
    o_base, dq_base = OUT + b * stride_ob + h * stride_oh, DQ + bh * n_q * head_d
    stat = BH * n_q
    st = per_head(STATS, BH, n_q, bh, BLOCK_D)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    g, n = 0.0, 0.0
    if KL_KIND != 0:  # the KL's share of dK starts the accumulator (scaled back at the end)
        g, n = kl_gradient_scale(STATS, D_KL, BH, n_q, bh, BLOCK_D)
        visible = key_bias == 0
        dk = kl_key_gradients(k.to(tl.float32), col_ok, visible, g, n, st, h, n_q, head_d, d_mid, W1, B1, W2, B2, DW1,
                              DB1, DW2, DB2, s1h, s1i, s1j, sb1h, sb1j, s2h, s2j, sb2h, sm_scale, beta, log_beta,
                              log_tiny, alpha0, c_w, kl_scale, KL_KIND, SCOPE_ALL, ACT, BLOCK_D) / sm_scale
    dv = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)
    start = 0
    if CAUSAL:  # queries before key0 see none of these keys; up to `full` some of them
        start = key0 // BLOCK_M * BLOCK_M
        full = tl.minimum(tl.cdiv(key0 + BLOCK_N, BLOCK_M) * BLOCK_M, tl.cdiv(n_q, BLOCK_M) * BLOCK_M)
        for start_m in range(start, full, BLOCK_M):
            dk, dv = _backward_block(
                dk, dv, k, v, key_bias, q_base, do_base, o_base, dq_base, STATS, D_STATS, seed, bh, key0, start_m,
                offs_n, offs_d, offs_dv, n_q, head_d, head_dv, stride_qm, stride_dom, stride_om, stat, sm_scale,
                qk_scale, noise_scale, threshold, keep_scale, g, kl_scale, True, NOISE, DROPOUT,
                WANT_LSE, WANT_SQ, HAS_D_ROWS, KL_KIND, FAST, PRECISION, BLOCK_D, BLOCK_M, BLOCK_N)
        start = full
    for start_m in range(start, n_q, BLOCK_M):
        dk, dv = _backward_block(
            dk, dv, k, v, key_bias, q_base, do_base, o_base, dq_base, STATS, D_STATS, seed, bh, key0, start_m,
            offs_n, offs_d, offs_dv, n_q, head_d, head_dv, stride_qm, stride_dom, stride_om, stat, sm_scale,
            qk_scale, noise_scale, threshold, keep_scale, g, kl_scale, False, NOISE, DROPOUT,
            WANT_LSE, WANT_SQ, HAS_D_ROWS, KL_KIND, FAST, PRECISION, BLOCK_D, BLOCK_M, BLOCK_N)
    tl.store(DK + bh * n_k * head_d + offs_n[:, None] * head_d + offs_d[None, :], (dk * sm_scale).to(
        DK.dtype.element_ty), mask=col_ok[:, None] & (offs_d[None, :] < head_d))
    tl.store(DV + bh * n_k * head_dv + offs_n[:, None] * head_dv + offs_dv[None, :], (dv * keep_scale).to(
        DV.dtype.element_ty), mask=col_ok[:, None] & (offs_dv[None, :] < head_dv))
    if KL_KIND != 0:
        if pid_n == 0:  # the KL's direct share of dQ, once per query
            for start_m in range(0, n_q, KL_BLOCK):
                offs_r = start_m + tl.arange(0, KL_BLOCK)
                lse = tl.load(STATS + stat + bh * n_q + offs_r, mask=offs_r < n_q, other=float("-inf"))
                tl.atomic_add(dq_base + offs_r[:, None] * head_d + offs_d[None, :],
                              kl_query_term(lse, g, n, st, sm_scale, alpha0, kl_scale, offset, KL_KIND, BLOCK_D),
                              mask=(offs_r[:, None] < n_q) & (offs_d[None, :] < head_d), sem="relaxed")
    if CONVERT_DQ:
        tl.debug_barrier()  # every dQ addition of the program is issued
        tickets = DQ + BH * n_q * head_d
        if tl.atomic_add(tickets + bh, 1.0, sem="acq_rel") == tl.num_programs(0) - 1:
            for start_m in range(0, n_q, KL_BLOCK):
                offs_r = start_m + tl.arange(0, KL_BLOCK)
                where = offs_r[:, None] * head_d + offs_d[None, :]
                ok = (offs_r[:, None] < n_q) & (offs_d[None, :] < head_d)
                tl.store(DQ_OUT + bh * n_q * head_d + where,
                         tl.load(dq_base + where, mask=ok, other=0.0, cache_modifier=".cg").to(
                             DQ_OUT.dtype.element_ty), mask=ok)


@triton.jit
def _noise_kernel(NOISE_OUT, KEEP_OUT, SEED, n_q, n_k, threshold, keep_scale, NOISE: tl.constexpr,
                  ROWS_ARE_QUERIES: tl.constexpr, FAST: tl.constexpr, BLOCK: tl.constexpr):
    """The natural-log noise and dropout scale the kernels draw, written ``[BH, n_q, n_k]`` from tiles whose rows
    are the queries or (``ROWS_ARE_QUERIES=False``, as the backward pass draws them) the keys."""
    pid_r, pid_c, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    seed = tl.load(SEED)
    offs_r = pid_r * BLOCK + tl.arange(0, BLOCK)
    offs_c = pid_c * BLOCK + tl.arange(0, BLOCK)
    noise = _noise(seed, bh, pid_r * BLOCK, pid_c * BLOCK, ROWS_ARE_QUERIES, BLOCK, BLOCK, NOISE, FAST)
    if NOISE == 1:  # log(-log u) = log(2) log2(-log2 u) + log(log 2)
        noise = noise * 0.6931471805599453 - 0.36651292058166435
    else:
        noise = noise * 0.6931471805599453
    keep = tl.where(_kept(seed, bh, pid_r * BLOCK, pid_c * BLOCK, threshold, ROWS_ARE_QUERIES, BLOCK, BLOCK),
                    keep_scale, 0.0)
    if ROWS_ARE_QUERIES:
        where = bh * n_q * n_k + offs_r[:, None] * n_k + offs_c[None, :]
        ok = (offs_r[:, None] < n_q) & (offs_c[None, :] < n_k)
    else:
        where = bh * n_q * n_k + offs_c[None, :] * n_k + offs_r[:, None]
        ok = (offs_c[None, :] < n_q) & (offs_r[:, None] < n_k)
    tl.store(NOISE_OUT + where, noise, mask=ok)
    tl.store(KEEP_OUT + where, keep, mask=ok)


# ------------------------------------------------------------------------------------ launchers ----
class Tiles(NamedTuple):
    """The launch options of the forward and backward kernels for one dtype and head size."""

    forward: dict
    backward: dict


#: Widest head the kernels take.
MAX_HEAD_DIM = 128
#: (Hopper or later, product precision, head size > 64) -> (BLOCK_M, BLOCK_N, num_warps, num_stages) of the forward
#: kernel (queries x keys), of the backward kernel (queries per step x keys per program), and of the backward kernel
#: with Lognormal noise (Box-Muller pairs hold more registers); every launch asks for up to 255 registers
#: (``maxnreg``). The largest tiles free of spills at every launch of :mod:`common.attention.kernels.aot` (its
#: cases' variants and lengths, sm_80 and sm_90). float32 with TF32 products has no tiles for heads wider than 64:
#: the only spill-free backward tile, 16 x 16 with 4 warps, gave wrong dQ, dK and dV on an H200 (Triton 3.6; 16 x 32
#: and 32 x 16 were wrong too, 16 x 64 right but spilling), so those calls take the chunked path.
_TILES = {
    (True, "half", False): ((128, 64, 8, 2), (32, 128, 8, 2), (32, 128, 8, 2)),
    (True, "half", True): ((128, 64, 8, 2), (16, 128, 8, 2), (16, 32, 4, 2)),
    (True, "tf32", False): ((128, 32, 8, 2), (32, 128, 8, 2), (16, 128, 8, 2)),
    (False, "half", False): ((128, 64, 8, 2), (16, 128, 8, 2), (16, 128, 8, 2)),
    (False, "half", True): ((128, 32, 8, 2), (16, 64, 8, 2), (16, 64, 8, 2)),
    (False, "tf32", False): ((128, 32, 8, 2), (16, 128, 8, 2), (16, 128, 8, 2)),
}


def precision(dtype: torch.dtype, interpret: bool) -> str:
    """The products' input precision: exact float32 under the interpreter (tests compare to 1e-5); on a GPU,
    float32 inputs take TF32 where ``torch.backends.cuda.matmul.allow_tf32`` allows it (the suite's trainers
    do), else three TF32 passes (float32 accuracy: the kernels have no tiles for it, the chunks take those
    calls); half inputs take their own."""
    if dtype != torch.float32:
        return "half"
    if interpret:
        return "ieee"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "tf32x3"


def takes(dtype: torch.dtype, d: int, dv: int, interpret: bool) -> bool:
    """Whether the kernels take this dtype, float32 product precision and head size (:func:`tiles` is not None),
    whatever the GPU: no heads wider than :data:`MAX_HEAD_DIM`, no float32 without TF32 (three-pass products:
    the backward kernel spills at every tile tried on an H100, down to 16 x 16), no float32 with TF32 for heads
    wider than 64 (see :data:`_TILES`)."""
    return interpret or (max(d, dv) <= MAX_HEAD_DIM and (True, precision(dtype, interpret), max(
        16, triton.next_power_of_2(d), triton.next_power_of_2(dv)) > 64) in _TILES)


def tiles(dtype: torch.dtype, d: int, dv: int, interpret: bool, lognormal: bool = False) -> Optional[Tiles]:
    """The tiles for this dtype, float32 product precision, head size, noise and the target GPU
    (:func:`~common.attention.kernels.target_arch`), or None where :func:`takes` says no."""
    heads = dict(BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_DV=max(16, triton.next_power_of_2(dv)))
    if not takes(dtype, d, dv, interpret):
        return None
    if interpret:
        return Tiles(dict(BLOCK_M=32, BLOCK_N=16, **heads), dict(BLOCK_M=16, BLOCK_N=32, **heads))
    from . import target_arch
    forward, backward, backward_lognormal = _TILES[(target_arch() >= 90, precision(dtype, interpret),
                                                     max(heads.values()) > 64)]
    return Tiles(*({**dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), t)), "maxnreg": 255, **heads}
                   for t in (forward, backward_lognormal if lognormal else backward)))


def shared_max(noise_kind: int, noise_scale: float) -> bool:
    """Whether the noisy softmax may share the clean one's running maximum: the base-2 noise of an entry is
    ``c log2(-log2 u)`` in ``[-23.5 c, 4.6 c]`` (Weibull, ``u`` in ``[2^-24, 1 - 2^-24]``) or ``c log2(e) eps``
    with ``|eps| <= 5.8`` (Lognormal), so the noisy weights relative to the clean maximum stay within
    ``2^(+-100)`` when ``c`` is below these bounds: no overflow, and the row's largest clean entry keeps the
    noisy sum a normal float."""
    if noise_kind == NOISE_WEIBULL:
        return noise_scale * 23.5 <= 100
    return noise_kind == NOISE_NONE or noise_scale * LOG2E * 5.8 <= 100


def dropout_threshold(p: float) -> tuple[int, float]:
    """``(round(p 2^32), 1 / (1 - p))``: an entry is kept when its 32-bit word is at least the threshold."""
    return min(int(round(p * 2.0 ** 32)), 2 ** 32 - 1), (1.0 / (1.0 - p) if p < 1 else 0.0)


class Call(NamedTuple):
    """The options of one BAM attention call (the scalar arguments of ``attention_suite::bam_attention``)."""

    causal: bool
    scale: float
    noise_kind: int
    noise_scale: float
    dropout: float
    kl_kind: int  # :mod:`.dense_bam_kl`'s KL_*: the KL the kernels compute (0: none)
    kl_constants: list  # :func:`.dense_bam_kl.constants`
    scope_all: bool  # the contextual prior is normalised over every key
    activation: int  # the prior network's (:data:`.dense_bam_kl.ACTIVATIONS`)
    want_lse: bool  # the rows' LSE_i for a KL computed outside (and their gradient)
    want_sq: bool  # the rows' S2_i likewise


def _flags(q: Tensor, key_mask: Optional[Tensor], call: Call, kl_kind: int, want_lse: bool, want_sq: bool,
           interpret: bool) -> dict:
    kind = precision(q.dtype, interpret)
    return dict(HAS_MASK=key_mask is not None, CAUSAL=call.causal,
                NOISE=call.noise_kind if call.noise_scale else NOISE_NONE, DROPOUT=call.dropout > 0,
                WANT_LSE=want_lse or kl_kind != KL_NONE, WANT_SQ=want_sq or kl_kind in LOGNORMAL, FAST=not interpret,
                PRECISION="tf32" if kind == "half" else kind, KL_KIND=kl_kind)


def _mask_args(q: Tensor, key_mask: Optional[Tensor]) -> tuple:
    """The key mask (broadcastable to ``[B, H, 1, K]``, read where it is) and its batch, head and key strides, 0 on
    broadcast dimensions (a dummy without a mask)."""
    if key_mask is None:
        return (q,) + (0, 0, 0)
    pad = 4 - key_mask.dim()
    shape, strides = (1,) * pad + tuple(key_mask.shape), (0,) * pad + tuple(key_mask.stride())
    return (key_mask,) + tuple(0 if shape[i] == 1 else strides[i] for i in (0, 1, 3))


def _strides(x: Tensor) -> tuple:
    return x.stride(0), x.stride(1), x.stride(2)


def forward(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], seed: Tensor, prior: list, call: Call,
            interpret: bool, out: Tensor, stats: Tensor, kl: Tensor) -> None:
    """Fill ``out [B, H, Q, dv]``, the zeroed float32 ``stats`` (:func:`.dense_bam_kl.stats_size`) and, with a KL,
    ``kl`` (a float32 scalar) for ``q [B, H, Q, d]``, ``k [B, H, K, d]``, ``v [B, H, K, dv]`` (last dimension
    contiguous), a boolean key mask broadcastable to ``[B, H, 1, K]`` (or None), a one-element int64 ``seed`` on the
    device and the prior network's ``(W1, b1, w2, b2)`` (or ``[]``)."""
    B, H, n_q, d = q.shape
    n_k, dv = k.shape[2], v.shape[3]
    threshold, keep_scale = dropout_threshold(call.dropout)
    mask_args = _mask_args(q, key_mask)
    kl_values, kl_flags = kl_args(prior, call.kl_kind, call.kl_constants, call.scope_all, call.activation, d, q)
    flags = _flags(q, key_mask, call, call.kl_kind, call.want_lse, call.want_sq, interpret)
    tile = tiles(q.dtype, d, dv, interpret).forward
    launch("dense_bam", _forward, (triton.cdiv(n_q, tile["BLOCK_M"]), B * H), q, k, v, mask_args[0], out, stats, seed,
           kl, *_strides(q), *_strides(k), *_strides(v), *_strides(out), *mask_args[1:], H, n_q, n_k, d, dv,
           call.scale, call.scale * LOG2E, float(call.noise_scale), threshold, keep_scale, *kl_values,
           SHARED_MAX=shared_max(call.noise_kind, call.noise_scale), **{**kl_flags, **flags}, **tile)


def backward(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], seed: Tensor, prior: list, call: Call,
             interpret: bool, out: Tensor, stats: Tensor, d_out: Tensor, d_stats: Optional[Tensor],
             d_kl: Optional[Tensor], dq: Tensor, dq_out: Tensor, dk: Tensor, dv: Tensor, d_prior: list) -> None:
    """The gradients of :func:`forward` for ``d_out``, ``d_kl`` (or None) and ``d_stats`` (the rows' ``LSE_i`` and
    ``S2_i``; or None): ``dq`` is float32 and zeroed (``[B, H, Q, d]``, and when ``dq_out`` is another tensor, the
    dtype's, ``B * H`` more floats of tickets), ``dk``, ``dv`` contiguous, ``d_prior`` zeroed float32 like the prior's
    tensors (the KL's gradients are added when ``d_kl`` is given)."""
    B, H, n_q, d = q.shape
    n_k, dv_size = k.shape[2], v.shape[3]
    threshold, keep_scale = dropout_threshold(call.dropout)
    mask_args = _mask_args(q, key_mask)
    kl_kind = call.kl_kind if d_kl is not None else KL_NONE
    kl_values, kl_flags = kl_args(prior, kl_kind, call.kl_constants, call.scope_all, call.activation, d, q)
    has_rows = d_stats is not None
    flags = _flags(q, key_mask, call, kl_kind, call.want_lse and has_rows, call.want_sq and has_rows, interpret)
    grads = d_prior if d_prior else (q,) * 4
    lognormal = call.noise_kind == NOISE_LOGNORMAL and call.noise_scale > 0
    tile = tiles(q.dtype, d, dv_size, interpret, lognormal).backward
    launch("dense_bam", _backward, (triton.cdiv(n_k, tile["BLOCK_N"]), B * H), q, k, v, mask_args[0], out, d_out,
           stats, d_stats if has_rows else stats, d_kl if d_kl is not None else stats, dq, dq_out, dk, dv, seed, *grads,
           *_strides(q), *_strides(k), *_strides(v), *_strides(out), *_strides(d_out), *mask_args[1:], H, n_q, n_k,
           d, dv_size, call.scale, call.scale * LOG2E, float(call.noise_scale), threshold, keep_scale, *kl_values,
           HAS_D_ROWS=has_rows, CONVERT_DQ=dq_out is not dq, **{**kl_flags, **flags}, **tile)


def standard_noise(batch_heads: int, n_q: int, n_k: int, noise_kind: int, seed: Tensor, dropout: float, device,
                   rows_are_queries: bool = True):
    """The standard log-noise ``[BH, Q, K]`` (``log(-log u)`` or ``eps``) and dropout scale (``keep / (1 - p)``)
    the kernels draw for ``seed``, from tiles laid out as the forward (``rows_are_queries``) or backward pass."""
    noise = torch.empty(batch_heads, n_q, n_k, device=device, dtype=torch.float32)
    keep = torch.empty_like(noise)
    block = 128  # few programs: the interpreter's cost is per program
    threshold, keep_scale = dropout_threshold(dropout)
    rows, cols = (n_q, n_k) if rows_are_queries else (n_k, n_q)
    from . import interpreting
    launch("dense_bam", _noise_kernel, (triton.cdiv(rows, block), triton.cdiv(cols, block), batch_heads),
           noise, keep, seed.to(device), n_q, n_k, threshold, keep_scale, NOISE=noise_kind,
           ROWS_ARE_QUERIES=rows_are_queries, FAST=not interpreting(), BLOCK=block)
    return noise, keep


def seed_for_call(device) -> Tensor:
    """A Philox seed drawn on ``device`` from torch's generator (``torch.manual_seed`` repeats a run), as a
    one-element int64 tensor: drawing it reads nothing back to the host."""
    return torch.randint(0, 1 << 62, (1,), device=device, dtype=torch.int64)


