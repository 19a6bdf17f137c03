"""Dense BAM attention without the ``[queries x keys]`` weight matrix.

The BAM sample is ``W = softmax(s + noise)`` (Fan et al., 2020, Sec. 3.2, in log space; see
:mod:`common.attention.bam`), so ``W v`` is attention with an additive random bias. This
module computes it chunk by chunk (a few heads, or one head's query rows), as a flash-attention
kernel does over tiles, skipping the keys after a chunk's last visible one (key padding):
a chunk's scores, noise, weights and gradients exist only while that chunk is
processed, the backward pass recomputes them (it draws the same noise again), and the
memory kept between the passes is ``O(L)``: ``q, k, v``, the output and two numbers per
query. The KL comes from per-query statistics (:mod:`common.attention.bam_stats`).

The noise of a chunk comes from generators seeded with ``(seed, chunk)`` (:class:`_Stream`:
numpy's PCG64 for the uniforms on CPU, torch's for the normals), the seed drawn from torch's
default generator at each call, so ``torch.manual_seed`` makes runs repeatable. Dropout on
the weights (``Attend``'s ``dropout``) draws its mask from the same stream. ``noise=`` takes an explicit standard log-noise tensor instead (tests compare
the chunked path with the materialised one under the same noise).

Where :func:`~common.attention.kernels.use_triton` says so (CUDA tensors), the Triton kernels
of :mod:`common.attention.kernels.dense_bam` do the same work in one flash-style pass, with
the noise drawn in the kernel from a counter-based generator.

:class:`~common.attention.blocks.Attend` calls :func:`fused_bam` first and takes this path
whenever nothing needs the weight matrix (see :func:`fused_bam` for the conditions); set
``ATTN_FUSED_BAM=0`` to force the materialised path.
"""
from __future__ import annotations

import math
import os
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from .aux import add_aux_loss, collecting
from .bam import BAM
from .bam_stats import dense_kl, needs_square_sums, supports
from .functional import log_weibull_
from .kernels import use_triton

#: Score entries per chunk: 4 MiB of float32, which stays in the cache while a chunk's
#: elementwise passes run over it and still makes batched matrix products of whole heads.
CHUNK_ELEMENTS = 1 << 20
#: The forward pass keeps the chunks' scores and weights for the backward pass while both
#: together take at most this many bytes (short sequences); longer ones recompute them.
KEEP_BYTES = 256 << 20
_SEED_STRIDE = 0x9E3779B97F4A7C15


class Sampler:
    """The random part of one call: log-noise (``posterior``, ``noise_scale``, 0 for none),
    dropout probability, the call's seed, or an explicit standard log-noise tensor ``[G, Q, K]``."""

    def __init__(self, posterior: str, noise_scale: float, dropout: float, seed: int,
                 noise: Optional[Tensor] = None):
        self.posterior, self.noise_scale, self.dropout = posterior, noise_scale, dropout
        self.seed, self.noise = seed, noise

    def draws(self, like: Tensor, chunk: int, where: tuple):
        """The chunk's standard log-noise (or None; scale it by ``noise_scale``) and dropout
        scale (``keep / (1 - p)``, or None); ``where`` indexes the chunk in the explicit noise."""
        stream = _Stream((self.seed + chunk * _SEED_STRIDE) % (1 << 63))
        noise = None
        if self.noise_scale:
            if self.noise is not None:
                noise = self.noise[where].to(like.dtype, copy=True)
            elif self.posterior == "weibull":
                noise = log_weibull_(stream.uniform(like), 1.0)
            else:
                noise = stream.normal(like)
        keep = None
        if self.dropout:
            keep = (stream.uniform(like) >= self.dropout).to(like.dtype).div_(1 - self.dropout)
        return noise, keep


class _Stream:
    """The random numbers of one chunk, from generators seeded with ``seed``. On CPU the uniforms
    come from numpy's PCG64, which draws them in about half the time of torch's mt19937, with
    the same law (multiples of ``2^-24`` in float32, ``2^-53`` in float64, in ``[0, 1)``);
    normals come from torch's generator (its vectorised Box-Muller is the faster one)."""

    def __init__(self, seed: int):
        self.seed, self._numpy, self._torch = seed, None, None

    def uniform(self, like: Tensor) -> Tensor:
        if like.device.type != "cpu" or like.dtype not in _NUMPY_FLOATS:
            return torch.rand(like.shape, dtype=like.dtype, device=like.device, generator=self._generator(like))
        if self._numpy is None:
            self._numpy = np.random.Generator(np.random.PCG64(self.seed))
        u = torch.empty(like.shape, dtype=like.dtype)
        self._numpy.random(out=u.numpy(), dtype=_NUMPY_FLOATS[like.dtype])
        return u

    def normal(self, like: Tensor) -> Tensor:
        return torch.randn(like.shape, dtype=like.dtype, device=like.device, generator=self._generator(like))

    def _generator(self, like: Tensor) -> torch.Generator:
        if self._torch is None:
            self._torch = torch.Generator(device=like.device)
            self._torch.manual_seed(self.seed)
        return self._torch


