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
``offset + e * heads + h`` with a seed the kernels read from a device tensor (no host
synchronisation; a CUDA graph's replays draw fresh noise), and is drawn again in the backward
instead of being stored; only the three ``[nodes, heads]`` log-sum-exps are saved. Whatever the
dtype of the scores, the kernels compute in float32 (float64 for float64 scores) and store the
weights and gradients in the input dtype. :func:`edge_bam` also takes the noise explicitly,
which makes it equal to the PyTorch path of :class:`~common.attention.bam.BAM`.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import triton
import triton.language as tl
from torch import Tensor

from .jit_utils import upcast
from . import int_key, launch, precompile

#: Noise sources of the kernels.
NOISE_NONE, NOISE_WEIBULL, NOISE_NORMAL, NOISE_GIVEN = 0, 1, 2, 3
#: KL closed forms: none, Weibull-Gamma (fixed / contextual), Lognormal (fixed / contextual).
KL_NONE, KL_WEIBULL, KL_LOGNORMAL = 0, 1, 2


@triton.jit
def _lgamma(x):
    """``log Gamma(x)`` for ``x > 0``: six recurrence steps up, then Stirling's series."""
    shift = tl.zeros_like(x)
    for _ in tl.static_range(6):
        small = x < 6.0
        shift = tl.where(small, shift - tl.log(x), shift)
        x = tl.where(small, x + 1.0, x)
    inv = 1.0 / x
    inv2 = inv * inv
    series = inv * (1.0 / 12 - inv2 * (1.0 / 360 - inv2 * (1.0 / 1260 - inv2 / 1680)))
    return shift + (x - 0.5) * tl.log(x) - x + 0.9189385332046727 + series


@triton.jit
def _digamma(x):
    """``psi(x)`` for ``x > 0``: six recurrence steps up, then the asymptotic series."""
    shift = tl.zeros_like(x)
    for _ in tl.static_range(6):
        small = x < 6.0
        shift = tl.where(small, shift - 1.0 / x, shift)
        x = tl.where(small, x + 1.0, x)
    inv = 1.0 / x
    inv2 = inv * inv
    series = inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (1.0 / 240 - inv2 / 132))))
    return shift + tl.log(x) - 0.5 * inv - series


@triton.jit
def _tile(scores_ptr, prior_ptr, noise_ptr, e, h, mask, H: tl.constexpr, seed, offset, scale,
          NOISE: tl.constexpr, PRIOR: tl.constexpr, TINY: tl.constexpr, ONE_MINUS_EPS: tl.constexpr):
    """Scores, noisy scores and prior logits of one ``[BLOCK_E, BLOCK_H]`` tile."""
    idx = e[:, None] * H + h[None, :]
    s = upcast(tl.load(scores_ptr + idx, mask=mask, other=float("-inf")))
    if NOISE == 1:  # Weibull: log(-log u), u clamped to [tiny, 1 - eps]
        u = tl.minimum(tl.maximum(tl.rand(seed, idx + offset), TINY), ONE_MINUS_EPS)  # float32
        z = s + scale * tl.log(-tl.log(u))
    elif NOISE == 2:
        z = s + scale * tl.randn(seed, idx + offset)
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
            value = beta_p + _lgamma(alpha) + alpha * (c1 - logp)
            d_logp = beta_p - alpha
            d_log_pi = tl.where(log_alpha < LOG_TINY, 0.0, (_digamma(alpha) + c1 - logp) * alpha)
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


