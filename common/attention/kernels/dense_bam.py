"""Flash-style Triton kernels for dense BAM attention (see :mod:`common.attention.dense_bam`).

One program handles a block of queries of one (batch, head) and streams over blocks of keys
with an online softmax, as FlashAttention does, so the ``[queries x keys]`` matrix never
exists. The BAM noise is drawn inside the kernel from Triton's counter-based Philox
generator (``tl.rand`` / ``tl.randn``) keyed by ``(seed + batch*heads index, query * K + key)``:
the same entry always gets the same noise whatever the tiling, so the backward kernels draw
it again instead of storing it. Dropout on the weights uses a second seed the same way.

Outputs of the forward kernel: the attention output, each query's log-normaliser of the
noisy scores (for the backward pass) and the row statistics of the KL
(:mod:`common.attention.bam_stats`): ``LSE_i`` of the clean scores and ``S2_i = sum_j s_ij^2``.
The backward pass is two kernels, one over key blocks (``dk``, ``dv``) and one over query
blocks (``dq``), with ``dS = P (dP - D) + dLSE p + 2 dS2 s`` and ``D_i = dO_i . O_i``.

:func:`standard_noise` writes the noise and the dropout scale the kernels use for given
sizes and seeds, so tests can hand the same noise to the materialised path.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

NOISE_NONE, NOISE_WEIBULL, NOISE_LOGNORMAL = 0, 1, 2


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """``a @ b`` accumulated in float32; exact float32 products when ``IEEE`` (no TF32)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _noise(seed, offsets, NOISE: tl.constexpr):
    """The standard log-noise: ``log(-log u)`` (Weibull) or ``N(0, 1)`` (Lognormal)."""
    if NOISE == 1:
        u = tl.minimum(tl.maximum(tl.rand(seed, offsets), 1.1754943508222875e-38), 1.0 - 1.1920928955078125e-07)
        return tl.log(-tl.log(u))
    else:
        return tl.randn(seed, offsets)


@triton.jit
def _tile(q, k_ptr, km_ptr, seed, drop_seed, bh, offs_m, offs_n, offs_d, n_q, n_k, d, noise_scale, drop_p,
          HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
          IEEE: tl.constexpr):
    """Clean scores ``s`` (-inf where hidden), noisy scores ``z``, visibility and dropout scale of one tile."""
    k = tl.load(k_ptr + offs_n[None, :] * d + offs_d[:, None],
                mask=(offs_n[None, :] < n_k) & (offs_d[:, None] < d), other=0.0)
    s = _dot(q, k.to(q.dtype), IEEE)
    valid = (offs_n[None, :] < n_k) & (offs_m[:, None] < n_q)
    if HAS_MASK:
        km = tl.load(km_ptr + offs_n, mask=offs_n < n_k, other=0)
        valid = valid & (km[None, :] != 0)
    if CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None])
    s = tl.where(valid, s, float("-inf"))
    offsets = offs_m[:, None] * n_k + offs_n[None, :]
    z = s
    if NOISE != 0:
        z = s + noise_scale * _noise(seed + bh, offsets, NOISE)
    keep = tl.where(valid, 1.0, 1.0)
    if DROPOUT:
        keep = tl.where(tl.rand(drop_seed + bh, offsets) >= drop_p, 1.0 / (1.0 - drop_p), 0.0)
    return s, z, valid, keep


