"""Dense BAM attention without the ``[queries x keys]`` weight matrix.

The BAM sample is ``W = softmax(s + noise)`` (Fan et al., 2020, Sec. 3.2, in log space; see
:mod:`common.attention.bam`), so ``W v`` is attention with an additive random bias. This
module computes it chunk by chunk (a few heads, or one head's query rows), as a flash-attention
kernel does over tiles, skipping the keys after a chunk's last visible one (key padding):
a chunk's scores, noise, weights and gradients exist only while that chunk is
processed, the backward pass recomputes them (it draws the same noise again), and the
memory kept between the passes is ``O(L)``: ``q, k, v``, the output and two numbers per
query. The KL comes from per-query statistics (:mod:`common.attention.bam_stats`).

On CPU in float32 the elementwise work of a chunk's rows (the noise, the softmax, dropout, the
KL's row statistics, and in the backward pass the softmax and log-sum-exp gradients) is done by
the fused C kernels of :mod:`common.attention.kernels.cpu_bam`, compiled on first use; their
noise comes from Philox4x32-10 keyed by ``(seed, head, query, key)``, so it does not depend on
the chunking. Without a C compiler (or with ``ATTN_CPU_KERNELS=0``), and in float64, the chunks
use PyTorch's operators, with noise from generators seeded with ``(seed, chunk)``
(:class:`_Stream`: numpy's PCG64DXSM words for the uniforms and the Box-Muller normals). The
seed is drawn from torch's default generator at each call, so ``torch.manual_seed`` makes runs
repeatable (on one machine: the two CPU paths draw different noise). Dropout on the weights
(``Attend``'s ``dropout``) draws its mask from the same generators. ``noise=`` takes an explicit
standard log-noise tensor instead (tests compare the chunked path with the materialised one
under the same noise).

Where :func:`~common.attention.kernels.use_triton` says so (CUDA tensors), the whole call, KL and
contextual prior included, is the custom operator ``torch.ops.attention_suite.bam_attention`` of
:mod:`common.attention.dense_bam_op` (one flash-attention kernel forward and one backward, the noise
drawn in the kernels from a counter-based generator; fake implementation and gradient registered),
which ``torch.compile`` keeps in its graph.

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
from .bam_stats import dense_kl, needs_square_sums, projection_weights, supports
from .functional import log_weibull_
from .kernels import KernelFailure, cpu_bam, fall_back, use_triton

#: Score entries per chunk: 4 MiB of float32, which stays in the cache while a chunk's
#: elementwise passes run over it and still makes batched matrix products of whole heads.
CHUNK_ELEMENTS = 1 << 20
#: The forward pass keeps the weights of the first chunks for the backward pass while they take
#: at most this many bytes; the backward pass recomputes the rest, noise included. Set it to 0
#: for the least memory (every tile recomputed).
KEEP_BYTES = 256 << 20
#: While every chunk's scores and weights take at most this many bytes (and ``KEEP_BYTES``), the
#: scores are kept too, so the backward pass recomputes nothing (short sequences, whose small
#: score products run slowly). Past it the scores go to scratch buffers and the backward pass
#: recomputes them: a matrix product costs about what the first write to new memory does.
KEEP_SCORES_BYTES = 64 << 20
#: A chunk's key count is rounded up to a multiple of this many (see :class:`_Chunk`).
KEY_ALIGN = 16
#: Past this many keys the fused backward pass splits rows into blocks of this many keys (a multiple
#: of :data:`KEY_ALIGN`) and keeps nothing between the passes: timed alone, the products of a
#: [256 x 4096] tile ran about a fifth faster than those of a [64 x 16384] one, whose dk and dv
#: accumulators leave the cache.
KEY_BLOCK = 4096
_SEED_STRIDE = 0x9E3779B97F4A7C15


class Sampler:
    """The random part of one call: log-noise (``posterior``, ``noise_scale``, 0 for none),
    dropout probability, the call's seed, or an explicit standard log-noise tensor ``[G, Q, K]``."""

    def __init__(self, posterior: str, noise_scale: float, dropout: float, seed: int,
                 noise: Optional[Tensor] = None):
        self.posterior, self.noise_scale, self.dropout = posterior, noise_scale, dropout
        self.seed, self.noise = seed, noise

    def fused(self, like: Tensor) -> bool:
        """Whether the fused CPU kernels (:mod:`~common.attention.kernels.cpu_bam`) draw the noise
        of ``like``'s chunks: float32 CPU tensors without explicit noise, where the kernels build."""
        return self.noise is None and like.device.type == "cpu" and like.dtype == torch.float32 and cpu_bam.available()

    def sample_fused(self, s: Tensor, c: "_Chunk", work: Optional["_Workspace"], lse_z: Tensor,
                     lse: Optional[Tensor] = None, sq: Optional[Tensor] = None) -> tuple:
        """Chunk ``c``'s weights and dropout scale (or None) by :func:`~common.attention.kernels.cpu_bam.sample`
        of its scores ``s`` (writing the softmax's normaliser ``lse_z``, and ``lse`` and ``sq`` when
        given), in ``work``'s buffers, or in new tensors (kept for the backward pass) without one; the
        noise is keyed by the chunk's heads and queries."""
        def buffer(name: str) -> Tensor:
            return torch.empty(c.shape, dtype=torch.float32) if work is None else work.take(name, c)
        weights, keep = buffer("weights"), buffer("keep") if self.dropout else None
        cpu_bam.sample(s, weights, self.seed, c.groups.start, c.rows.start, self._kind(), self.noise_scale,
                       keep=keep, dropout=self.dropout, lse=lse, sq=sq, lse_z=lse_z)
        return weights, keep

    def regrad_fused(self, d_w: Tensor, s: Tensor, c: "_Chunk", work: "_Workspace", lse_z: Tensor, d_norm: Tensor,
                     lse: Optional[Tensor], d_lse: Optional[Tensor], d_sq: Optional[Tensor]) -> Tensor:
        """The backward pass of chunk ``c``'s recomputed weights by :func:`~common.attention.kernels.cpu_bam.regrad`:
        the scores' gradient in place of ``d_w``; returns the dropped weights (for ``dv``)."""
        dropped = work.take("weights", c)
        cpu_bam.regrad(d_w, dropped, s, lse_z, d_norm, self.seed, c.groups.start, c.rows.start, self._kind(),
                       self.noise_scale, self.dropout, lse=lse, d_lse=d_lse, d_sq=d_sq, key=c.keys.start)
        return dropped

    def _kind(self) -> int:
        if not self.noise_scale:
            return cpu_bam.NOISE_NONE
        return cpu_bam.NOISE_WEIBULL if self.posterior == "weibull" else cpu_bam.NOISE_NORMAL

    def draws(self, like: Tensor, chunk: int, where: tuple):
        """The chunk's standard log-noise (or None; scale it by ``noise_scale``) and dropout
        scale (``keep / (1 - p)``, or None); ``where`` indexes the chunk in the explicit noise."""
        stream = _Stream((self.seed + chunk * _SEED_STRIDE) % (1 << 63))
        noise = None
        if self.noise_scale:
            if self.noise is not None:
                noise = self.noise[where].to(like.dtype, copy=True)
            elif self.posterior == "weibull":
                noise = stream.log_weibull(like)
            else:
                noise = stream.normal(like)
        keep = None
        if self.dropout:
            keep = stream.keep(like, self.dropout)
        return noise, keep


