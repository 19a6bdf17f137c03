"""Closed forms and samplers of the Bayesian attention modules (Fan et al., 2020), and
alpha-entmax by bisection over any layout (Peters et al., 2019).

Everything works in log space: the BAM sample is ``softmax(logits + noise)`` (the constant
``-lgamma(1 + 1/k)`` or ``-sigma^2/2`` shifts cancel inside the softmax), and the KL terms
take ``log(lambda)`` / ``mu`` directly so no ``log(p + eps)`` is ever formed.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

EULER_GAMMA = 0.5772156649015329


def _as_tensor(x, like: Tensor) -> Tensor:
    # torch.full fills on the device; torch.as_tensor of a number copies it from host memory (a GPU sync)
    return x if isinstance(x, Tensor) else torch.full((), x, dtype=like.dtype, device=like.device)


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def lgamma_positive(x: Tensor) -> Tensor:
    """``log Gamma(x)`` for ``0 < x < 1e9`` (see :func:`lgamma_digamma_positive`)."""
    return lgamma_digamma_positive(x, with_digamma=False)[0]


def digamma_positive(x: Tensor) -> Tensor:
    """``psi(x)`` for ``0 < x < 1e9`` (see :func:`lgamma_digamma_positive`)."""
    return lgamma_digamma_positive(x)[1]


def lgamma_digamma_positive(x: Tensor, with_digamma: bool = True):
    """``(log Gamma(x), psi(x))`` (``psi`` only ``with_digamma``) for ``0 < x < 1e9``, sharing
    their passes: both are shifted to ``y = x + 6``, where Stirling's and the asymptotic series
    converge, by ``prod_{k<6} (x+k) = w (w+4) (w+6)`` and ``sum_{k<6} 1/(x+k) = (2x+5) (1/w +
    1/(w+4) + 1/(w+6))`` with ``w = x (x+5)`` (the pairs ``k, 5-k``). On CPU these vectorised
    passes beat ATen's scalar loops (about 40 ns an element each); other devices use
    ``torch.lgamma`` / ``torch.digamma``."""
    if x.device.type != "cpu":
        return torch.lgamma(x), (torch.digamma(x) if with_digamma else None)
    # ordered (and in place) so that few temporaries are alive at once
    x5 = x + 5.0
    w = x5 * x
    w4, w6 = w + 4.0, w + 6.0
    lgamma = (w * w4).log_().add_(w6.log()).neg_()  # w (w+4) < 1e38 for x < 1e9
    y = x5 + 1.0
    inv = y.reciprocal()
    log_y = y.log()
    lgamma.sub_(y).add_(_HALF_LOG_2PI).addcmul_(y.sub_(0.5), log_y)
    del y
    inv2 = inv.square()
    lgamma.add_(inv2.mul(-1 / 1680).add_(1 / 1260).mul_(inv2).sub_(1 / 360).mul_(inv2).add_(1 / 12).mul_(inv))
    if not with_digamma:
        return lgamma, None
    series = inv2.mul(-1 / 132).add_(1 / 240).mul_(inv2).sub_(1 / 252).mul_(inv2).add_(1 / 120).mul_(inv2)
    digamma = log_y.sub_(inv.mul_(0.5)).add_(series.sub_(1 / 12).mul_(inv2))
    del inv, inv2, series
    shift = w.reciprocal_().add_(w4.reciprocal_()).add_(w6.reciprocal_()).mul_(x5.add_(x))
    return lgamma, digamma.sub_(shift)


def kl_weibull_gamma_log(k, log_lam: Tensor, alpha, beta) -> Tensor:
    r"""KL(Weibull(k, lambda) || Gamma(alpha, beta)) from ``log(lambda)`` (BAM paper, Sec. 3.2):

    .. math:: \frac{\gamma\alpha}{k} - \alpha\log\lambda + \log k + \beta\lambda\Gamma(1+\frac1k)
              - \gamma - 1 - \alpha\log\beta + \log\Gamma(\alpha)
    """
    k = _as_tensor(k, log_lam)
    alpha = _as_tensor(alpha, log_lam)
    beta = _as_tensor(beta, log_lam)
    lam_mean = torch.exp(log_lam + torch.lgamma(1 + 1 / k))  # lambda * Gamma(1 + 1/k), the Weibull mean
    return (
        EULER_GAMMA * alpha / k
        - alpha * log_lam
        + torch.log(k)
        + beta * lam_mean
        - EULER_GAMMA
        - 1
        - alpha * torch.log(beta)
        + torch.lgamma(alpha)
    )


def kl_weibull_gamma(k, lam: Tensor, alpha, beta) -> Tensor:
    """KL(Weibull(k, lam) || Gamma(alpha, beta)), elementwise; see :func:`kl_weibull_gamma_log`."""
    return kl_weibull_gamma_log(k, torch.log(lam), alpha, beta)


def kl_lognormal(mu_q: Tensor, sigma_q, mu_p, sigma_p) -> Tensor:
    r"""KL(Lognormal(mu_q, sigma_q^2) || Lognormal(mu_p, sigma_p^2)) (BAM paper, Sec. 3.2):

    .. math:: \log\frac{\sigma_p}{\sigma_q} + \frac{\sigma_q^2 + (\mu_q-\mu_p)^2}{2\sigma_p^2} - \frac12
    """
    sigma_q = _as_tensor(sigma_q, mu_q)
    sigma_p = _as_tensor(sigma_p, mu_q)
    return (
        torch.log(sigma_p / sigma_q)
        + (sigma_q**2 + (mu_q - mu_p) ** 2) / (2 * sigma_p**2)
        - 0.5
    )


def weibull_log_noise(like: Tensor, k: float, generator: Optional[torch.Generator] = None) -> Tensor:
    r"""``(1/k) log(-log(u))``, u ~ U(0,1): the log of a Weibull(k, 1) sample (BAM Sec. 3.2,
    ``S = lambda (-log(1-u))^{1/k}``, with ``1-u`` as uniform as ``u``).

    ``u`` is kept inside ``[tiny, 1 - eps]`` so the noise is always finite.
    """
    u = torch.rand_like(like) if generator is None else \
        torch.rand(like.shape, dtype=like.dtype, device=like.device, generator=generator)  # *_like: torch.compile
    return log_weibull_(u, k)


def log_weibull_(u: Tensor, k: float) -> Tensor:
    """:func:`weibull_log_noise` from its uniform samples ``u``, in place of ``u``."""
    u.clamp_(torch.finfo(u.dtype).tiny, 1 - torch.finfo(u.dtype).eps)
    noise = u.log_().neg_().log_()
    return noise if k == 1 else noise.div_(k)


def lognormal_log_noise(like: Tensor, sigma: float, generator: Optional[torch.Generator] = None) -> Tensor:
    """``sigma * eps``, eps ~ N(0, 1): the log of a Lognormal(0, sigma^2) sample."""
    noise = torch.randn_like(like) if generator is None else \
        torch.randn(like.shape, dtype=like.dtype, device=like.device, generator=generator)
    return noise if sigma == 1 else noise.mul_(sigma)


# --------------------------------------------------------------------------- entmax ---
def entmax_bisect_groups(scores: Tensor, alpha, groups, n_iter: Optional[int] = None) -> Tensor:
    r"""alpha-entmax of every group by bisection on the threshold tau (Blondel et al., 2019):

    .. math:: \mathrm{entmax}_\alpha(z)_j = [(\alpha-1)z_j - \tau]_+^{1/(\alpha-1)},\quad \sum_j = 1

    ``groups`` is a :class:`~common.attention.groups.DenseGroups` or ``EdgeGroups``; ``alpha``
    is a float or a tensor broadcasting against the per-group values (values in (1, 2]).
    The threshold lives per group, so an iteration costs one gather and one group sum.
    ``n_iter`` defaults to the mantissa bits of the dtype plus 8 (31 for float32, 60 for
    float64), after which halving the bracket no longer changes ``tau``. Gradients for
    scores and alpha are analytic (the ``entmax`` package's formulas, applied per group).
    """
    if n_iter is None:
        n_iter = bisect_iterations(scores.dtype)
    if not isinstance(alpha, Tensor):
        alpha = scores.new_full((), float(alpha))  # (new_tensor would copy from the host: a GPU sync)
    return _EntmaxBisectGroups.apply(scores, alpha, groups, n_iter)


def bisect_iterations(dtype: torch.dtype) -> int:
    """Bisection steps after which the bracket is below the dtype's resolution (mantissa bits + 8)."""
    return round(-math.log2(torch.finfo(dtype).eps)) + 8


def _power(x: Tensor, exponent) -> Tensor:
    """``x ** exponent`` with fast paths for sparsemax (1) and 1.5-entmax (2)."""
    if not isinstance(exponent, Tensor) or exponent.dim() == 0:
        e = float(exponent)
        if e == 1.0:
            return x
        if e == 2.0:
            return x.square()
    return x.pow(exponent)


class _EntmaxBisectGroups(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: Tensor, alpha: Tensor, groups, n_iter: int) -> Tensor:
        exponent = 1 / (alpha - 1)
        x = groups.fill(scores * (alpha - 1), float("-inf"))
        top = groups.max(x)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # fully masked rows
        size = groups.size(scores).clamp_min(1)
        tau_lo = top - 1
        width = 1 - size.pow(1 - alpha)  # tau_hi - tau_lo, tau_hi = top - (1/d)^(alpha-1)

        def mass(tau: Tensor) -> Tensor:
            return _power((x - groups.expand(tau)).clamp_min_(0), exponent)

        f_lo = groups.sum(mass(tau_lo)) - 1
        for _ in range(n_iter):
            width = width / 2
            tau_mid = tau_lo + width
            p = mass(tau_mid)
            f_mid = groups.sum(p) - 1
            tau_lo = torch.where(f_mid * f_lo >= 0, tau_mid, tau_lo)
        total = groups.expand(groups.sum(p)).clamp_min(torch.finfo(p.dtype).tiny)
        p = groups.zero_masked(p / total)
        ctx.save_for_backward(p, alpha)
        ctx.groups = groups
        return p

    @staticmethod
    def backward(ctx, grad: Tensor):
        p, alpha = ctx.saved_tensors
        groups = ctx.groups
        tiny = torch.finfo(p.dtype).tiny
        positive = p > 0
        zero = p.new_zeros(())
        gppr = torch.where(positive, p.clamp_min(tiny).pow(2 - alpha), zero)
        gppr_sum = groups.expand(groups.sum(gppr)).clamp_min(tiny)
        d_scores = grad * gppr
        d_scores = d_scores - groups.expand(groups.sum(d_scores)) / gppr_sum * gppr
        d_alpha = None
        if ctx.needs_input_grad[1]:
            plogp = torch.where(positive, p * torch.log(p.clamp_min(tiny)), zero)
            entropy = groups.expand(groups.sum(plogp))
            skewed = gppr / gppr_sum
            d_alpha = grad * (p - skewed) / (alpha - 1) ** 2 - grad * (plogp - skewed * entropy) / (alpha - 1)
            d_alpha = groups.zero_masked(d_alpha)
        return d_scores, d_alpha, None, None