_NUMPY_FLOATS = {torch.float32: np.float32, torch.float64: np.float64}


class _Chunk:
    """One tile of the work: heads ``groups``, queries ``rows``, and the keys before ``keys``
    (the last key any of its queries sees: the keys after it get zero weight and are skipped)."""

    def __init__(self, groups: slice, rows: slice, keys: int):
        self.groups, self.rows, self.keys = groups, rows, keys
        self.where = (groups, rows, slice(0, keys))


class _ChunkedNoisyAttention(torch.autograd.Function):
    """``(dropout(softmax(s + noise)) v, LSE_i, S2_i)`` over chunks of ``q [G, Q, d]``, ``k, v [G, K, *]``,
    ``s = scale q k^T``; ``key_mask`` is ``[G, 1, K]`` or None.

    ``LSE_i`` is the log-sum-exp of the clean scores over the visible keys and ``S2_i`` their sum
    of squares (computed when ``want_lse``/``want_sq``): the row statistics of the KL. Masked
    entries get exactly zero weight; rows without a visible key give zero output and
    ``LSE_i = -inf``. While every chunk's scores and weights fit in :data:`KEEP_BYTES` they are
    kept for the backward pass; beyond that the backward recomputes them, noise included.
    """

    @staticmethod
    def forward(ctx, q, k, v, key_mask, causal, scale, sampler, want_lse, want_sq):
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])  # every row is some chunk's
        lse = q.new_full(q.shape[:-1] if want_lse else (0,), float("-inf"))
        norm = q.new_empty(q.shape[:-1] + (1,))
        sq = q.new_zeros(q.shape[:-1] if want_sq else (0,))
        keep_tiles = 2 * math.prod(q.shape[:-1]) * k.shape[-2] * q.element_size() <= KEEP_BYTES
        empty_rows = key_mask is not None and (causal or not bool(key_mask.any(-1).all()))
        chunks = _plan(q, k, key_mask, causal)
        ctx.tiles = []
        q_scaled = q * scale
        for index, c in enumerate(chunks):
            g, rows = c.groups, c.rows
            visible = _visible(key_mask, causal, c)
            s = _scores(q_scaled[g, rows], k[g, :c.keys], visible)
            p = None
            if want_lse:  # p = softmax(s), LSE_i = max_j s_ij - log max_j p_ij (one fused softmax)
                p = _fast_softmax(s, empty_rows)
                lse[g, rows] = _log_normaliser(s, p)
            s_real = None
            if want_sq:
                s_real = _real(s, visible)
                sq[g, rows] = torch.linalg.vector_norm(s_real, dim=-1).square_()
            noise, keep = sampler.draws(s, index, c.where)
            if noise is not None:  # z = s + scale * noise, in the noise's buffer
                z = torch.add(s, noise, alpha=sampler.noise_scale, out=noise)
            else:
                z = s
            if keep_tiles:  # the backward pass needs the weights only, not their normaliser
                weights = _fast_softmax(z, empty_rows)
                ctx.tiles.append((s_real, p, weights, keep))
            else:
                weights, norm[g, rows] = _softmax(z)
            torch.bmm(weights if keep is None else weights * keep, v[g, :c.keys], out=out[g, rows])
        ctx.save_for_backward(q_scaled, k, v, key_mask, lse, norm, out)
        ctx.causal, ctx.scale, ctx.sampler, ctx.chunks = causal, scale, sampler, chunks
        ctx.want_lse, ctx.want_sq, ctx.empty_rows = want_lse, want_sq, empty_rows
        ctx.mark_non_differentiable(*(() if want_lse else (lse,)), *(() if want_sq else (sq,)))
        return out, lse, sq

    @staticmethod
    def backward(ctx, d_out, d_lse, d_sq):
        q_scaled, k, v, key_mask, lse, norm, out = ctx.saved_tensors
        scale, sampler = ctx.scale, ctx.sampler
        tiles, ctx.tiles = ctx.tiles, None
        dq = torch.empty_like(q_scaled)
        # dk and dv are accumulated transposed, [G, d, K]: a product with a transposed
        # [rows x d] factor is markedly faster than one with a transposed [rows x K] factor
        dk_t = k.new_zeros(k.shape[0], k.shape[2], k.shape[1])
        dv_t = v.new_zeros(v.shape[0], v.shape[2], v.shape[1])
        # sum_j W_ij dW_ij = dO_i . O_i (W includes the dropout mask): the flash-attention identity
        d_norm = (d_out * out).sum(-1, keepdim=True)
        lse_safe = torch.where(torch.isfinite(lse), lse, 0.0).unsqueeze(-1) if ctx.want_lse else None
        for index, c in enumerate(ctx.chunks):
            g, rows, keys = c.groups, c.rows, slice(0, c.keys)
            q_c = q_scaled[g, rows]
            if tiles:
                s_real, p, weights, keep = tiles[index]
                tiles[index] = None
            else:
                visible = _visible(key_mask, ctx.causal, c)
                s = _scores(q_c, k[g, keys], visible)
                s_real = _real(s, visible) if ctx.want_sq else None
                noise, keep = sampler.draws(s, index, c.where)
                z = s.clone() if noise is None else torch.add(s, noise, alpha=sampler.noise_scale, out=noise)
                weights = z.sub_(norm[g, rows]).exp_()
                if ctx.want_lse and d_lse is not None:
                    p = s.sub_(lse_safe[g, rows]).exp_()
            d_o = d_out[g, rows]
            d_weights = torch.bmm(d_o, v[g, keys].transpose(-1, -2))
            if keep is not None:
                d_weights.mul_(keep)
            dv_t[g, :, keys] += torch.bmm(d_o.transpose(-1, -2).contiguous(),
                                          weights if keep is None else weights * keep)
            d_s = d_weights.sub_(d_norm[g, rows]).mul_(weights)
            # d LSE_i / d s_ij = p_ij = exp(s_ij - LSE_i) and d S2_i / d s_ij = 2 s_ij
            if ctx.want_lse and d_lse is not None:
                d_s.addcmul_(p, d_lse[g, rows, None])
            if ctx.want_sq and d_sq is not None:
                d_s.addcmul_(s_real, d_sq[g, rows, None], value=2.0)
            torch.bmm(d_s, k[g, keys], out=dq[g, rows])
            dk_t[g, :, keys] += torch.bmm(q_c.transpose(-1, -2).contiguous(), d_s)
        return dq.mul_(scale), dk_t.transpose(-1, -2), dv_t.transpose(-1, -2), None, None, None, None, None, None


