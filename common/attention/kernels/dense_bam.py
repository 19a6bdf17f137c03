"""Flash-style Triton kernels for dense BAM attention (see :mod:`common.attention.dense_bam`).

One program handles a block of queries of one (batch, head) and streams over blocks of keys
with an online softmax, as FlashAttention does, so the ``[queries x keys]`` matrix never
exists. The BAM noise and the dropout mask are drawn inside the kernel from Philox4x32-10
(``tl.philox``), one call per entry with the counter ``(key, query, batch*head)`` and the call's
seed: the same entry always gets the same draws whatever the tiling, so the backward kernels
draw them again instead of storing them. The seed is a device tensor the kernels read, so a
call reads nothing back to the host and a CUDA graph's replays draw fresh noise.

Outputs of the forward kernel: the attention output, each query's log-normaliser of the
noisy scores (for the backward pass) and the row statistics of the KL
(:mod:`common.attention.bam_stats`): ``LSE_i`` of the clean scores and ``S2_i = sum_j s_ij^2``.
The backward pass is two kernels, one over key blocks (``dk``, ``dv``) and one over query
blocks (``dq``), with ``dS = P (dP - D) + dLSE p + 2 dS2 s`` and ``D_i = dO_i . O_i``.
Offsets are int64 (``bh * n_q * d`` passes 2^31 at L = 16384 with 1024 batch*heads); all the
arithmetic is float32 whatever the input dtype; :func:`tiles` picks the tiles per dtype and head size.

:func:`standard_noise` writes the noise and the dropout scale the kernels use for given
sizes and seeds, so tests can hand the same noise to the materialised path.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import int_key, launch, precompile

NOISE_NONE, NOISE_WEIBULL, NOISE_LOGNORMAL = 0, 1, 2


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    """``a @ b`` accumulated in float32 with the given input precision (``ieee``, ``tf32x3``, ``tf32``)."""
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _box_muller(u1, u2):
    """A standard normal ``sqrt(-2 log u1) cos(2 pi u2)`` from two uniforms in [0, 1) (``u1`` clamped at
    1e-7, as ``tl.randn``). The cosine is a polynomial, not libdevice's ``cosf``, whose reduction of large
    arguments keeps a 32-byte array on the stack: with ``a = |u2 - 1/2|`` and ``b = min(a, 1/2 - a)``,
    ``cos(2 pi u2) = -cos(2 pi a) = sign * cos(2 pi b)`` with ``2 pi b`` in [0, pi/2], where the Taylor
    series to the 12th power is within 7e-9."""
    a = tl.abs(u2 - 0.5)
    x = 6.283185307179586 * tl.minimum(a, 0.5 - a)
    x2 = x * x
    cos = 1.0 + x2 * (-1 / 2 + x2 * (1 / 24 + x2 * (-1 / 720 + x2 * (1 / 40320 + x2 * (-1 / 3628800
                                                                                    + x2 / 479001600)))))
    return tl.sqrt(-2.0 * tl.log(tl.maximum(u1, 1.0e-7))) * tl.where(a > 0.25, cos, -cos)


@triton.jit
def _draws(seed, bh, offs_m, offs_n, drop_p, NOISE: tl.constexpr, DROPOUT: tl.constexpr):
    """The standard log-noise (``log(-log u)`` for Weibull, ``N(0, 1)`` for Lognormal, 0 for none) and the
    dropout scale (``[u >= p] / (1 - p)``, or 1) of a tile, from one Philox4x32-10 call per entry whose
    counter is (key, query, batch*head, 0): no product of the indices, so nothing wraps at any length."""
    zero = tl.zeros([offs_m.shape[0], offs_n.shape[0]], tl.uint32)
    key = offs_n[None, :].to(tl.uint32) + zero
    query = offs_m[:, None].to(tl.uint32) + zero
    w0, w1, w2, _ = tl.philox(seed, key, query, (bh.to(tl.uint32) + zero), zero)
    noise = tl.zeros([offs_m.shape[0], offs_n.shape[0]], tl.float32)
    if NOISE == 1:
        u = tl.random.uint_to_uniform_float(w0)
        u = tl.minimum(tl.maximum(u, 1.1754943508222875e-38), 1.0 - 1.1920928955078125e-07)
        noise = tl.log(-tl.log(u))
    elif NOISE == 2:
        noise = _box_muller(tl.random.uint_to_uniform_float(w0), tl.random.uint_to_uniform_float(w1))
    keep = tl.full([offs_m.shape[0], offs_n.shape[0]], 1.0, tl.float32)
    if DROPOUT:
        keep = tl.where(tl.random.uint_to_uniform_float(w2) >= drop_p, 1.0 / (1.0 - drop_p), 0.0)
    return noise, keep


@triton.jit
def _tile(q, k_ptr, km_ptr, seed, bh, offs_m, offs_n, offs_d, n_q, n_k, d, noise_scale, drop_p,
          HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
          PRECISION: tl.constexpr):
    """Clean scores ``s`` (-inf where hidden), noisy scores ``z``, visibility and dropout scale of one tile."""
    k = tl.load(k_ptr + offs_n[None, :] * d + offs_d[:, None],
                mask=(offs_n[None, :] < n_k) & (offs_d[:, None] < d), other=0.0)
    s = _dot(q, k.to(q.dtype), PRECISION)
    valid = (offs_n[None, :] < n_k) & (offs_m[:, None] < n_q)
    if HAS_MASK:
        km = tl.load(km_ptr + offs_n, mask=offs_n < n_k, other=0)
        valid = valid & (km[None, :] != 0)
    if CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None])
    s = tl.where(valid, s, float("-inf"))
    z = s
    keep = tl.full(s.shape, 1.0, tl.float32)
    if NOISE != 0 or DROPOUT:
        noise, keep = _draws(seed, bh, offs_m, offs_n, drop_p, NOISE, DROPOUT)
        if NOISE != 0:
            z = s + noise_scale * noise
    return s, z, valid, keep


@triton.jit
def _forward(q_ptr, k_ptr, v_ptr, km_ptr, out_ptr, norm_ptr, lse_ptr, sq_ptr, seed_ptr,
             n_q, n_k, d, dv, scale, noise_scale, drop_p,
             HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
             WANT_LSE: tl.constexpr, WANT_SQ: tl.constexpr, PRECISION: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # int64: bh * n_q * d passes 2^31
    seed = tl.load(seed_ptr)
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
    end = n_k
    if CAUSAL:  # the keys after the block's last query are hidden from all its queries
        end = tl.minimum(n_k, (pid_m + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        s, z, valid, keep = _tile(q, k_base, km_base, seed, bh, offs_m, offs_n, offs_d, n_q, n_k, d,
                                  noise_scale, drop_p, HAS_MASK, CAUSAL, NOISE, DROPOUT, PRECISION)
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
        acc = acc * alpha[:, None] + _dot((p * keep).to(v.dtype), v, PRECISION)
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
def _grad_scores(q, k_base, v_base, km_base, do, norm, delta, d_lse, lse, d_sq, seed, bh,
                 offs_m, offs_n, offs_d, offs_dv, n_q, n_k, d, dv, noise_scale, drop_p,
                 HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
                 WANT_LSE: tl.constexpr, WANT_SQ: tl.constexpr, PRECISION: tl.constexpr):
    """``(dS, P * keep)`` of one tile: the score gradient and the dropped weights."""
    s, z, valid, keep = _tile(q, k_base, km_base, seed, bh, offs_m, offs_n, offs_d, n_q, n_k, d,
                              noise_scale, drop_p, HAS_MASK, CAUSAL, NOISE, DROPOUT, PRECISION)
    p = tl.exp(z - norm[:, None])  # 0 where hidden (z = -inf)
    v = tl.load(v_base + offs_n[:, None] * dv + offs_dv[None, :],
                mask=(offs_n[:, None] < n_k) & (offs_dv[None, :] < dv), other=0.0)
    dp = _dot(do, tl.trans(v.to(do.dtype)), PRECISION) * keep
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
                 dk_ptr, dv_ptr, seed_ptr, n_q, n_k, d, dv, scale, noise_scale, drop_p,
                 HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
                 WANT_LSE: tl.constexpr, WANT_SQ: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_n, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    seed = tl.load(seed_ptr)
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
        ds, pk = _grad_scores(q, k_base, v_base, km_base, do, norm, delta, d_lse, lse, d_sq, seed, bh,
                              offs_m, offs_n, offs_d, offs_dv, n_q, n_k, d, dv, noise_scale, drop_p,
                              HAS_MASK, CAUSAL, NOISE, DROPOUT, WANT_LSE, WANT_SQ, PRECISION)
        dvv += _dot(tl.trans(pk).to(do.dtype), do, PRECISION)
        dk += _dot(tl.trans(ds).to(q.dtype), q, PRECISION)
    col_ok = offs_n < n_k
    tl.store(dk_ptr + bh * n_k * d + offs_n[:, None] * d + offs_d[None, :], dk.to(dk_ptr.dtype.element_ty),
             mask=col_ok[:, None] & (offs_d[None, :] < d))
    tl.store(dv_ptr + bh * n_k * dv + offs_n[:, None] * dv + offs_dv[None, :], dvv.to(dv_ptr.dtype.element_ty),
             mask=col_ok[:, None] & (offs_dv[None, :] < dv))


@triton.jit
def _backward_q(q_ptr, k_ptr, v_ptr, km_ptr, do_ptr, norm_ptr, delta_ptr, dlse_ptr, lse_ptr, dsq_ptr, dq_ptr,
                seed_ptr, n_q, n_k, d, dv, scale, noise_scale, drop_p,
                HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, NOISE: tl.constexpr, DROPOUT: tl.constexpr,
                WANT_LSE: tl.constexpr, WANT_SQ: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    seed = tl.load(seed_ptr)
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
        ds, pk = _grad_scores(q, k_base, v_base, km_base, do, norm, delta, d_lse, lse, d_sq, seed, bh,
                              offs_m, offs_n, offs_d, offs_dv, n_q, n_k, d, dv, noise_scale, drop_p,
                              HAS_MASK, CAUSAL, NOISE, DROPOUT, WANT_LSE, WANT_SQ, PRECISION)
        k = tl.load(k_base + offs_n[:, None] * d + offs_d[None, :],
                    mask=(offs_n[:, None] < n_k) & (offs_d[None, :] < d), other=0.0)
        dq += _dot(ds.to(k.dtype), k, PRECISION)
    tl.store(dq_ptr + bh * n_q * d + offs_m[:, None] * d + offs_d[None, :], (dq * scale).to(dq_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < d))


@triton.jit
def _noise_kernel(noise_ptr, keep_ptr, seed_ptr, n_q, n_k, drop_p, NOISE: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m, pid_n, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    noise, keep = _draws(tl.load(seed_ptr), bh, offs_m, offs_n, drop_p, NOISE, True)
    where = bh * n_q * n_k + offs_m[:, None] * n_k + offs_n[None, :]
    ok = (offs_m[:, None] < n_q) & (offs_n[None, :] < n_k)
    tl.store(noise_ptr + where, noise, mask=ok)
    tl.store(keep_ptr + where, keep, mask=ok)


class Tiles(NamedTuple):
    """The tile and launch options of the three kernels for one dtype and head size."""

    forward: dict
    backward_kv: dict
    backward_q: dict


def tiles(dtype: torch.dtype, d: int, dv: int, interpret: bool) -> Optional[Tiles]:
    """Tiles chosen per dtype, float32 product precision and head size so that every kernel compiles without
    spilling and within the shared memory of an A100 and an H100 (checked by :mod:`common.attention.kernels.aot`),
    or None where no tiling does (heads wider than :data:`MAX_HEAD_DIM`, and float32 heads wider than 64 with
    three-pass products: the chunks take those)."""
    heads = dict(BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_DV=max(16, triton.next_power_of_2(dv)))
    if max(heads.values()) > MAX_HEAD_DIM:
        return None
    if interpret:
        one = dict(BLOCK_M=16, BLOCK_N=16, **heads)
        return Tiles(one, one, one)
    entry = _TILES.get((precision(dtype, interpret), max(heads.values()) > 64))
    if entry is None:
        return None
    return Tiles(*({**dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), t)), "maxnreg": 255, **heads}
                   for t in entry))


#: Widest head the kernels take.
MAX_HEAD_DIM = 128
#: (product precision, head size > 64) -> (BLOCK_M, BLOCK_N, num_warps, num_stages) of the forward, backward
#: dk/dv and backward dq kernels: tiles that compile for sm_80 and sm_90 with no spilled register at every launch
#: of :mod:`~common.attention.kernels.aot`. Every launch asks for up to 255 registers (``maxnreg``): left to
#: itself, ptxas held 8-warp kernels to 128 and spilled. Three-pass float32 products of 128-wide heads hold too
#: much (split operands): no tiling tried, down to 16 x 16, was free of spills at every launch; the chunks take those.
_TILES = {
    ("half", False): ((32, 64, 8, 2), (64, 32, 8, 2), (32, 64, 8, 2)),
    ("half", True): ((32, 64, 8, 2), (32, 32, 8, 2), (32, 64, 8, 2)),
    ("tf32", False): ((32, 64, 8, 2), (32, 32, 8, 2), (32, 64, 8, 2)),
    ("tf32", True): ((32, 32, 8, 2), (16, 32, 8, 2), (16, 64, 8, 2)),
    ("tf32x3", False): ((32, 64, 8, 2), (16, 32, 4, 2), (16, 64, 8, 2)),
}


def precision(dtype: torch.dtype, interpret: bool) -> str:
    """The products' input precision: exact float32 under the interpreter (tests compare to 1e-5); on a GPU,
    float32 inputs take TF32 where ``torch.backends.cuda.matmul.allow_tf32`` allows it (the suite's trainers
    do), else three TF32 passes (float32 accuracy on the tensor cores); half inputs take their own."""
    if dtype != torch.float32:
        return "half"
    if interpret:
        return "ieee"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "tf32x3"


def _flags(q: Tensor, key_mask: Optional[Tensor], causal: bool, noise_kind: int, dropout: float, want_lse: bool,
           want_sq: bool, interpret: bool) -> dict:
    return dict(HAS_MASK=key_mask is not None, CAUSAL=causal, NOISE=noise_kind, DROPOUT=dropout > 0,
                WANT_LSE=want_lse, WANT_SQ=want_sq, PRECISION=_dot_precision(q.dtype, interpret))


def forward(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], seed: Tensor, causal: bool, scale: float,
            noise_kind: int, noise_scale: float, dropout: float, want_lse: bool, want_sq: bool, interpret: bool):
    """``(out, norm, LSE, S2)`` of ``q [BH, Q, d]``, ``k [BH, K, d]``, ``v [BH, K, dv]`` (contiguous) with a key
    mask ``[BH, K]`` (int8, or None): the output, each query's log-normaliser of the noisy scores, and the KL's
    row statistics (zeros where not wanted). ``seed`` is a one-element int64 tensor on the device, read by the
    kernels (no host synchronisation; CUDA graphs replay fresh draws). No autograd: the custom operator
    ``attention_suite::dense_bam`` (:mod:`common.attention.dense_bam`) wraps this and :func:`backward`. The
    backward kernels are compiled and loaded here too, so that one that cannot run fails in the forward."""
    BH, n_q, d = q.shape
    n_k, dv = k.shape[1], v.shape[2]
    out = q.new_empty(BH, n_q, dv)
    norm, lse, sq = (torch.zeros(BH, n_q, device=q.device, dtype=torch.float32) for _ in range(3))
    km = key_mask if key_mask is not None else q.new_zeros(1, dtype=torch.int8)
    tile = tiles(q.dtype, d, dv, interpret)
    flags = _flags(q, key_mask, causal, noise_kind, dropout, want_lse, want_sq, interpret)
    grid = (triton.cdiv(n_q, tile.forward["BLOCK_M"]), BH)
    launch("dense_bam", _forward, grid, q, k, v, km, out, norm, lse, sq, seed, n_q, n_k, d, dv, scale, noise_scale,
           dropout, **flags, **tile.forward)
    key = (q.dtype, tuple(flags.items()), tuple(tuple(t.items()) for t in tile), int_key(n_q, n_k, d, dv))
    common = (seed, n_q, n_k, d, dv, scale, noise_scale, dropout)  # the backward kernels, with stand-ins
    precompile("dense_bam", key, _backward_kv, (1, 1), q, k, v, km, out, norm, norm, lse, lse, sq, k, v,
               *common, **flags, **tile.backward_kv)
    precompile("dense_bam", key, _backward_q, (1, 1), q, k, v, km, out, norm, norm, lse, lse, sq, q,
               *common, **flags, **tile.backward_q)
    return out, norm, lse, sq


def backward(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], seed: Tensor, out: Tensor, norm: Tensor,
             lse: Tensor, d_out: Tensor, d_lse: Tensor, d_sq: Tensor, causal: bool, scale: float, noise_kind: int,
             noise_scale: float, dropout: float, want_lse: bool, want_sq: bool, interpret: bool):
    """``(dq, dk, dv)`` of :func:`forward` for the gradients of its output, LSE and S2 (zeros where unused)."""
    BH, n_q, d = q.shape
    n_k, dv = k.shape[1], v.shape[2]
    km = key_mask if key_mask is not None else q.new_zeros(1, dtype=torch.int8)
    tile = tiles(q.dtype, d, dv, interpret)
    flags = _flags(q, key_mask, causal, noise_kind, dropout, want_lse, want_sq, interpret)
    d_out = d_out.contiguous()
    delta = (d_out.float() * out.float()).sum(-1)  # D_i = dO_i . O_i
    d_lse, d_sq = d_lse.float().contiguous(), d_sq.float().contiguous()
    lse_safe = torch.where(torch.isfinite(lse), lse, 0.0)
    dq, dk, dvv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    common = (seed, n_q, n_k, d, dv, scale, noise_scale, dropout)
    launch("dense_bam", _backward_kv, (triton.cdiv(n_k, tile.backward_kv["BLOCK_N"]), BH),
           q, k, v, km, d_out, norm, delta, d_lse, lse_safe, d_sq, dk, dvv, *common, **flags, **tile.backward_kv)
    launch("dense_bam", _backward_q, (triton.cdiv(n_q, tile.backward_q["BLOCK_M"]), BH),
           q, k, v, km, d_out, norm, delta, d_lse, lse_safe, d_sq, dq, *common, **flags, **tile.backward_q)
    return dq, dk, dvv


def _dot_precision(dtype: torch.dtype, interpret: bool) -> str:
    """``tl.dot``'s ``input_precision`` (half operands ignore it)."""
    kind = precision(dtype, interpret)
    return "tf32" if kind == "half" else kind


def standard_noise(batch_heads: int, n_q: int, n_k: int, noise_kind: int, seed: Tensor, dropout: float, device):
    """The standard log-noise ``[BH, Q, K]`` and dropout scale (``keep / (1 - p)``) the kernels draw."""
    noise = torch.empty(batch_heads, n_q, n_k, device=device, dtype=torch.float32)
    keep = torch.empty_like(noise)
    block = 32
    launch("dense_bam", _noise_kernel, (triton.cdiv(n_q, block), triton.cdiv(n_k, block), batch_heads),
           noise, keep, seed.to(device), n_q, n_k, dropout, NOISE=noise_kind, BLOCK_M=block, BLOCK_N=block)
    return noise, keep


def seed_for_call(device) -> Tensor:
    """A Philox seed drawn on ``device`` from torch's generator (``torch.manual_seed`` repeats a run), as a
    one-element int64 tensor: drawing it reads nothing back to the host."""
    return torch.randint(0, 1 << 31, (1,), device=device, dtype=torch.int64)