@triton.jit(do_not_specialize=["offset"])
def _edge_bam_fwd(scores_ptr, prior_ptr, noise_ptr, ptr_ptr, weights_ptr, lse_ptr, kl_ptr,
                  seed_ptr, offset, scale, c0, c1, c2,
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
        _, s, z, r = _tile(scores_ptr, prior_ptr, noise_ptr, e, h, mask, H, seed, offset, scale,
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
        idx, s, z, r = _tile(scores_ptr, prior_ptr, noise_ptr, e, h, mask, H, seed, offset, scale,
                             NOISE, PRIOR, TINY, ONE_MINUS_EPS)
        tl.store(weights_ptr + idx, tl.exp(z - lse_z[None, :]).to(weights_ptr.dtype.element_ty), mask=mask)
        if KL != 0:
            logp, log_pi = _log_probs(s, r, mask, lse_s, lse_r)
            value, _, _ = _kl_terms(logp, log_pi, c0, c1, c2, KL, PRIOR, LOG_TINY)
            kl += tl.sum(tl.where(mask, value, 0.0), axis=0)
    if KL != 0:
        tl.store(kl_ptr + node, tl.sum(tl.where(h_ok, kl, 0.0), axis=0))


@triton.jit(do_not_specialize=["offset"])
def _edge_bam_bwd(scores_ptr, prior_ptr, noise_ptr, ptr_ptr, lse_ptr, grad_w_ptr, grad_kl_ptr,
                  d_scores_ptr, d_prior_ptr, seed_ptr, offset, scale, c0, c1, c2,
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
        g_kl = tl.load(grad_kl_ptr + node)
    zero = upcast(tl.zeros([BLOCK_H], scores_ptr.dtype.element_ty))
    sum_gw, sum_d, sum_dpi = zero, zero, zero
    for first in range(start, end, BLOCK_E):  # the segment sums of the three chain rules
        e = first + rows
        mask = (e < end)[:, None] & h_ok[None, :]
        idx, s, z, r = _tile(scores_ptr, prior_ptr, noise_ptr, e, h, mask, H, seed, offset, scale,
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
        idx, s, z, r = _tile(scores_ptr, prior_ptr, noise_ptr, e, h, mask, H, seed, offset, scale,
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


class _Config:
    """The constants of one BAM normalizer, as the kernels take them."""

    def __init__(self, bam, sampling: bool, with_kl: bool, given_noise: bool, dtype: torch.dtype):
        weibull = bam.posterior == "weibull"
        contextual = bam.prior_net is not None
        self.noise = NOISE_NONE if not sampling else NOISE_GIVEN if given_noise else \
            NOISE_WEIBULL if weibull else NOISE_NORMAL
        self.scale = bam.noise_scale
        self.prior = contextual and with_kl
        self.prior_normalized = bam.prior_scope == "all"  # r is log pi, normalised over every key
        self.kl = KL_NONE if not with_kl else KL_WEIBULL if weibull else KL_LOGNORMAL
        kernel = bam.kl_kernel
        self.const = kernel.const
        self.centred = bool(kernel.centred_score_grad)
        if weibull:
            self.c = (kernel.log_beta, kernel.c, 0.0 if contextual else kernel.alpha)
        else:
            self.c = (kernel.scale, kernel.offset, 0.0)
        uniform = torch.finfo(torch.float32)  # tl.rand draws float32
        self.tiny, self.one_minus_eps = uniform.tiny, 1 - uniform.eps
        self.log_tiny = math.log(torch.finfo(torch.promote_types(dtype, torch.float32)).tiny)  # the compute dtype

    def constexprs(self) -> dict:
        return dict(NOISE=self.noise, PRIOR=self.prior, PRIOR_NORMALIZED=self.prior_normalized, KL=self.kl,
                    TINY=self.tiny,
                    ONE_MINUS_EPS=self.one_minus_eps, LOG_TINY=self.log_tiny)


def _blocks(heads: int) -> Tuple[int, int]:
    block_h = triton.next_power_of_2(heads)
    return max(16, 128 // block_h), block_h


class _EdgeBAM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: Tensor, prior_logits: Optional[Tensor], noise: Optional[Tensor], ptr: Tensor,
                config: _Config, seed: Tensor, offset: int) -> Tuple[Tensor, Tensor]:
        num_nodes, heads = ptr.numel() - 1, scores.shape[1]
        weights = torch.empty_like(scores)
        compute = torch.promote_types(scores.dtype, torch.float32)
        lse = scores.new_empty(num_nodes, 3, heads, dtype=compute)
        kl = scores.new_zeros(num_nodes, dtype=compute)
        block_e, block_h = _blocks(heads)
        dummy = scores
        inputs = (scores, dummy if prior_logits is None else prior_logits, dummy if noise is None else noise, ptr)
        constants = (seed, offset, config.scale, *config.c)
        blocks = dict(H=heads, BLOCK_E=block_e, BLOCK_H=block_h, **config.constexprs())
        launch("edge_bam", _edge_bam_fwd, (num_nodes,), *inputs, weights, lse, kl, *constants, **blocks)
        if any(ctx.needs_input_grad[:2]):  # the backward kernel, with stand-ins of the gradients' dtypes
            key = (scores.dtype, tuple(blocks.items()), config.centred, int_key(num_nodes))
            for grad_w in (True, False):
                precompile("edge_bam", key + (grad_w,), _edge_bam_bwd, (1,), *inputs, lse, weights, kl, weights,
                           inputs[1], *constants, CENTRED=config.centred, GRAD_W=grad_w, **blocks)
        ctx.save_for_backward(scores, prior_logits, noise, ptr, lse, seed)
        ctx.config, ctx.offset = config, offset
        return weights, kl

    @staticmethod
    def backward(ctx, grad_weights: Optional[Tensor], grad_kl: Optional[Tensor]):
        scores, prior_logits, noise, ptr, lse, seed = ctx.saved_tensors
        config = ctx.config
        num_nodes, heads = ptr.numel() - 1, scores.shape[1]
        d_scores = torch.empty_like(scores)
        d_prior = None if prior_logits is None else torch.empty_like(prior_logits)
        block_e, block_h = _blocks(heads)
        dummy = scores
        launch("edge_bam", _edge_bam_bwd, (num_nodes,),
               scores, dummy if prior_logits is None else prior_logits, dummy if noise is None else noise,
               ptr, lse, dummy if grad_weights is None else grad_weights.contiguous(),
               lse.new_zeros(num_nodes) if grad_kl is None else grad_kl.contiguous(), d_scores,
               dummy if d_prior is None else d_prior,
               seed, ctx.offset, config.scale, *config.c,
               H=heads, BLOCK_E=block_e, BLOCK_H=block_h, CENTRED=config.centred,
               GRAD_W=grad_weights is not None, **config.constexprs())
        return d_scores, d_prior, None, None, None, None, None


def edge_bam(bam, scores: Tensor, ptr: Tensor, prior_logits: Optional[Tensor] = None, *,
             noise: Optional[Tensor] = None, sampling: bool = True, with_kl: bool = True,
             seed: Optional[Union[int, Tensor]] = None, offset: int = 0) -> Tuple[Tensor, Optional[Tensor]]:
    """The weights and the mean KL of :class:`~common.attention.bam.BAM` ``bam`` over
    target-sorted edges, by the fused kernels.

    Args:
        scores: ``[num_edges, heads]``, in the order of ``ptr``.
        ptr: ``[num_nodes + 1]`` CSR pointer of the targets.
        prior_logits: ``[num_edges, heads]`` contextual prior logits (contextual priors only).
        noise: the standard log-noise (``log(-log u)`` or ``eps``, ``[num_edges, heads]``);
            ``None`` draws it in the kernel from Philox at ``seed`` (an int or a one-element integer
            tensor) and ``offset``; ``seed`` defaults to one drawn on the device from torch's
            generator, so ``torch.manual_seed`` repeats it and nothing is read back to the host.
        sampling: ``False`` gives the posterior mean (softmax) and no noise.
        with_kl: whether to compute the KL (``None`` is returned otherwise).
    """
    if scores.dim() != 2 or (prior_logits is not None and prior_logits.shape != scores.shape):
        raise ValueError(f"edge_bam takes scores [num_edges, heads] and prior logits of the same shape, got "
                         f"{tuple(scores.shape)} and {None if prior_logits is None else tuple(prior_logits.shape)}")
    config = _Config(bam, sampling, with_kl, noise is not None, scores.dtype)
    if config.prior and prior_logits is None:
        raise ValueError(f"{bam.extra_repr()}: a contextual prior needs prior_logits=...")
    if seed is None:
        seed = torch.randint(0, 2**31 - 1, (1,), device=scores.device)
    elif not isinstance(seed, Tensor):
        seed = torch.full((1,), int(seed), dtype=torch.int64, device=scores.device)  # no host-to-device copy
    scores = scores.contiguous()
    prior_logits = prior_logits.contiguous() if config.prior else None
    noise = noise.to(scores.dtype).contiguous() if config.noise == NOISE_GIVEN else None
    weights, kl = _EdgeBAM.apply(scores, prior_logits, noise, ptr.contiguous(), config, seed, offset)
    if not with_kl:
        return weights, None
    return weights, kl.sum() / max(scores.numel(), 1) + config.const


def bam_normalize(bam, scores: Tensor, groups, keys=None, key_index=None, noise: Optional[Tensor] = None) -> Tensor:
    """:meth:`BAM.normalize <common.attention.bam.BAM.normalize>` for edge-wise groups with a
    CSR pointer (``groups.ptr``), by :func:`edge_bam`: the same weights and ``"bam_kl"``."""
    from ..aux import add_aux_loss, collecting

    flat = scores.dim() == 1
    scores2d = scores.view(-1, 1) if flat else scores
    with_kl = collecting()
    prior_logits = None
    if with_kl and bam.prior_net is not None:
        prior_logits = bam._prior_logits(scores, groups, keys, key_index).expand_as(scores).reshape(scores2d.shape)
    if noise is not None:
        noise = noise.reshape(scores2d.shape)
    weights, kl = edge_bam(bam, scores2d, groups.ptr, prior_logits, noise=noise, sampling=bam.sampling,
                           with_kl=with_kl)
    if with_kl:
        add_aux_loss("bam_kl", kl)
    return weights.view_as(scores)