def _plan(q: Tensor, k: Tensor, key_mask: Optional[Tensor], causal: bool) -> list:
    """The chunks of at most :data:`CHUNK_ELEMENTS` score entries: whole heads with the same last
    visible key while they fit, else one head's query rows; each skips the keys after that one."""
    (G, Q, _), K = q.shape, k.shape[-2]
    rows = max(1, min(Q, CHUNK_ELEMENTS // max(K, 1)))
    groups = max(1, CHUNK_ELEMENTS // max(Q * K, 1)) if rows == Q else 1
    last = [K] * G  # one past each head's last visible key
    if key_mask is not None:
        last = (key_mask.squeeze(-2) * torch.arange(1, K + 1, device=k.device)).amax(-1).tolist()
    chunks, g0 = [], 0
    while g0 < G:  # heads with the same last visible key: prefix padding is never computed
        g1 = g0 + 1
        while g1 < min(g0 + groups, G) and last[g1] == last[g0]:
            g1 += 1
        g, g0 = slice(g0, g1), g1
        for r0 in range(0, Q, rows):
            r = slice(r0, min(r0 + rows, Q))
            keys = max(last[g])
            if causal:
                keys = min(keys, r.stop)
            chunks.append(_Chunk(g, r, max(keys, 1)))
    return chunks


def _real(s: Tensor, visible: Optional[Tensor]) -> Tensor:
    """Scores with hidden entries at 0 instead of ``-inf`` (a copy: ``s`` is changed in place later)."""
    return s.clone() if visible is None else s.masked_fill(~visible, 0.0)


def _visible(key_mask: Optional[Tensor], causal: bool, c: _Chunk) -> Optional[Tensor]:
    """The chunk's visibility (True = attend), broadcastable to its scores; None when all keys are visible."""
    mask = None if key_mask is None else key_mask[c.groups, :, :c.keys]
    if mask is not None and bool(mask.all()):  # a padding mask whose padding the chunk skips
        mask = None
    if not causal:
        return mask
    device = None if key_mask is None else key_mask.device
    tri = torch.arange(c.rows.start, c.rows.stop, device=device)[:, None] >= torch.arange(c.keys, device=device)
    return tri if mask is None else mask & tri


def _scores(q_c: Tensor, k: Tensor, visible: Optional[Tensor]) -> Tensor:
    """The chunk's scores (``q_c`` is already scaled) with ``-inf`` on hidden keys (added as a
    ``0 / -inf`` bias: the mask has no row dimension, so this is cheaper than a masked fill)."""
    s = torch.bmm(q_c, k.transpose(-1, -2))
    if visible is None:
        return s
    return s.add_(torch.zeros(visible.shape, dtype=s.dtype, device=s.device).masked_fill_(~visible, float("-inf")))


def _log_normaliser(s: Tensor, p: Tensor) -> Tensor:
    """``log sum_j exp(s_ij)`` from ``p = softmax(s)``: ``max_j s_ij - log max_j p_ij`` (``p``'s
    largest entry is at least ``1/K``, so its log is well conditioned); ``-inf`` on rows without keys."""
    top = s.amax(-1)
    return torch.where(torch.isfinite(top), top - p.amax(-1).log(), float("-inf"))


def _fast_softmax(z: Tensor, empty_rows: bool) -> Tensor:
    """``torch.softmax`` (one fused pass), with zeros instead of NaN on rows without keys."""
    weights = torch.softmax(z, -1)
    return weights.nan_to_num_(0.0) if empty_rows else weights


def _softmax(z: Tensor):
    """``softmax(z)`` in place of ``z``, and each row's log-normaliser (0 on rows without keys, whose weights are 0)."""
    top = z.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    weights = z.sub_(top).exp_()
    total = weights.sum(-1, keepdim=True)
    weights.div_(total.clamp_min(torch.finfo(z.dtype).tiny))
    return weights, torch.where(total > 0, top + total.log(), 0.0)


def dense_bam_attention(
    norm: BAM,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Optional[Tensor] = None,
    causal: bool = False,
    scale: Optional[float] = None,
    dropout: float = 0.0,
    noise: Optional[Tensor] = None,
) -> Tensor:
    """BAM attention ``dropout(W) v`` of ``q [..., H, Q, d]``, ``k, v [..., H, K, *]``, its KL added
    to the active :func:`~common.attention.aux_losses` collector as ``"bam_kl"``.

    ``mask`` is a key padding mask (boolean, broadcastable to ``[..., H, 1, K]``, True = attend);
    ``causal`` hides keys ``j > i``. ``noise`` is an explicit standard log-noise
    ``[..., H, Q, K]`` (``log(-log u)`` for Weibull, ``N(0, 1)`` for Lognormal), else it is drawn.
    Computes in float32 (autocast off) and returns ``q``'s dtype, as the normalizers do.
    """
    collect = collecting()
    kernel = norm.kl_kernel
    if collect and not supports(kernel, causal):
        raise ValueError(f"{norm.extra_repr()}: no closed-form KL under a causal mask; use the materialised path")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    noise_scale = norm.noise_scale if norm.sampling else 0.0
    triton = noise is None and q.dtype != torch.float64 and use_triton(q)
    seed = 0 if triton or not (noise_scale or dropout) else int(torch.randint(0, 1 << 62, ()))
    sampler = Sampler(norm.posterior, noise_scale, dropout, seed, noise)
    key_mask = None if mask is None else mask.view((1,) * max(2 - mask.dim(), 0) + mask.shape)
    want_sq = collect and needs_square_sums(kernel)
    with torch.autocast(q.device.type, enabled=False):
        qf, kf, vf = (x.float() if x.dtype != torch.float64 else x for x in (q, k, v))
        if triton:
            out, lse, sq = _triton_attention(q, k, v, key_mask, causal, scale, sampler, collect, want_sq)
        else:
            out, lse, sq = _chunked_attention(qf, kf, vf, key_mask, causal, scale, sampler, collect, want_sq)
        if collect:
            prior = None if norm.prior_net is None else norm.prior_net(kf, head_axis=-3)
            add_aux_loss("bam_kl", dense_kl(kernel, qf, kf, lse, scale=scale, causal=causal, prior_logits=prior,
                                            key_mask=None if key_mask is None else key_mask.squeeze(-2),
                                            square_sums=sq if want_sq else None,
                                            prior_over_all_keys=norm.prior_scope == "all"))
    return out.to(q.dtype)


def _chunked_attention(q, k, v, key_mask, causal, scale, sampler, want_lse, want_sq):
    """:class:`_ChunkedNoisyAttention` over ``[..., H, L, d]`` tensors, flattened to ``[G, L, d]``."""
    lead, n_q, n_k = q.shape[:-2], q.shape[-2], k.shape[-2]
    q3, k3, v3 = (x.reshape(-1, *x.shape[-2:]) for x in (q, k, v))
    if key_mask is not None:
        key_mask = key_mask.expand(lead + (1, n_k)).reshape(-1, 1, n_k)
    if sampler.noise is not None:
        sampler.noise = sampler.noise.expand(lead + (n_q, n_k)).reshape(-1, n_q, n_k)
    out, lse, sq = _ChunkedNoisyAttention.apply(q3, k3, v3, key_mask, causal, scale, sampler, want_lse, want_sq)
    return (out.view(lead + out.shape[-2:]), lse.view(lead + (n_q,)) if want_lse else lse,
            sq.view(lead + (n_q,)) if want_sq else sq)


def _triton_attention(q, k, v, key_mask, causal, scale, sampler, want_lse, want_sq):
    """:class:`~common.attention.kernels.dense_bam.TritonNoisyAttention` over ``[..., H, L, d]``
    tensors (in their own dtype, float32 accumulation); its noise is keyed by (seed, batch*head,
    query, key) and does not depend on the tiling."""
    from .kernels import interpreting
    from .kernels.dense_bam import NOISE_LOGNORMAL, NOISE_NONE, NOISE_WEIBULL, TritonNoisyAttention, seeds_for_call

    lead, (n_q, d), (n_k, dv) = q.shape[:-2], q.shape[-2:], v.shape[-2:]
    q3, k3, v3 = (x.reshape(-1, *x.shape[-2:]).contiguous() for x in (q, k, v))
    km = None
    if key_mask is not None:
        km = key_mask.squeeze(-2).expand(lead + (n_k,)).reshape(-1, n_k).to(torch.int8).contiguous()
    kind = NOISE_NONE if not sampler.noise_scale else (NOISE_WEIBULL if sampler.posterior == "weibull"
                                                       else NOISE_LOGNORMAL)
    out, lse, sq = TritonNoisyAttention.apply(q3, k3, v3, km, causal, scale, kind, float(sampler.noise_scale),
                                              float(sampler.dropout), seeds_for_call(), want_lse, want_sq,
                                              interpreting())
    return out.view(lead + (n_q, dv)), lse.view(lead + (n_q,)), sq.view(lead + (n_q,))


def fused_bam(attend, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool,
              need_maps: bool) -> Optional[Tensor]:
    """``Attend``'s output by :func:`dense_bam_attention` when nothing needs the weight matrix, else None.

    Taken outside ``torch.compile`` when the normalizer is BAM, no map operator is on (position interactions,
    predictive/evolving, span, convoluted), ``need_maps`` is off, the mask is a key padding
    mask (per-query masks keep the materialised path), and, when the KL is collected, its
    closed form covers the mask (:func:`~common.attention.bam_stats.supports`). In evaluation
    without Monte Carlo sampling and without a KL collector, BAM is its posterior mean,
    softmax, and the call is ``F.scaled_dot_product_attention``.
    """
    norm = attend.normalizer
    if (not isinstance(norm, BAM) or need_maps or os.environ.get("ATTN_FUSED_BAM", "1") == "0"
            or torch.compiler.is_compiling()  # torch.compile fuses the materialised path itself
            or any(op is not None for op in (attend.absolute, attend.relative, attend.cross_layer,
                                             attend.span, attend.convoluted))
            or not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2])
            or (mask is not None and (mask.dim() > q.dim() or (mask.dim() >= 2 and mask.shape[-2] != 1)))):
        return None
    if not (norm.sampling or collecting()):
        return attend._sdpa(q, k, v, mask, causal)
    if collecting() and not supports(norm.kl_kernel, causal):
        return None
    return dense_bam_attention(norm, q, k, v, mask=mask, causal=causal, scale=attend.scale,
                               dropout=attend.dropout_p if attend.training else 0.0)
