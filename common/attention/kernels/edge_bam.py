r"""Edge-wise BAM (Fan et al., NeurIPS 2020, Sec. 3.2-3.3) as one Triton kernel per pass.

Over edges sorted by target (CSR pointer ``ptr``: the edges of node ``i`` are
``ptr[i]:ptr[i+1]``), one program per target node handles all heads of its segment:

* forward: the segment log-sum-exps of the scores ``s``, of the noisy scores
  ``z = s + scale * n`` and of the contextual prior's logits ``r`` (online, one sweep); then
  the sampled weights ``W = exp(z - lse(z))`` and the KL of every entry (Eq. 4, the closed
  forms of :class:`~common.attention.bam.WeibullGammaKL` / ``LognormalKL``) summed per segment;
* backward: the softmax backward of ``W`` and the log-softmax backwards of the KL through
  ``log p = s - lse(s)`` and ``log pi = r - lse(r)``.

With ``prior_scope="all"`` (the prior normalised over every key, as in the official GAT code)
``r`` arrives as ``log pi`` already and is used as it is.

The noise ``n`` (Weibull: ``log(-log u)``, Lognormal: ``eps``) comes from Philox at counter
``e * heads + h`` with a seed the kernels read from a device tensor (no host
synchronisation; a CUDA graph's replays draw fresh noise), and is drawn again in the backward
instead of being stored; only the three ``[nodes, heads]`` log-sum-exps are saved. Each segment
writes its share of the mean KL over every entry (the closed form's constant included), so the
mean is one sum. Whatever the dtype of the scores, the kernels compute in float32 (float64 for
float64 scores) and store the weights and gradients in the input dtype. They also take the noise
explicitly, which makes them equal to the PyTorch path of :class:`~common.attention.bam.BAM`.

:func:`forward` and :func:`backward` launch them for the custom operators of
:mod:`common.attention.edge_bam`, on CUDA (or in Triton's interpreter).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..edge_bam import Options, _compute_dtype
from .jit_utils import digamma, lgamma, upcast
from . import int_key, launch, precompile


@triton.jit
def _tile(scores_ptr, prior_ptr, noise_ptr, e, h, mask, H: tl.constexpr, seed, scale,
          NOISE: tl.constexpr, PRIOR: tl.constexpr, TINY: tl.constexpr, ONE_MINUS_EPS: tl.constexpr):
    """Scores, noisy scores and prior logits of one ``[BLOCK_E, BLOCK_H]`` tile."""
    idx = e[:, None] * H + h[None, :]
    s = upcast(tl.load(scores_ptr + idx, mask=mask, other=float("-inf")))
    if NOISE == 1:  # Weibull: log(-log u), u clamped to [tiny, 1 - eps]
        u = tl.minimum(tl.maximum(tl.rand(seed, idx), TINY), ONE_MINUS_EPS)  # float32
        z = s + scale * tl.log(-tl.log(u))
    elif NOISE == 2:
        z = s + scale * tl.randn(seed, idx)
    elif NOISE == 3:
        z = s + scale * upcast(tl.load(noise_ptr + idx, mask=mask, other=0.0))
    else:
        z = s
    if PRIOR:
        r = upcast(tl.load(prior_ptr + idx, mask=mask, other=float("-inf")))
    else:
        r = s
    return idx, s, z, r


@triton.jit
def _online_lse(m, l, x):
    """One step of the streaming log-sum-exp over the edges (axis 0) of a tile."""
    m_new = tl.maximum(m, tl.max(x, axis=0))
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    l = l * tl.exp(m - safe) + tl.sum(tl.exp(x - safe[None, :]), axis=0)
    return m_new, l


@triton.jit
def _finish_lse(m, l):
    """The log-sum-exp from its running maximum and sum; 0 for padded heads (no terms)."""
    return tl.where(l > 0, m + tl.log(tl.where(l > 0, l, 1.0)), 0.0)


@triton.jit
def _log_probs(s, r, mask, lse_s, lse_r):
    """``log p`` and ``log pi`` of a tile (0 on padding, which is selected away)."""
    return tl.where(mask, s - lse_s[None, :], 0.0), tl.where(mask, r - lse_r[None, :], 0.0)


@triton.jit
def _kl_terms(logp, log_pi, c0, c1, c2, KL: tl.constexpr, PRIOR: tl.constexpr, LOG_TINY: tl.constexpr):
    """Per-entry KL value, its derivative in ``log p`` and in ``log pi`` (bam.py's closed forms).

    Weibull (``c0 = log beta``, ``c1 = c``, ``c2 = fixed alpha``); Lognormal (``c0 = scale``,
    ``c1 = offset``).
    """
    if KL == 1:
        beta_p = tl.exp(logp + c0)
        if PRIOR:
            log_alpha = log_pi + c0
            alpha = tl.exp(tl.maximum(log_alpha, LOG_TINY))
            value = beta_p + lgamma(alpha) + alpha * (c1 - logp)
            d_logp = beta_p - alpha
            d_log_pi = tl.where(log_alpha < LOG_TINY, 0.0, (digamma(alpha) + c1 - logp) * alpha)
        else:
            value = beta_p - c2 * logp
            d_logp = beta_p - c2
            d_log_pi = d_logp
    else:
        diff = logp + c1
        if PRIOR:
            diff = diff - log_pi
        value = c0 * diff * diff
        d_logp = 2.0 * c0 * diff
        d_log_pi = -d_logp
    return value, d_logp, d_log_pi


@triton.jit
def _segment(ptr_ptr, H: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """This program's target node, its edges ``start:end``, the heads and the tile rows."""
    node = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    return node, tl.load(ptr_ptr + node), tl.load(ptr_ptr + node + 1), h, h < H, tl.arange(0, BLOCK_E)


@triton.jit
def _edge_bam_fwd(scores_ptr, prior_ptr, noise_ptr, ptr_ptr, weights_ptr, lse_ptr, kl_ptr,
                  seed_ptr, scale, c0, c1, c2, const, inv_count,
                  H: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
                  NOISE: tl.constexpr, PRIOR: tl.constexpr, PRIOR_NORMALIZED: tl.constexpr, KL: tl.constexpr,
                  TINY: tl.constexpr, ONE_MINUS_EPS: tl.constexpr, LOG_TINY: tl.constexpr):
    node, start, end, h, h_ok, rows = _segment(ptr_ptr, H, BLOCK_E, BLOCK_H)
    seed = tl.load(seed_ptr)
    neg_inf = upcast(tl.full([BLOCK_H], float("-inf"), scores_ptr.dtype.element_ty))
    zero = upcast(tl.zeros([BLOCK_H], scores_ptr.dtype.element_ty))
    m_s, l_s, m_z, l_z, m_r, l_r = neg_inf, zero, neg_inf, zero, neg_inf, zero
    for first in range(start, end, BLOCK_E):
        e = first + rows
        mask = (e < end)[:, None] & h_ok[None, :]
        _, s, z, r = _tile(scores_ptr, prior_ptr, noise_ptr, e, h, mask, H, seed, scale,
                           NOISE, PRIOR, TINY, ONE_MINUS_EPS)
        m_z, l_z = _online_lse(m_z, l_z, z)
        if KL != 0:
            m_s, l_s = _online_lse(m_s, l_s, s)
            if PRIOR and not PRIOR_NORMALIZED:  # else r is log pi already (lse_r stays 0)
                m_r, l_r = _online_lse(m_r, l_r, r)
    lse_z = _finish_lse(m_z, l_z)
    lse_s = _finish_lse(m_s, l_s)
    lse_r = _finish_lse(m_r, l_r)
    out = node * 3 * H + h
    tl.store(lse_ptr + out, lse_s, mask=h_ok)
    tl.store(lse_ptr + out + H, lse_z, mask=h_ok)
    tl.store(lse_ptr + out + 2 * H, lse_r, mask=h_ok)
    kl = zero
    for first in range(start, end, BLOCK_E):
        e = first + rows
        mask = (e < end)[:, None] & h_ok[None, :]
        idx, s, z, r = _tile(scores_ptr, prior_ptr, noise_ptr, e, h, mask, H, seed, scale,
                             NOISE, PRIOR, TINY, ONE_MINUS_EPS)
        tl.store(weights_ptr + idx, tl.exp(z - lse_z[None, :]).to(weights_ptr.dtype.element_ty), mask=mask)
        if KL != 0:
            logp, log_pi = _log_probs(s, r, mask, lse_s, lse_r)
            value, _, _ = _kl_terms(logp, log_pi, c0, c1, c2, KL, PRIOR, LOG_TINY)
            kl += tl.sum(tl.where(mask, value, 0.0), axis=0)
    # this segment's share of the mean over every entry, each entry's KL with its constant term
    kl_sum = tl.sum(tl.where(h_ok, kl, 0.0), axis=0) + const * ((end - start) * H).to(kl.dtype)
    tl.store(kl_ptr + node, kl_sum * inv_count)


@triton.jit
def _edge_bam_bwd(scores_ptr, prior_ptr, noise_ptr, ptr_ptr, lse_ptr, grad_w_ptr, grad_kl_ptr,
                  d_scores_ptr, d_prior_ptr, seed_ptr, scale, c0, c1, c2, const, inv_count,
                  H: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
                  NOISE: tl.constexpr, PRIOR: tl.constexpr, PRIOR_NORMALIZED: tl.constexpr, KL: tl.constexpr,
                  CENTRED: tl.constexpr,
                  GRAD_W: tl.constexpr, TINY: tl.constexpr, ONE_MINUS_EPS: tl.constexpr,
                  LOG_TINY: tl.constexpr):
    node, start, end, h, h_ok, rows = _segment(ptr_ptr, H, BLOCK_E, BLOCK_H)
    seed = tl.load(seed_ptr)
    out = node * 3 * H + h
    lse_s = tl.load(lse_ptr + out, mask=h_ok, other=0.0)
    lse_z = tl.load(lse_ptr + out + H, mask=h_ok, other=0.0)
    lse_r = tl.load(lse_ptr + out + 2 * H, mask=h_ok, other=0.0)
    g_kl = 0.0
    if KL != 0:
        g_kl = tl.load(grad_kl_ptr) * inv_count  # the mean's gradient, per entry
    zero = upcast(tl.zeros([BLOCK_H], scores_ptr.dtype.element_ty))
    sum_gw, sum_d, sum_dpi = zero, zero, zero
    for first in range(start, end, BLOCK_E):  # the segment sums of the three chain rules
        e = first + rows
        mask = (e < end)[:, None] & h_ok[None, :]
        idx, s, z, r = _tile(scores_ptr, prior_ptr, noise_ptr, e, h, mask, H, seed, scale,
                             NOISE, PRIOR, TINY, ONE_MINUS_EPS)
        if GRAD_W:
            g = upcast(tl.load(grad_w_ptr + idx, mask=mask, other=0.0))
            sum_gw += tl.sum(g * tl.where(mask, tl.exp(z - lse_z[None, :]), 0.0), axis=0)
        if KL != 0:
            logp, log_pi = _log_probs(s, r, mask, lse_s, lse_r)
            _, d_logp, d_log_pi = _kl_terms(logp, log_pi, c0, c1, c2, KL, PRIOR, LOG_TINY)
            sum_d += tl.sum(tl.where(mask, d_logp, 0.0), axis=0)
            if PRIOR and not PRIOR_NORMALIZED:
                sum_dpi += tl.sum(tl.where(mask, d_log_pi, 0.0), axis=0)
    for first in range(start, end, BLOCK_E):
        e = first + rows
        mask = (e < end)[:, None] & h_ok[None, :]
        idx, s, z, r = _tile(scores_ptr, prior_ptr, noise_ptr, e, h, mask, H, seed, scale,
                             NOISE, PRIOR, TINY, ONE_MINUS_EPS)
        d_s = tl.zeros_like(s)
        if GRAD_W:
            g = upcast(tl.load(grad_w_ptr + idx, mask=mask, other=0.0))
            d_s += tl.exp(z - lse_z[None, :]) * (g - sum_gw[None, :])
        if KL != 0:
            logp, log_pi = _log_probs(s, r, mask, lse_s, lse_r)
            _, d_logp, d_log_pi = _kl_terms(logp, log_pi, c0, c1, c2, KL, PRIOR, LOG_TINY)
            if CENTRED:  # sum_j d_logp = 0 (alpha = beta * pi): the log-softmax backward is the identity
                d_s += g_kl * d_logp
            else:
                d_s += g_kl * (d_logp - tl.exp(logp) * sum_d[None, :])
            if PRIOR and PRIOR_NORMALIZED:
                tl.store(d_prior_ptr + idx, (g_kl * d_log_pi).to(d_prior_ptr.dtype.element_ty), mask=mask)
            elif PRIOR:
                d_r = g_kl * (d_log_pi - tl.exp(log_pi) * sum_dpi[None, :])
                tl.store(d_prior_ptr + idx, d_r.to(d_prior_ptr.dtype.element_ty), mask=mask)
        tl.store(d_scores_ptr + idx, d_s.to(d_scores_ptr.dtype.element_ty), mask=mask)


def _launch_args(scores: Tensor, prior_logits: Optional[Tensor], noise: Optional[Tensor], options: Options) -> tuple:
    """The pointers standing in for absent inputs, the runtime constants after the seed, and the constexprs."""
    heads = scores.shape[1]
    block_h = triton.next_power_of_2(heads)
    uniform = torch.finfo(torch.float32)  # tl.rand draws float32
    inputs = (scores, scores if prior_logits is None else prior_logits, scores if noise is None else noise)
    constants = (options.scale, options.c0, options.c1, options.c2, options.const, 1.0 / max(scores.numel(), 1))
    constexprs = dict(H=heads, BLOCK_E=max(16, 128 // block_h), BLOCK_H=block_h, NOISE=options.noise,
                      PRIOR=options.prior, PRIOR_NORMALIZED=options.prior_normalized, KL=options.kl,
                      TINY=uniform.tiny, ONE_MINUS_EPS=1 - uniform.eps,
                      LOG_TINY=math.log(torch.finfo(_compute_dtype(scores.dtype)).tiny))
    return inputs, constants, constexprs


def forward(scores: Tensor, prior_logits: Optional[Tensor], noise: Optional[Tensor], ptr: Tensor, seed: Tensor,
            *options) -> Tuple[Tensor, Tensor, Tensor]:
    """``(weights, mean KL, lse)`` of contiguous ``scores [num_edges, heads]`` over the segments of ``ptr``
    (``lse [nodes, 3, heads]``: the log-sum-exps the backward pass reads), for the
    :class:`~common.attention.edge_bam.Options` ``options``. No autograd (the custom operator wraps this and
    :func:`backward`). The backward kernel is compiled and loaded here too, so that one that cannot run here
    fails in the forward."""
    options = Options(*options)
    num_nodes = ptr.numel() - 1
    weights = torch.empty_like(scores)
    lse = scores.new_empty(num_nodes, 3, scores.shape[1], dtype=_compute_dtype(scores.dtype))
    kl = scores.new_empty(num_nodes, dtype=lse.dtype)
    if num_nodes:  # (without a node there is no edge either, and no program to launch)
        inputs, constants, constexprs = _launch_args(scores, prior_logits, noise, options)
        launch("edge_bam", _edge_bam_fwd, (num_nodes,), *inputs, ptr, weights, lse, kl, seed, *constants,
               **constexprs)
        key = (scores.dtype, tuple(constexprs.items()), options.centred, int_key(num_nodes))
        for grad_w in (True, False):  # the backward kernel, with stand-ins of the gradients' dtypes
            precompile("edge_bam", key + (grad_w,), _edge_bam_bwd, (1,), *inputs, ptr, lse, weights, kl, weights,
                       inputs[1], seed, *constants, CENTRED=options.centred, GRAD_W=grad_w, **constexprs)
    return weights, kl.sum(), lse


def backward(scores: Tensor, prior_logits: Optional[Tensor], noise: Optional[Tensor], ptr: Tensor, seed: Tensor,
             lse: Tensor, grad_weights: Optional[Tensor], grad_kl: Optional[Tensor],
             *options) -> Tuple[Tensor, Tensor]:
    """``(d scores, d prior logits)`` of :func:`forward` for the gradients of its weights and mean KL (None:
    zero); the prior's is empty without prior logits."""
    options = Options(*options)
    num_nodes = ptr.numel() - 1
    d_scores = torch.empty_like(scores)
    d_prior = scores.new_empty(0) if prior_logits is None else torch.empty_like(prior_logits)
    if num_nodes:
        inputs, constants, constexprs = _launch_args(scores, prior_logits, noise, options)
        launch("edge_bam", _edge_bam_bwd, (num_nodes,), *inputs, ptr, lse,
               scores if grad_weights is None else grad_weights.contiguous(),
               lse.new_zeros(()) if grad_kl is None else grad_kl, d_scores,
               scores if prior_logits is None else d_prior, seed, *constants, CENTRED=options.centred,
               GRAD_W=grad_weights is not None, **constexprs)
    return d_scores, d_prior