class _Stream:
    """The random numbers of one chunk, from generators seeded with ``seed``.

    On CPU in float32 the uniforms are built from the raw 32-bit words of numpy's PCG64DXSM
    (three times faster than torch's mt19937 floats): the low 23 bits ``m`` give
    ``u = (m + 1/2) 2^-23`` in the open interval ``(0, 1)``, so ``log(-log u)`` is finite
    without a clamp, and the low 24 bits decide dropout. Normals are Box-Muller pairs of such
    uniforms, ``sqrt(-2 log u1) (cos, sin)(2 pi u2)``, truncated at ``|x| <= 5.77`` as torch's
    own (24-bit uniforms) are. Elsewhere (CUDA without Triton, float64) torch's generator
    gives them.
    """

    def __init__(self, seed: int):
        self.seed, self._numpy, self._torch = seed, None, None

    def log_weibull(self, like: Tensor) -> Tensor:
        """``log(-log u)``, u ~ U(0, 1): the standard Weibull log-noise (:func:`log_weibull_`)."""
        if not self._raw_bits(like):
            return log_weibull_(torch.rand(like.shape, dtype=like.dtype, device=like.device,
                                           generator=self._generator(like)), 1.0)
        return self._open_uniforms(like.numel()).log_().neg_().log_().view(like.shape)

    def keep(self, like: Tensor, p: float) -> Tensor:
        """The dropout scale ``[u >= p] / (1 - p)``."""
        if self._raw_bits(like):
            kept = self._words(like.numel()).view(like.shape).bitwise_and_(0xFFFFFF) >= round(p * (1 << 24))
        else:
            kept = torch.rand(like.shape, dtype=like.dtype, device=like.device, generator=self._generator(like)) >= p
        return kept.to(like.dtype).div_(1 - p)

    def normal(self, like: Tensor) -> Tensor:
        """Standard normal noise (the Lognormal posterior's log-noise)."""
        if not self._raw_bits(like):
            return torch.randn(like.shape, dtype=like.dtype, device=like.device, generator=self._generator(like))
        half = (like.numel() + 1) // 2
        u = self._open_uniforms(2 * half)  # becomes (radius cos, radius sin), in place
        radius, angle = u[:half].log_().mul_(-2.0).sqrt_(), u[half:].mul_(2 * math.pi)
        cos = torch.cos(angle)
        angle.sin_().mul_(radius)
        radius.mul_(cos)
        return u[:like.numel()].view(like.shape)

    @staticmethod
    def _raw_bits(like: Tensor) -> bool:
        return like.device.type == "cpu" and like.dtype == torch.float32

    def _open_uniforms(self, n: int) -> Tensor:
        """``n`` float32 uniforms ``(m + 1/2) 2^-23`` in the open interval ``(0, 1)``."""
        mantissa = self._words(n).bitwise_and_(0x7FFFFF).bitwise_or_(_ONE_BITS).view(torch.float32)
        return mantissa.sub_(1 - 2.0**-24)  # [1, 2) - (1 - 2^-24) = (m + 1/2) 2^-23

    def _words(self, n: int) -> Tensor:
        """``n`` random int32 words."""
        if self._numpy is None:
            self._numpy = np.random.PCG64DXSM(self.seed)
        return torch.from_numpy(self._numpy.random_raw((n + 1) // 2).view(np.int32)[:n])

    def _generator(self, like: Tensor) -> torch.Generator:
        if self._torch is None:
            self._torch = torch.Generator(device=like.device)
            self._torch.manual_seed(self.seed)
        return self._torch


_ONE_BITS = 0x3F800000  # the bits of 1.0f: OR-ed with 23 random mantissa bits, a float in [1, 2)


class _Chunk:
    """One tile of the work: heads ``groups``, queries ``rows``, and keys ``keys``, a slice that
    starts at 0, or at ``key_start`` for a block of keys (the backward pass of long rows).

    ``last`` is one past the last key any of its queries sees: the keys after it get zero weight
    and are skipped, except up to the next multiple of :data:`KEY_ALIGN`, which keeps the rows of
    the score tiles aligned (a product into rows of an odd length runs at about half speed);
    those few are hidden by a fill of the tile's columns from ``visible`` (an index into the tile).
    """

    def __init__(self, groups: slice, rows: slice, last: int, total_keys: int, key_start: int = 0,
                 key_stop: Optional[int] = None):
        stop = min(total_keys, -(-last // KEY_ALIGN) * KEY_ALIGN, total_keys if key_stop is None else key_stop)
        self.groups, self.rows, self.keys = groups, rows, slice(key_start, stop)
        self.visible = min(last, stop) - key_start
        self.where = (groups, rows, self.keys)
        self.shape = (groups.stop - groups.start, rows.stop - rows.start, stop - key_start)  # of its scores
        self.entries = math.prod(self.shape)


class _ChunkedNoisyAttention(torch.autograd.Function):
    """``(dropout(softmax(s + noise)) v, LSE_i, S2_i, P_ir)`` over chunks of ``q [G, Q, d]``,
    ``k, v [G, K, *]``, ``s = scale q k^T``; ``key_mask`` is ``[G, 1, K]`` or None.

    ``LSE_i`` is the log-sum-exp of the clean scores over the visible keys and ``S2_i`` their sum
    of squares (computed when ``want_lse``/``want_sq``): the row statistics of the KL. Masked
    entries get exactly zero weight; rows without a visible key give zero output and
    ``LSE_i = -inf``. ``P_ir = scale q_i . sum_j w_rj k_j`` are the KL's projections for the
    per-key weights ``key_weights [G, m, K]`` (or None), taken while a chunk's queries are at
    hand; their gradients go to the chunk's ``dq`` and, at the end, to ``dk``.

    While every chunk's scores and weights fit in :data:`KEEP_SCORES_BYTES` they are kept for the
    backward pass; beyond that the weights of the first chunks are kept while they fit in
    :data:`KEEP_BYTES`, and the backward pass recomputes the scores, and the others' weights with
    their noise: the fused kernels as ``exp(z_ij - LSEz_i)`` with the forward's normaliser ``LSEz_i``
    (equal to the forward's weights to float32 rounding), the PyTorch path as the same ``softmax``
    of the same ``z`` (bit for bit the forward's).
    """

    @staticmethod
    def forward(ctx, q, k, v, key_mask, causal, scale, sampler, want_lse, want_sq, key_weights):
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])  # every row is some chunk's
        centers = None if key_weights is None else torch.bmm(key_weights, k)  # [G, m, d]: sum_j w_rj k_j
        proj = q.new_empty(q.shape[:-1] + ((0,) if centers is None else centers.shape[-2:-1]))
        lse = q.new_full(q.shape[:-1] if want_lse else (0,), float("-inf"))
        sq = q.new_zeros(q.shape[:-1] if want_sq else (0,))
        empty_rows = key_mask is not None and (causal or not bool(key_mask.any(-1).all()))
        fused = sampler.fused(q)
        lse_z = q.new_empty(q.shape[:-1] if fused else (0,))  # the fused softmax's normalisers, for regrad
        chunks = _plan(q, k, key_mask, causal)
        visibles = [_visible(key_mask, causal, c) for c in chunks]
        # a tile's weights, scores (for the KL), dropout mask, and its visible scores when they are a copy
        scores_kept = (want_lse or want_sq) if fused else want_lse
        tile_bytes = sum(c.entries * q.element_size()
                         * (1 + scores_kept + bool(sampler.dropout) + (not fused and want_sq and mask is not None))
                         for c, mask in zip(chunks, visibles))
        keep_scores = tile_bytes <= min(KEEP_SCORES_BYTES, KEEP_BYTES)
        # long rows: the fused backward pass takes blocks of keys, whose products run faster, and keeps nothing
        key_block = KEY_BLOCK if fused and not keep_scores and k.shape[-2] > KEY_BLOCK else None
        budget = 0 if key_block else KEEP_BYTES
        work = None if keep_scores else _Workspace(q, chunks)  # kept scores need their own memory
        ctx.tiles = []
        for index, (c, visible) in enumerate(zip(chunks, visibles)):
            g, rows = c.groups, c.rows
            s = _scores(q[g, rows], k[g, c.keys], scale, visible, c, work)
            if centers is not None:
                proj[g, rows].baddbmm_(q[g, rows], centers[g].transpose(-1, -2), beta=0, alpha=scale)
            weight_bytes = c.entries * q.element_size() * (1 + bool(sampler.dropout))
            kept = keep_scores or budget >= weight_bytes  # the weights stay for the backward pass
            if kept and not keep_scores:
                budget -= weight_bytes
            s_real = None
            if fused:  # noise, softmax, dropout, LSE and S2 in one visit of each row
                weights, keep = sampler.sample_fused(s, c, None if kept else work, lse_z[g, rows],
                                                     lse[g, rows] if want_lse else None,
                                                     sq[g, rows] if want_sq else None)
            else:
                if want_lse:
                    lse[g, rows] = _logsumexp(s, work)
                if want_sq:
                    s_real = _real(s, visible, c, work)
                    sq[g, rows] = torch.linalg.vector_norm(s_real, dim=-1).square_()
                weights, keep = _sample(sampler, s, index, c, empty_rows)
            tile = None
            if keep_scores:  # everything fits: the backward pass recomputes nothing
                tile = (s if scores_kept else None, s_real, weights, keep)
            elif kept:
                tile = (None, None, weights, keep)  # the weights while they fit: no noise to redraw
            ctx.tiles.append(tile)
            torch.bmm(_dropped(weights, keep, c, work), v[g, c.keys], out=out[g, rows])
        ctx.save_for_backward(q, k, v, lse, out, key_weights, centers, lse_z)
        if key_block:  # nothing was kept (budget 0): the backward pass's own chunks, each recomputed
            chunks = _plan(q, k, key_mask, causal, key_block)
            visibles = [_visible(key_mask, causal, c) for c in chunks]
            ctx.tiles = [None] * len(chunks)
        ctx.scale, ctx.sampler, ctx.chunks, ctx.visibles = scale, sampler, chunks, visibles  # the backward pass's
        ctx.want_lse, ctx.want_sq, ctx.empty_rows, ctx.fused = want_lse, want_sq, empty_rows, fused
        ctx.mark_non_differentiable(*(() if want_lse else (lse,)), *(() if want_sq else (sq,)),
                                    *(() if centers is not None else (proj,)))
        return out, lse, sq, proj

    @staticmethod
    def backward(ctx, d_out, d_lse, d_sq, d_proj):
        q, k, v, lse, out, key_weights, centers, lse_z = ctx.saved_tensors
        scale, sampler = ctx.scale, ctx.sampler
        tiles, ctx.tiles = ctx.tiles, None
        d_out = d_out.contiguous()
        need_p = ctx.want_lse and d_lse is not None
        need_sq = ctx.want_sq and d_sq is not None
        fused = ctx.fused
        need_s = need_p or (fused and need_sq)  # the fused gradient takes S2's from s itself
        d_lse, d_sq = (None if x is None else x.contiguous() for x in (d_lse, d_sq))
        dq = torch.empty_like(q)
        # dk and dv are accumulated transposed, [G, d, K]: a product with a transposed
        # [rows x d] factor is markedly faster than one with a transposed [rows x K] factor
        dk_t = k.new_empty(k.shape[0], k.shape[2], k.shape[1])
        dv_t = v.new_empty(v.shape[0], v.shape[2], v.shape[1])
        d_centers = None if d_proj is None or centers is None else torch.zeros_like(centers)
        # sum_j W_ij dW_ij = dO_i . O_i (W includes the dropout mask): the flash-attention identity
        d_norms = (d_out * out).sum(-1)
        work = _Workspace(q, ctx.chunks)
        for index, (c, visible) in enumerate(zip(ctx.chunks, ctx.visibles)):
            g, rows, keys = c.groups, c.rows, c.keys
            q_c, first = q[g, rows], rows.start == 0  # a group's first rows write its dk, dv
            s, s_real, weights, keep = tiles[index] or (None, None, None, None)
            tiles[index] = None
            if weights is None or (s is None and need_s) or (not fused and s_real is None and need_sq):
                s = _scores(q_c, k[g, keys], scale, visible, c, work)
                s_real = _real(s, visible, c, work) if ctx.want_sq and not fused else None
            d_o, d_norm = d_out[g, rows], d_norms[g, rows]
            d_weights = torch.bmm(d_o, v[g, keys].transpose(-1, -2), out=work.take("d_weights", c))
            kl_grads = (lse[g, rows] if need_p else None, d_lse[g, rows] if need_p else None,
                        d_sq[g, rows] if need_sq else None)
            d_s = d_weights
            if fused and weights is None:  # the forward's noise, dropout and weights again, and d_s, in one pass
                dropped = sampler.regrad_fused(d_s, s, c, work, lse_z[g, rows], d_norm, *kl_grads)
            else:
                if weights is None:
                    weights, keep = _sample(sampler, s, index, c, ctx.empty_rows)
                dropped = _dropped(weights, keep, c, work)
                if fused:
                    cpu_bam.grad(d_s, weights, keep, d_norm, s if need_s else None, *kl_grads)
                else:
                    _softmax_gradient(d_s, weights, keep, d_norm, s, s_real, *kl_grads)
            _accumulate(dv_t, g, c.keys, d_o.transpose(-1, -2).contiguous(), dropped, first)
            # a row's first key block writes its dq (beta=0 ignores the uninitialised entries)
            dq[g, rows].baddbmm_(d_s, k[g, keys], beta=0 if keys.start == 0 else 1, alpha=scale)
            if d_centers is not None and keys.start == 0:  # P_ir = scale q_i . C_r
                dq[g, rows].baddbmm_(d_proj[g, rows], centers[g], alpha=scale)
                d_centers[g].baddbmm_(d_proj[g, rows].transpose(-1, -2), q_c, alpha=scale)
            _accumulate(dk_t, g, c.keys, q_c.transpose(-1, -2).contiguous(), d_s, first, alpha=scale)
        d_key_weights = None
        if d_centers is not None:  # C_r = sum_j w_rj k_j
            dk_t.baddbmm_(d_centers.transpose(-1, -2), key_weights)
            d_key_weights = torch.bmm(d_centers, k.transpose(-1, -2)) if ctx.needs_input_grad[-1] else None
        return (dq, dk_t.transpose(-1, -2), dv_t.transpose(-1, -2), None, None, None, None, None, None,
                d_key_weights)


def _plan(q: Tensor, k: Tensor, key_mask: Optional[Tensor], causal: bool, key_block: Optional[int] = None) -> list:
    """The chunks of at most :data:`CHUNK_ELEMENTS` score entries: whole heads with the same last
    visible key while they fit, else one head's query rows; each skips the keys after that one.
    With ``key_block``, a chunk's keys are split into blocks of that many (a multiple of
    :data:`KEY_ALIGN`), in order, and its rows fill :data:`CHUNK_ELEMENTS` with blocks."""
    (G, Q, _), K = q.shape, k.shape[-2]
    width = K if key_block is None else min(K, key_block)
    rows = max(1, min(Q, CHUNK_ELEMENTS // max(width, 1)))
    groups = max(1, CHUNK_ELEMENTS // max(Q * width, 1)) if rows == Q else 1
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
            keys = max(max(last[g]), 1)
            if causal:
                keys = min(keys, r.stop)
            for k0 in range(0, keys, width):
                chunks.append(_Chunk(g, r, keys, K, k0, k0 + width))
    return chunks


def _real(s: Tensor, visible: Optional[Tensor], c: _Chunk, work: Optional["_Workspace"]) -> Tensor:
    """The visible scores: a view of ``s``'s first ``c.visible`` keys when those are all visible
    (read it before ``s`` is changed in place), else a copy with hidden entries at 0."""
    if visible is None:
        return s[..., :c.visible]
    real = s.clone() if work is None else work.take("real", c).copy_(s)
    real.masked_fill_(~visible, 0.0)
    real[..., c.visible:] = 0.0
    return real


def _visible(key_mask: Optional[Tensor], causal: bool, c: _Chunk) -> Optional[Tensor]:
    """The chunk's visibility (True = attend) over its ``c.keys``, broadcastable to its scores;
    None when every key before ``c.visible`` is visible (:func:`_scores` hides the rest)."""
    mask = None if key_mask is None else key_mask[c.groups, :, c.keys]
    if mask is not None and bool(mask[..., :c.visible].all()):  # a padding mask whose padding the chunk skips
        mask = None
    if not causal:
        return mask
    device = None if key_mask is None else key_mask.device
    queries, keys = (torch.arange(x.start, x.stop, device=device) for x in (c.rows, c.keys))
    tri = queries[:, None] >= keys
    return tri if mask is None else mask & tri


def _accumulate(grad_t: Tensor, groups: slice, keys: slice, a: Tensor, b: Tensor, first: bool,
                alpha: float = 1.0) -> None:
    """``grad_t[groups, :, keys] += alpha a b``; a group's first rows (``first``: their chunks come
    first, key blocks in order) write it instead and zero the keys after ``keys``, so ``grad_t``
    needs no zero fill."""
    if not first:
        grad_t[groups, :, keys].baddbmm_(a, b, alpha=alpha)
        return
    grad_t[groups, :, keys.stop:].zero_()
    grad_t[groups, :, keys].baddbmm_(a, b, beta=0, alpha=alpha)  # beta=0 ignores the uninitialised entries


def _scores(q_c: Tensor, k: Tensor, scale: float, visible: Optional[Tensor], c: _Chunk,
            work: Optional["_Workspace"]) -> Tensor:
    """The chunk's scores ``scale q_c k^T`` (in ``work``'s buffer, or a new tensor without one) with
    ``-inf`` on hidden keys (added as a ``0 / -inf`` bias: the mask has no row dimension, so this
    is cheaper than a masked fill) and on the alignment keys after ``c.visible``."""
    s = q_c.new_empty(q_c.shape[:-1] + k.shape[-2:-1]) if work is None else work.take("scores", c)
    s.baddbmm_(q_c, k.transpose(-1, -2), beta=0, alpha=scale)
    if visible is not None:
        s.add_(torch.zeros(visible.shape, dtype=s.dtype, device=s.device).masked_fill_(~visible, float("-inf")))
    if c.shape[-1] > c.visible:
        s[..., c.visible:] = float("-inf")
    return s


def _sample(sampler: Sampler, s: Tensor, index: int, c: _Chunk, empty_rows: bool) -> tuple:
    """Chunk ``index``'s weights ``softmax(s + noise_scale * noise)`` (in the noise's buffer; a new
    tensor without noise) and its dropout scale (or None), both drawn by ``sampler``."""
    noise, keep = sampler.draws(s, index, c.where)
    z = s if noise is None else torch.add(s, noise, alpha=sampler.noise_scale, out=noise)
    return _softmax(z, empty_rows, in_place=noise is not None), keep


def _dropped(weights: Tensor, keep: Optional[Tensor], c: _Chunk, work: Optional["_Workspace"]) -> Tensor:
    """The weights with dropout applied, ``weights * keep`` (``weights`` itself without dropout)."""
    if keep is None:
        return weights
    return torch.mul(weights, keep, out=work.take("dropped", c)) if work is not None else weights * keep


def _softmax(z: Tensor, empty_rows: bool, in_place: bool) -> Tensor:
    """``softmax(z)`` over the last dimension (one fused pass; into ``z`` itself when ``in_place``),
    with zeros instead of NaN on rows without keys."""
    weights = torch.ops.aten._softmax.out(z, -1, False, out=z) if in_place else torch.softmax(z, -1)
    return weights.nan_to_num_(0.0) if empty_rows else weights


def _logsumexp(s: Tensor, work: Optional["_Workspace"]) -> Tensor:
    """``log sum_j exp(s_ij)`` over the last dimension (``-inf`` on rows without a finite score).

    Unshifted, ``log sum_j exp(s_ij)`` (two passes, the ``exp`` in ``work``'s buffer) where the
    sum lies within ``[1e-20, 1e30]``: there no ``exp`` overflows, and the terms that underflow
    weigh less than ``1e-14`` of it; the other rows (and rows without keys) take
    ``torch.logsumexp``'s shifted form (which makes a max pass and a copy of ``s``)."""
    total = (torch.exp(s) if work is None else torch.exp(s, out=work.take("exp", s))).sum(-1)
    odd = (total < 1e-20) | ~(total <= 1e30)
    lse = total.log_()
    if bool(odd.any()):
        lse[odd] = torch.logsumexp(s[odd], -1)
    return lse


def _add_lse_gradient(d_s: Tensor, s: Tensor, lse: Tensor, d_lse: Tensor) -> None:
    """``d_s += d_lse_i p_ij``, ``p_ij = exp(s_ij - LSE_i) = d LSE_i / d s_ij``, in place of ``s``.

    While every finite ``LSE_i`` is within ``[-40, 40]`` (``s_ij <= LSE_i``: ``exp(s_ij)`` does not
    overflow) this is ``exp(s_ij) (d_lse_i exp(-LSE_i))``, a pass fewer than the shifted form."""
    finite = torch.isfinite(lse)
    if bool((lse.abs() <= 40).logical_or_(~finite).all()):
        d_s.addcmul_(s.exp_(), torch.where(finite, d_lse * torch.exp(-lse), 0.0).unsqueeze(-1))
    else:
        d_s.addcmul_(s.sub_(torch.where(finite, lse, 0.0).unsqueeze(-1)).exp_(), d_lse.unsqueeze(-1))


def _softmax_gradient(d_s: Tensor, weights: Tensor, keep: Optional[Tensor], d_norm: Tensor, s: Tensor,
                      s_real: Optional[Tensor], lse: Optional[Tensor], d_lse: Optional[Tensor],
                      d_sq: Optional[Tensor]) -> None:
    """In place of ``d_s`` (``dW``): the scores' gradient ``(dW keep - d_norm) W + d_lse p + 2 d_sq s``
    (PyTorch's operators; :func:`~common.attention.kernels.cpu_bam.grad` is the fused form)."""
    if keep is not None:
        d_s.mul_(keep)
    d_s.sub_(d_norm.unsqueeze(-1)).mul_(weights)
    # d S2_i / d s_ij = 2 s_ij and d LSE_i / d s_ij = p_ij = exp(s_ij - LSE_i), in this
    # order: s_real may be a view of s, which p overwrites
    if d_sq is not None:
        d_s[..., :s_real.shape[-1]].addcmul_(s_real, d_sq.unsqueeze(-1), value=2.0)
    if d_lse is not None:
        _add_lse_gradient(d_s, s, lse, d_lse)


class _Workspace:
    """Scratch buffers of one pass, each the size of its largest chunk and reused by every chunk.

    A new tensor per chunk costs the page faults of its first write (about 1 ns per entry on
    the Intel Xeon of the README, as much as one of the chunk's matrix products)."""

    def __init__(self, like: Tensor, chunks: list):
        self.like, self.entries, self.buffers = like, max(c.entries for c in chunks), {}

    def take(self, name: str, like) -> Tensor:
        """The buffer ``name`` viewed in the shape of ``like`` (a tensor, or a chunk: its scores)."""
        shape = like.shape
        buffer = self.buffers.get(name)
        if buffer is None:
            buffer = self.buffers[name] = self.like.new_empty(self.entries)
        return buffer[:math.prod(shape)].view(shape)


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
    Computes in float32 (autocast off) and returns ``q``'s dtype, as the normalizers do; on a GPU
    (:func:`_triton_takes`) the whole call is the operator of :mod:`common.attention.dense_bam_op`.
    """
    collect = collecting()
    kernel = norm.kl_kernel
    if collect and not supports(kernel, causal):
        raise ValueError(f"{norm.extra_repr()}: no closed-form KL under a causal mask; use the materialised path")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    noise_scale = norm.noise_scale if norm.sampling else 0.0
    if _triton_takes(q, k, v, mask, noise):
        try:
            return _operator_attention(norm, q, k, v, mask, causal, scale, noise_scale, dropout, collect)
        except KernelFailure as failure:  # cannot compile or run on this GPU: warn once, chunks from now on
            fall_back(failure)
    seed = 0 if not (noise_scale or dropout) else int(torch.randint(0, 1 << 62, ()))
    sampler = Sampler(norm.posterior, noise_scale, dropout, seed, noise)
    key_mask = None if mask is None else mask.view((1,) * max(2 - mask.dim(), 0) + mask.shape)
    want_sq = collect and needs_square_sums(kernel)
    with torch.autocast(q.device.type, enabled=False):
        qf, kf, vf = (x.float() if x.dtype != torch.float64 else x for x in (q, k, v))
        prior = None if not collect or norm.prior_net is None else norm.prior_net(kf, head_axis=-3)
        kl_args = dict(key_mask=None if key_mask is None else key_mask.squeeze(-2), prior_logits=prior,
                       prior_over_all_keys=norm.prior_scope == "all")
        # the chunks take the KL's projections of q too (all keys: no causal mask)
        weights = projection_weights(kernel, kf, **kl_args) if collect and not causal else None
        out, lse, sq, proj = _chunked_attention(qf, kf, vf, key_mask, causal, scale, sampler, collect, want_sq,
                                                weights)
        if collect:
            add_aux_loss("bam_kl", dense_kl(kernel, qf, kf, lse, scale=scale, causal=causal,
                                            square_sums=sq if want_sq else None, projections=proj, **kl_args))
    return out.to(q.dtype)


def _chunked_attention(q, k, v, key_mask, causal, scale, sampler, want_lse, want_sq, key_weights):
    """:class:`_ChunkedNoisyAttention` over ``[..., H, L, d]`` tensors, flattened to ``[G, L, d]``;
    ``key_weights [..., H, m, K]`` or None. Returns the output, LSE, S2 and projections (None
    without ``key_weights``) in the input's leading shape."""
    lead, n_q, n_k = q.shape[:-2], q.shape[-2], k.shape[-2]
    q3, k3, v3 = (x.reshape(-1, *x.shape[-2:]) for x in (q, k, v))
    if key_mask is not None:
        key_mask = key_mask.expand(lead + (1, n_k)).reshape(-1, 1, n_k)
    if sampler.noise is not None:
        sampler.noise = sampler.noise.expand(lead + (n_q, n_k)).reshape(-1, n_q, n_k)
    weights3 = None if key_weights is None else key_weights.reshape(-1, *key_weights.shape[-2:])
    out, lse, sq, proj = _ChunkedNoisyAttention.apply(q3, k3, v3, key_mask, causal, scale, sampler, want_lse, want_sq,
                                                      weights3)
    return (out.view(lead + out.shape[-2:]), lse.view(lead + (n_q,)) if want_lse else lse,
            sq.view(lead + (n_q,)) if want_sq else sq,
            None if key_weights is None else proj.view(lead + proj.shape[-2:]))


def _triton_takes(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], noise: Optional[Tensor]) -> bool:
    """Whether the operator ``attention_suite::bam_attention`` takes this call: on CUDA (or the interpreter), no
    explicit noise, not float64, a tiling for the dtype and head size, and a key mask that spans every key.
    Decided from static facts, so that ``torch.compile`` traces the operator into the graph."""
    if noise is not None or q.dtype == torch.float64 or not use_triton(q, "dense_bam", behind_op=True):
        return False
    if mask is not None and mask.shape[-1] != k.shape[-2]:
        return False
    from .kernels import interpreting
    from .kernels.dense_bam import takes
    return takes(q.dtype, q.shape[-1], v.shape[-1], interpreting())


def _operator_attention(norm: BAM, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool,
                        scale: float, noise_scale: float, dropout: float, collect: bool) -> Tensor:
    """:func:`~common.attention.dense_bam_op.bam_attention` over ``[..., H, L, d]`` tensors (several leading
    dimensions are merged first), its KL added to the collector. Under a causal mask the KL (a fixed-prior
    Weibull's, :func:`~common.attention.bam_stats.supports`) is :func:`dense_kl` of the operator's ``LSE_i``."""
    from .dense_bam_op import bam_attention
    from .kernels.dense_bam import NOISE_LOGNORMAL, NOISE_NONE, NOISE_WEIBULL, seed_for_call
    from .kernels.dense_bam_kl import ACTIVATIONS, constants, kl_kind

    lead, (H, n_q) = q.shape[:-3], q.shape[-3:-1]
    n_k = k.shape[-2]
    flat = len(lead) != 1
    if flat:  # [B, H, L, d] for the kernels
        q, k, v = (x.reshape(-1, *x.shape[-3:]) for x in (q, k, v))
        if mask is not None:
            mask = mask.expand(lead + (H, 1, n_k)).reshape(-1, H, 1, n_k)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    noise_kind = NOISE_NONE if not noise_scale else (NOISE_WEIBULL if norm.posterior == "weibull" else NOISE_LOGNORMAL)
    kernel = norm.kl_kernel
    fused_kl = kl_kind(kernel) if collect and not causal else 0
    prior = norm.prior_net
    weights = [None] * 4
    if fused_kl and prior is not None:
        weights = [prior.hidden.weight, prior.hidden.bias, prior.out.weight, prior.out.bias]
    out, kl, stats = bam_attention(
        q, k, v, mask, seed_for_call(q.device), *weights, causal, scale, noise_kind, float(noise_scale),
        float(dropout), fused_kl, constants(kernel), norm.prior_scope == "all",
        ACTIVATIONS[prior.activation_name] if prior is not None else 0, collect and not fused_kl, False)
    if collect and fused_kl:
        add_aux_loss("bam_kl", kl)
    elif collect:  # a causal mask: the closed form with prefix sums, from the rows' LSE_i
        rows = q.shape[0] * H * n_q
        lse = stats[rows:2 * rows].view(q.shape[:-1])
        add_aux_loss("bam_kl", dense_kl(kernel, q.float(), k.float(), lse, scale=scale, causal=True,
                                        key_mask=None if mask is None else mask.squeeze(-2), sums_dtype=torch.float32))
    return out.view(lead + out.shape[-3:]) if flat else out


def fused_bam(attend, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool,
              need_maps: bool) -> Optional[Tensor]:
    """``Attend``'s output by :func:`dense_bam_attention` when nothing needs the weight matrix, else None.

    Taken when the normalizer is BAM, no map operator is on (position interactions,
    predictive/evolving, span, convoluted), ``need_maps`` is off, the mask is a key padding
    mask (per-query masks keep the materialised path), and, when the KL is collected, its
    closed form covers the mask (:func:`~common.attention.bam_stats.supports`). Under
    ``torch.compile`` only where the Triton operator takes the call (:func:`_triton_takes`):
    the CPU chunks are not traceable, and inductor fuses the materialised path itself. In evaluation
    without Monte Carlo sampling and without a KL collector, BAM is its posterior mean,
    softmax, and the call is ``F.scaled_dot_product_attention``.
    """
    norm = attend.normalizer
    if (not isinstance(norm, BAM) or need_maps or os.environ.get("ATTN_FUSED_BAM", "1") == "0"
            or (torch.compiler.is_compiling() and not _triton_takes(q, k, v, mask, None))
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