@triton.jit
def _forward(q_ptr, k_ptr, v_ptr, km_ptr, out_ptr, norm_ptr, lse_ptr, sq_ptr, seed, drop_seed,
             n_q, n_k, d, dv, scale, noise_scale, drop_p,
             HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
             WANT_LSE: tl.constexpr, WANT_SQ: tl.constexpr, IEEE: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + bh * n_q * d + offs_m[:, None] * d + offs_d[None, :],
                mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < d), other=0.0)
    q = (q.to(tl.float32) * scale).to(q.dtype)
    k_base, v_base, km_base = k_ptr + bh * n_k * d, v_ptr + bh * n_k * dv, km_ptr + bh * n_k
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    m_c = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_c = tl.zeros((BLOCK_M,), tl.float32)
    sq = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    for start in range(0, n_k, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        s, z, valid, keep = _tile(q, k_base, km_base, seed, drop_seed, bh, offs_m, offs_n, offs_d, n_q, n_k, d,
                                  noise_scale, drop_p, HAS_MASK, CAUSAL, NOISE, DROPOUT, IEEE)
        if WANT_LSE:
            m_new = tl.maximum(m_c, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            l_c = l_c * tl.exp(m_c - m_safe) + tl.sum(tl.exp(s - m_safe[:, None]), 1)
            m_c = m_new
        if WANT_SQ:
            sq += tl.sum(tl.where(valid, s * s, 0.0), 1)
        m_new = tl.maximum(m_i, tl.max(z, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(z - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None] * dv + offs_dv[None, :],
                    mask=(offs_n[:, None] < n_k) & (offs_dv[None, :] < dv), other=0.0)
        acc = acc * alpha[:, None] + _dot((p * keep).to(v.dtype), v, IEEE)
        m_i = m_new
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    row_ok = offs_m < n_q
    tl.store(out_ptr + bh * n_q * dv + offs_m[:, None] * dv + offs_dv[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv[None, :] < dv))
    tl.store(norm_ptr + bh * n_q + offs_m, tl.where(l_i > 0, m_safe + tl.log(tl.where(l_i > 0, l_i, 1.0)), 0.0),
             mask=row_ok)
    if WANT_LSE:
        m_safe = tl.where(m_c == float("-inf"), 0.0, m_c)
        lse = tl.where(l_c > 0, m_safe + tl.log(tl.where(l_c > 0, l_c, 1.0)), float("-inf"))
        tl.store(lse_ptr + bh * n_q + offs_m, lse, mask=row_ok)
    if WANT_SQ:
        tl.store(sq_ptr + bh * n_q + offs_m, sq, mask=row_ok)


@triton.jit
def _grad_scores(q, k_base, v_base, km_base, do, norm, delta, d_lse, lse, d_sq, seed, drop_seed, bh,
                 offs_m, offs_n, offs_d, offs_dv, n_q, n_k, d, dv, noise_scale, drop_p,
                 HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
                 WANT_LSE: tl.constexpr, WANT_SQ: tl.constexpr, IEEE: tl.constexpr):
    """``(dS, P * keep)`` of one tile: the score gradient and the dropped weights."""
    s, z, valid, keep = _tile(q, k_base, km_base, seed, drop_seed, bh, offs_m, offs_n, offs_d, n_q, n_k, d,
                              noise_scale, drop_p, HAS_MASK, CAUSAL, NOISE, DROPOUT, IEEE)
    p = tl.exp(z - norm[:, None])  # 0 where hidden (z = -inf)
    v = tl.load(v_base + offs_n[:, None] * dv + offs_dv[None, :],
                mask=(offs_n[:, None] < n_k) & (offs_dv[None, :] < dv), other=0.0)
    dp = _dot(do, tl.trans(v.to(do.dtype)), IEEE) * keep
    ds = p * (dp - delta[:, None])
    if WANT_LSE:
        ds += d_lse[:, None] * tl.exp(s - lse[:, None])
    if WANT_SQ:
        ds += 2.0 * d_sq[:, None] * tl.where(valid, s, 0.0)
    return ds, p * keep


@triton.jit
def _query_rows(q_ptr, do_ptr, norm_ptr, delta_ptr, dlse_ptr, lse_ptr, dsq_ptr, bh, offs_m, offs_d, offs_dv,
                n_q, d, dv, scale):
    """A block of query rows for the backward pass: the scaled queries, the output gradient and
    the per-row statistics saved by the forward (zeros beyond ``n_q``)."""
    row_ok = offs_m < n_q
    q = tl.load(q_ptr + bh * n_q * d + offs_m[:, None] * d + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < d), other=0.0)
    q = (q.to(tl.float32) * scale).to(q.dtype)
    do = tl.load(do_ptr + bh * n_q * dv + offs_m[:, None] * dv + offs_dv[None, :],
                 mask=row_ok[:, None] & (offs_dv[None, :] < dv), other=0.0)
    norm = tl.load(norm_ptr + bh * n_q + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(delta_ptr + bh * n_q + offs_m, mask=row_ok, other=0.0)
    d_lse = tl.load(dlse_ptr + bh * n_q + offs_m, mask=row_ok, other=0.0)
    lse = tl.load(lse_ptr + bh * n_q + offs_m, mask=row_ok, other=0.0)
    d_sq = tl.load(dsq_ptr + bh * n_q + offs_m, mask=row_ok, other=0.0)
    return q, do, norm, delta, d_lse, lse, d_sq


@triton.jit
def _backward_kv(q_ptr, k_ptr, v_ptr, km_ptr, do_ptr, norm_ptr, delta_ptr, dlse_ptr, lse_ptr, dsq_ptr,
                 dk_ptr, dv_ptr, seed, drop_seed, n_q, n_k, d, dv, scale, noise_scale, drop_p,
                 HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
                 WANT_LSE: tl.constexpr, WANT_SQ: tl.constexpr, IEEE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k_base, v_base, km_base = k_ptr + bh * n_k * d, v_ptr + bh * n_k * dv, km_ptr + bh * n_k
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dvv = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)
    start_m = 0
    if CAUSAL:
        start_m = (pid_n * BLOCK_N) // BLOCK_M * BLOCK_M
    for start in range(start_m, n_q, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        q, do, norm, delta, d_lse, lse, d_sq = _query_rows(q_ptr, do_ptr, norm_ptr, delta_ptr, dlse_ptr, lse_ptr,
                                                           dsq_ptr, bh, offs_m, offs_d, offs_dv, n_q, d, dv, scale)
        ds, pk = _grad_scores(q, k_base, v_base, km_base, do, norm, delta, d_lse, lse, d_sq, seed, drop_seed, bh,
                              offs_m, offs_n, offs_d, offs_dv, n_q, n_k, d, dv, noise_scale, drop_p,
                              HAS_MASK, CAUSAL, NOISE, DROPOUT, WANT_LSE, WANT_SQ, IEEE)
        dvv += _dot(tl.trans(pk).to(do.dtype), do, IEEE)
        dk += _dot(tl.trans(ds).to(q.dtype), q, IEEE)
    col_ok = offs_n < n_k
    tl.store(dk_ptr + bh * n_k * d + offs_n[:, None] * d + offs_d[None, :], dk.to(dk_ptr.dtype.element_ty),
             mask=col_ok[:, None] & (offs_d[None, :] < d))
    tl.store(dv_ptr + bh * n_k * dv + offs_n[:, None] * dv + offs_dv[None, :], dvv.to(dv_ptr.dtype.element_ty),
             mask=col_ok[:, None] & (offs_dv[None, :] < dv))


@triton.jit
def _backward_q(q_ptr, k_ptr, v_ptr, km_ptr, do_ptr, norm_ptr, delta_ptr, dlse_ptr, lse_ptr, dsq_ptr, dq_ptr,
                seed, drop_seed, n_q, n_k, d, dv, scale, noise_scale, drop_p,
                HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
                WANT_LSE: tl.constexpr, WANT_SQ: tl.constexpr, IEEE: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < n_q
    q, do, norm, delta, d_lse, lse, d_sq = _query_rows(q_ptr, do_ptr, norm_ptr, delta_ptr, dlse_ptr, lse_ptr, dsq_ptr,
                                                       bh, offs_m, offs_d, offs_dv, n_q, d, dv, scale)
    k_base, v_base, km_base = k_ptr + bh * n_k * d, v_ptr + bh * n_k * dv, km_ptr + bh * n_k
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    end = n_k
    if CAUSAL:
        end = tl.minimum(n_k, (pid_m + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        ds, pk = _grad_scores(q, k_base, v_base, km_base, do, norm, delta, d_lse, lse, d_sq, seed, drop_seed, bh,
                              offs_m, offs_n, offs_d, offs_dv, n_q, n_k, d, dv, noise_scale, drop_p,
                              HAS_MASK, CAUSAL, NOISE, DROPOUT, WANT_LSE, WANT_SQ, IEEE)
        k = tl.load(k_base + offs_n[:, None] * d + offs_d[None, :],
                    mask=(offs_n[:, None] < n_k) & (offs_d[None, :] < d), other=0.0)
        dq += _dot(ds.to(k.dtype), k, IEEE)
    tl.store(dq_ptr + bh * n_q * d + offs_m[:, None] * d + offs_d[None, :], (dq * scale).to(dq_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < d))


@triton.jit
def _noise_kernel(noise_ptr, keep_ptr, seed, drop_seed, n_q, n_k, drop_p, NOISE: tl.constexpr,
                  BLOCK: tl.constexpr):
    bh, pid = tl.program_id(1), tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offsets < n_q * n_k
    tl.store(noise_ptr + bh * n_q * n_k + offsets, _noise(seed + bh, offsets, NOISE), mask=ok)
    keep = tl.where(tl.rand(drop_seed + bh, offsets) >= drop_p, 1.0 / (1.0 - drop_p), 0.0)
    tl.store(keep_ptr + bh * n_q * n_k + offsets, keep, mask=ok)


def _blocks(d: int, dv: int, interpret: bool):
    block = 16 if interpret else 64
    return dict(BLOCK_M=block, BLOCK_N=block, BLOCK_D=max(16, triton.next_power_of_2(d)),
                BLOCK_DV=max(16, triton.next_power_of_2(dv)))


class TritonNoisyAttention(torch.autograd.Function):
    """The Triton counterpart of ``_ChunkedNoisyAttention``: ``(out, LSE, S2)`` of ``q [BH, Q, d]``,
    ``k [BH, K, d]``, ``v [BH, K, dv]`` (contiguous) with a key mask ``[BH, K]`` (int8, or None)."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, causal, scale, noise_kind, noise_scale, dropout, seeds,
                want_lse, want_sq, interpret):
        BH, n_q, d = q.shape
        n_k, dv = k.shape[1], v.shape[2]
        out = q.new_empty(BH, n_q, dv)
        stats = torch.zeros(3, BH, n_q, device=q.device, dtype=torch.float32)
        norm, lse, sq = stats[0], stats[1], stats[2]
        km = key_mask if key_mask is not None else q.new_zeros(1, dtype=torch.int8)
        blocks = _blocks(d, dv, interpret)
        flags = dict(HAS_MASK=key_mask is not None, CAUSAL=causal, NOISE=noise_kind, DROPOUT=dropout > 0,
                     WANT_LSE=want_lse, WANT_SQ=want_sq, IEEE=q.dtype == torch.float32)
        grid = (triton.cdiv(n_q, blocks["BLOCK_M"]), BH)
        _forward[grid](q, k, v, km, out, norm, lse, sq, seeds[0], seeds[1], n_q, n_k, d, dv, scale, noise_scale,
                       dropout, **flags, **blocks)
        ctx.save_for_backward(q, k, v, km, out, norm, lse)
        ctx.args = (scale, noise_scale, dropout, seeds, flags, blocks)
        return out, lse, sq

    @staticmethod
    def backward(ctx, d_out, d_lse, d_sq):
        q, k, v, km, out, norm, lse = ctx.saved_tensors
        scale, noise_scale, dropout, seeds, flags, blocks = ctx.args
        BH, n_q, d = q.shape
        n_k, dv = k.shape[1], v.shape[2]
        d_out = d_out.contiguous()
        delta = (d_out.float() * out.float()).sum(-1)  # D_i = dO_i . O_i
        zeros = torch.zeros_like(lse)
        d_lse = zeros if d_lse is None else d_lse.float().contiguous()
        d_sq = zeros if d_sq is None else d_sq.float().contiguous()
        lse_safe = torch.where(torch.isfinite(lse), lse, 0.0)
        dq, dk, dvv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        common = (seeds[0], seeds[1], n_q, n_k, d, dv, scale, noise_scale, dropout)
        _backward_kv[(triton.cdiv(n_k, blocks["BLOCK_N"]), BH)](
            q, k, v, km, d_out, norm, delta, d_lse, lse_safe, d_sq, dk, dvv, *common, **flags, **blocks)
        _backward_q[(triton.cdiv(n_q, blocks["BLOCK_M"]), BH)](
            q, k, v, km, d_out, norm, delta, d_lse, lse_safe, d_sq, dq, *common, **flags, **blocks)
        return dq, dk, dvv, *([None] * 10)


def standard_noise(batch_heads: int, n_q: int, n_k: int, noise_kind: int, seeds, dropout: float, device):
    """The standard log-noise ``[BH, Q, K]`` and dropout scale (``keep / (1 - p)``) the kernels draw."""
    noise = torch.empty(batch_heads, n_q, n_k, device=device, dtype=torch.float32)
    keep = torch.empty_like(noise)
    block = 1024
    _noise_kernel[(triton.cdiv(n_q * n_k, block), batch_heads)](noise, keep, seeds[0], seeds[1], n_q, n_k,
                                                                 dropout, NOISE=noise_kind, BLOCK=block)
    return noise, keep


def seeds_for_call() -> tuple[int, int]:
    """Two Philox seeds (noise, dropout) from torch's default generator, so ``torch.manual_seed`` repeats a run."""
    a, b = torch.randint(0, 1 << 31, (2,)).tolist()
    return int(a), int(b)


