"""Bayesian attention modules (Fan, Zhang, Chen & Zhou, NeurIPS 2020).

Unnormalised weights ``S`` are drawn from a Weibull or Lognormal posterior whose mean is
``exp(logits)``; the attention is ``W = S / sum_j S`` (Sec. 3.2). In log space, with
``p = softmax(logits)``:

* Weibull(k, lambda), ``lambda = p / Gamma(1 + 1/k)``: ``W = softmax(logits + log(-log(1-u)) / k)``
* Lognormal(mu, sigma^2), ``mu = log p - sigma^2/2``: ``W = softmax(logits + sigma * eps)``

The prior is fixed (Gamma(alpha, beta) / Lognormal(mu_p, sigma_p^2)) or key-contextual
(Sec. 3.3): ``pi = softmax_j(F2(relu(F1(k_j))))`` over the keys of each query (or over every
key, unmasked, with ``prior_scope="all"`` as in the official GAT code), then
``alpha = beta * pi`` (Gamma) or ``mu_p = log pi - sigma_p^2/2`` (Lognormal, so that the
prior mean is ``pi`` just as the posterior mean is ``p``; the official code omits the
``-sigma_p^2/2``, which only matters when ``sigma_p != sigma_q``).

The analytic KL (Eq. 4) is averaged over real (unmasked) entries of every head and added
to the active :func:`~common.attention.aux_losses` collector as ``"bam_kl"``, with its
gradient. Training samples; evaluation uses the posterior mean, which is plain softmax,
unless :func:`~common.attention.mc_sampling` is on.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from . import edge_bam
from .aux import add_aux_loss, collecting
from .base import Normalizer
from .functional import EULER_GAMMA, lgamma_digamma_positive, lognormal_log_noise, weibull_log_noise
from .groups import EdgeGroups, make_groups
from .kernels import KernelFailure, fall_back

POSTERIORS = ("weibull", "lognormal")
PRIORS = ("fixed", "contextual")
PRIOR_SCOPES = ("neighbors", "all")


class HeadLinear(nn.Module):
    """One ``Linear(in, out)`` per head, applied to ``x [..., heads, in]`` -> ``[..., heads, out]``."""

    def __init__(self, heads: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(heads, in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(heads, out_features))

    def forward(self, x: Tensor) -> Tensor:
        return torch.einsum("...hi,hio->...ho", x, self.weight) + self.bias


class ContextualPrior(nn.Module):
    """``F2(act(F1(k)))``: one prior logit per key (BAM Sec. 3.3), by one network shared by all
    heads (default) or, with ``heads``, one network per head (the official GAT code, whose every
    attention head is built separately)."""

    def __init__(self, key_dim: int, d_mid: int = 10, activation: str = "relu", heads: Optional[int] = None):
        super().__init__()
        activations = {"relu": nn.ReLU(), "leaky_relu": nn.LeakyReLU(0.1), "tanh": nn.Tanh()}
        if activation not in activations:
            raise ValueError(f"prior activation must be one of {sorted(activations)}, got {activation!r}")
        self.heads, self.activation_name = heads, activation
        if heads is None:
            self.hidden, self.out = nn.Linear(key_dim, d_mid), nn.Linear(d_mid, 1)
        else:
            self.hidden, self.out = HeadLinear(heads, key_dim, d_mid), HeadLinear(heads, d_mid, 1)
        self.activation = activations[activation]
        # The official code's initialisation: N(0, 1/key_dim) and N(0, 1/d_mid), zero bias.
        nn.init.normal_(self.hidden.weight, std=math.sqrt(1 / key_dim))
        nn.init.normal_(self.out.weight, std=math.sqrt(1 / d_mid))
        nn.init.zeros_(self.hidden.bias)
        nn.init.zeros_(self.out.bias)

    def forward(self, keys: Tensor, head_axis: int = -2) -> Tensor:
        """Logits ``keys.shape[:-1]``; per-head networks read the heads on ``head_axis`` (< -1)."""
        if self.heads is None:  # feature-major: [d_mid, keys] products are several times faster on CPU
            hidden = torch.addmm(self.hidden.bias.view(-1, 1), self.hidden.weight, keys.reshape(-1, keys.shape[-1]).t())
            out = torch.addmm(self.out.bias.view(1, 1), self.out.weight, self.activation(hidden))
            return out.view(keys.shape[:-1])
        if keys.dim() < -head_axis or keys.shape[head_axis] != self.heads:
            raise ValueError(f"per-head prior networks need keys with {self.heads} heads on dim {head_axis}, "
                             f"got shape {tuple(keys.shape)}")
        x = keys.movedim(head_axis, -2)
        out = self.out(self.activation(self.hidden(x))).squeeze(-1)  # [..., heads]
        return out.movedim(-1, head_axis + 1)


def freeze_priors(model: nn.Module) -> int:
    """Freeze every :class:`ContextualPrior` of ``model`` for a run without the KL, the only term that trains them:
    they get no gradient, for which DistributedDataParallel would wait (call it before wrapping); how many."""
    priors = [module for module in model.modules() if isinstance(module, ContextualPrior)]
    for prior in priors:
        prior.requires_grad_(False)
    return len(priors)


class BAM(Normalizer):
    """Stochastic attention with a Weibull or Lognormal posterior and a fixed or contextual prior.

    Args:
        posterior: ``"weibull"`` or ``"lognormal"``.
        prior: ``"fixed"`` or ``"contextual"`` (needs ``key_dim`` and ``keys`` at call time).
        k: Weibull shape; larger is closer to deterministic softmax (noise std ~ 1.28/k).
        sigma: Lognormal posterior std in log space; smaller is closer to softmax.
        prior_sigma: Lognormal prior std (defaults to ``sigma``).
        beta: Gamma prior rate (contextual prior: ``alpha = beta * pi``).
        prior_alpha: Gamma prior shape of the fixed prior.
        prior_mu: Lognormal prior location of the fixed prior.
        d_mid: hidden size of the contextual prior network.
        key_dim: size of each key vector (contextual prior).
        prior_activation: ``relu`` (default), ``leaky_relu`` or ``tanh``.
        prior_scope: keys the contextual prior is normalised over: ``"neighbors"`` (default), those
            each query may attend (a graph node's neighbourhood, the unmasked keys), so that the
            prior mean ``pi`` lives on the same simplex as the posterior mean ``p`` (the paper's
            Eq. 4 compares the two attentions; the official ALBERT code masks it so); ``"all"``,
            every key with no mask, as the official GAT code does (over all N nodes, which
            makes ``pi`` on a neighbourhood about degree/N and weakens the KL's pull).
        prior_per_head: one contextual prior network per head (needs ``num_heads``; the official
            GAT code) instead of one shared by all heads.
    """

    stochastic = True

    def __init__(
        self,
        posterior: str = "weibull",
        prior: str = "contextual",
        *,
        k: float = 10.0,
        sigma: float = 0.1,
        prior_sigma: Optional[float] = None,
        beta: float = 1.0,
        prior_alpha: float = 1.0,
        prior_mu: float = 0.0,
        d_mid: int = 10,
        key_dim: Optional[int] = None,
        num_heads: Optional[int] = None,
        prior_activation: str = "relu",
        prior_scope: str = "neighbors",
        prior_per_head: bool = False,
    ):
        super().__init__()
        if posterior not in POSTERIORS:
            raise ValueError(f"posterior must be one of {POSTERIORS}, got {posterior!r}")
        if prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")
        if prior_scope not in PRIOR_SCOPES:
            raise ValueError(f"prior_scope must be one of {PRIOR_SCOPES}, got {prior_scope!r}")
        if k <= 0 or sigma <= 0 or beta <= 0 or prior_alpha <= 0:
            raise ValueError("k, sigma, beta and prior_alpha must be positive")
        self.posterior, self.prior_type = posterior, prior
        self.k, self.sigma, self.beta = float(k), float(sigma), float(beta)
        self.prior_sigma = float(sigma if prior_sigma is None else prior_sigma)
        self.prior_alpha, self.prior_mu = float(prior_alpha), float(prior_mu)
        self.prior_scope = prior_scope
        self.prior_net: Optional[ContextualPrior] = None
        if prior == "contextual":
            if key_dim is None:
                raise ValueError(
                    "a contextual prior needs key_dim=<size of each key vector> "
                    "(e.g. build('bam-wc', key_dim=64)) and keys=... at call time"
                )
            if prior_per_head and num_heads is None:
                raise ValueError("prior_per_head needs num_heads=<number of attention heads>")
            self.prior_net = ContextualPrior(key_dim, d_mid, prior_activation, num_heads if prior_per_head else None)

    def extra_repr(self) -> str:
        spread = f"k={self.k}" if self.posterior == "weibull" else f"sigma={self.sigma}"
        scope = f", prior_scope={self.prior_scope}" if self.prior_scope != "neighbors" else ""
        return f"posterior={self.posterior}, prior={self.prior_type}, {spread}{scope}"

    # ------------------------------------------------------------------ forward ----
    def normalize(self, scores: Tensor, groups, keys=None, key_index=None, noise: Optional[Tensor] = None) -> Tensor:
        """``noise``: the standard log-noise to use instead of a fresh draw (``log(-log u)`` or
        ``eps``, shaped like ``scores``), e.g. to compare with the fused kernels."""
        if isinstance(groups, EdgeGroups) and groups.ptr is not None and edge_bam.fused(scores):
            try:  # the fused kernels over the target-sorted edges
                return edge_bam.bam_normalize(self, scores, groups, keys, key_index, noise)
            except KernelFailure as failure:  # cannot compile or run on this GPU: warn once, PyTorch path from now on
                fall_back(failure)
        if self.sampling:
            noise = self._log_noise(scores) if noise is None else noise
            weights = groups.softmax(torch.add(scores, noise, alpha=self.noise_scale))
        else:
            weights = groups.softmax(scores)  # the posterior mean: E[S] = exp(logits)
        if collecting():
            add_aux_loss("bam_kl", self._kl(scores, groups, keys, key_index))
        return weights

    def _log_noise(self, scores: Tensor) -> Tensor:
        """Standard log-noise; :attr:`noise_scale` is applied in the same pass as the add."""
        if self.posterior == "weibull":
            return weibull_log_noise(scores, 1.0)
        return lognormal_log_noise(scores, 1.0)

    @property
    def noise_scale(self) -> float:
        """The scale of the standard log-noise: ``1/k`` (Weibull) or ``sigma`` (Lognormal)."""
        return 1.0 / self.k if self.posterior == "weibull" else self.sigma

    # ------------------------------------------------------------------ prior ------
    def _prior_logits(self, scores: Tensor, groups, keys, key_index) -> Tensor:
        """The contextual prior's logits ``F2(act(F1(k_j)))``, laid out like ``scores``; with
        ``prior_scope="all"`` already normalised: ``log pi`` over every key, no mask.

        Dense with a mask that is the same for every query (or none), the prior is the same
        for every query too: it stays ``[..., 1, keys]`` and broadcasts, so its softmax,
        lgamma and digamma run once per key instead of once per query-key pair.
        """
        if keys is None:
            raise ValueError(f"{self.extra_repr()}: a contextual prior needs keys=... in the call")
        every_key = self.prior_scope == "all"
        if key_index is not None:  # per-node keys [nodes, heads, dim], gathered to edges
            logits = self.prior_net(keys, head_axis=-2)
            return (logits.log_softmax(0) if every_key else logits).index_select(0, key_index)
        logits = self.prior_net(keys, head_axis=-3)  # dense keys [..., heads, keys, dim]
        if every_key:
            logits = logits.log_softmax(-1)
        if scores.dim() == logits.dim() + 1:  # dense [..., keys] -> [..., 1, keys]
            logits = logits.unsqueeze(-2)
        mask = getattr(groups, "mask", None)
        if mask is not None and mask.shape[-2] != 1 and not every_key:
            return logits.expand_as(scores)  # per-query masks (e.g. causal): one prior per query
        return logits

    def prior_weights(
        self,
        scores: Tensor,
        mask: Optional[Tensor] = None,
        keys: Optional[Tensor] = None,
        *,
        index: Optional[Tensor] = None,
        num_nodes: Optional[int] = None,
        key_index: Optional[Tensor] = None,
    ) -> Tensor:
        """The contextual prior's mean attention ``pi`` (for plots such as the paper's Fig. 1)."""
        if self.prior_net is None:
            raise ValueError("prior_weights needs a contextual prior (bam-wc or bam-lc)")
        groups = make_groups(scores, mask, index, num_nodes)
        logits = self._prior_logits(scores, groups, keys, key_index)
        return (logits.exp() if self.prior_scope == "all" else groups.softmax(logits)).expand_as(scores)

    # ------------------------------------------------------------------ KL ---------
    def _kl(self, scores: Tensor, groups, keys, key_index) -> Tensor:
        prior_logits = None if self.prior_net is None else self._prior_logits(scores, groups, keys, key_index)
        return _MeanKL.apply(scores, prior_logits, self.kl_kernel, groups, self.prior_scope == "all")

    @property
    def kl_kernel(self) -> "WeibullGammaKL | LognormalKL":
        contextual = self.prior_net is not None
        if self.posterior == "weibull":
            return WeibullGammaKL(self.k, self.beta, self.prior_alpha, contextual,
                                  prior_sums_to_one=self.prior_scope == "neighbors")
        return LognormalKL(self.sigma, self.prior_sigma, self.prior_mu, contextual)


class WeibullGammaKL:
    """KL(Weibull(k, p / Gamma(1+1/k)) || Gamma(alpha, beta)) per entry, regrouped (Sec. 3.2) as

    ``alpha (c - log p) + log Gamma(alpha) + beta p + (log k - gamma - 1)``,
    ``c = gamma/k + log Gamma(1+1/k) - log beta``, since ``lambda Gamma(1+1/k) = p``.
    Contextual prior: ``alpha = beta * pi``; fixed prior: ``alpha`` is a constant.
    """

    def __init__(self, k: float, beta: float, prior_alpha: float, contextual: bool, prior_sums_to_one: bool = True):
        # d value / d log p = beta p - alpha sums to beta - beta = 0 over each group when
        # alpha = beta pi (pi sums to one over the group), so the log-softmax backward is the identity.
        self.centred_score_grad = contextual and prior_sums_to_one
        self.log_beta = math.log(beta)
        self.c = EULER_GAMMA / k + math.lgamma(1 + 1 / k) - self.log_beta
        self.alpha = None if contextual else prior_alpha
        self.const = math.log(k) - EULER_GAMMA - 1
        if not contextual:
            self.const += prior_alpha * self.c + math.lgamma(prior_alpha)

    def _shift(self, log_x: Tensor) -> Tensor:
        """``log_x + log beta`` (no pass at all for the default ``beta = 1``)."""
        return log_x if self.log_beta == 0 else log_x + self.log_beta

    @staticmethod
    def _log_tiny(x: Tensor) -> float:
        # alpha is kept above the smallest normal float so that lgamma(alpha) stays finite
        return math.log(torch.finfo(x.dtype).tiny)

    def value(self, logp: Tensor, log_pi: Optional[Tensor], need_prior: bool = False,
              p: Optional[Tensor] = None, pi: Optional[Tensor] = None):
        """The per-entry KL, and what :meth:`grads` reuses: ``d value / d log p`` and, with
        ``need_prior``, ``d value / d log pi``, computed here with ``lgamma`` in shared passes.
        ``p`` and ``pi``, when given, are ``exp(logp)`` and ``exp(log_pi)``."""
        beta_p = self._shift(logp).exp() if p is None else (p if self.log_beta == 0 else p * math.exp(self.log_beta))
        if log_pi is None:
            return torch.add(beta_p, logp, alpha=-self.alpha), (beta_p - self.alpha,)
        tiny = self._log_tiny(log_pi)
        if pi is None:
            alpha = self._shift(log_pi).clamp_min(tiny).exp_()
        else:
            alpha = pi.clamp_min(math.exp(tiny - self.log_beta))
            alpha = alpha if self.log_beta == 0 else alpha.mul_(math.exp(self.log_beta))
        d_logp = beta_p - alpha
        lgamma, digamma = lgamma_digamma_positive(alpha, with_digamma=need_prior)
        c_minus_logp = torch.sub(self.c, logp)
        value = torch.add(beta_p, lgamma).addcmul_(alpha, c_minus_logp)
        if not need_prior:
            return value, (d_logp,)
        # d alpha / d log pi = alpha (zero where alpha is clamped); d lgamma(alpha) / d alpha = digamma(alpha)
        d_log_pi = (digamma + c_minus_logp).mul_(alpha)  # digamma may broadcast (one prior per key)
        d_log_pi.masked_fill_(log_pi < tiny - self.log_beta, 0.0)
        return value, (d_logp, d_log_pi)

    def grads(self, saved, need_prior: bool, has_prior: bool):
        """Derivatives of :meth:`value` with respect to ``log p`` and ``log pi``."""
        return saved[0], (saved[1] if need_prior and len(saved) > 1 else None)


class LognormalKL:
    """KL(Lognormal(log p - s_q^2/2, s_q^2) || Lognormal(mu_p, s_p^2)) per entry (Sec. 3.2):

    ``(mu_q - mu_p)^2 / (2 s_p^2) + log(s_p/s_q) + s_q^2/(2 s_p^2) - 1/2``, with
    ``mu_p = log pi - s_p^2/2`` (contextual) or a constant (fixed).
    """

    centred_score_grad = False

    def __init__(self, sigma: float, prior_sigma: float, prior_mu: float, contextual: bool):
        self.contextual = contextual
        self.scale = 1 / (2 * prior_sigma**2)
        self.offset = (prior_sigma**2 - sigma**2) / 2 if contextual else -(sigma**2 / 2 + prior_mu)
        self.const = math.log(prior_sigma / sigma) + sigma**2 * self.scale - 0.5

    def _diff(self, logp: Tensor, log_pi: Optional[Tensor]) -> Tensor:
        diff = logp + self.offset
        return diff - log_pi if log_pi is not None else diff

    def value(self, logp: Tensor, log_pi: Optional[Tensor], need_prior: bool = False,
              p: Optional[Tensor] = None, pi: Optional[Tensor] = None):
        """The per-entry KL, and the tensor :meth:`grads` reuses (``mu_q - mu_p``)."""
        diff = self._diff(logp, log_pi)
        return diff.square().mul_(self.scale), (diff,)

    def grads(self, saved, need_prior: bool, has_prior: bool):
        d_logp = saved[0] * (2 * self.scale)
        return d_logp, (-d_logp if need_prior and has_prior else None)


class _MeanKL(torch.autograd.Function):
    """Mean over real entries of a per-entry KL of ``p = softmax(scores)`` and
    ``pi = softmax(prior_logits)``, with a hand-written backward through both softmaxes.

    ``prior_logits`` may be smaller than ``scores`` and broadcast against them (one prior
    per key for all queries); with ``prior_normalized`` they are ``log pi`` already (a prior
    normalised over other keys than the group's, ``prior_scope="all"``). Masked entries (``log p = -inf``) give inf or NaN inside the
    closed forms; :meth:`groups.mean` and ``zero_masked`` select them away, so the value is
    finite and their gradient exactly zero. Fully masked rows contribute nothing.
    """

    @staticmethod
    def forward(ctx, scores: Tensor, prior_logits: Optional[Tensor], kernel, groups,
                prior_normalized: bool = False) -> Tensor:
        logp, p = groups.log_softmax_pair(scores)
        log_pi, pi = prior_logits, None
        if prior_logits is not None and not prior_normalized:
            log_pi, pi = groups.log_softmax_pair(prior_logits)
        value, saved = kernel.value(logp, log_pi, log_pi is not None and ctx.needs_input_grad[1], p, pi)
        # the backward needs the weights p and pi (log pi when it is normalised over other keys)
        ctx.save_for_backward(p, log_pi if pi is None else pi, *saved)
        ctx.kernel, ctx.groups, ctx.prior_normalized = kernel, groups, prior_normalized
        return groups.mean(value) + kernel.const

    @staticmethod
    def backward(ctx, grad: Tensor):
        p, prior, *saved = ctx.saved_tensors
        groups = ctx.groups
        d_logp, d_log_pi = ctx.kernel.grads(saved, ctx.needs_input_grad[1], prior is not None)
        scale = grad / groups.count(p)
        d_scores = groups.zero_masked(d_logp) * scale
        if not ctx.kernel.centred_score_grad:
            d_scores = _log_softmax_backward(d_scores, p, groups)
        if d_log_pi is None:
            return d_scores, None, None, None, None
        d_log_pi = groups.zero_masked(d_log_pi).sum_to_size(prior.shape) * scale
        if not ctx.prior_normalized:
            d_log_pi = _log_softmax_backward(d_log_pi, prior, groups)
        return d_scores, d_log_pi, None, None, None


def _log_softmax_backward(grad: Tensor, weights: Tensor, groups) -> Tensor:
    """Chain rule through ``log_softmax``: ``grad - softmax * sum_group(grad)`` (``grad`` is
    zero on masked entries; NaN weights of fully masked rows are selected away)."""
    out = grad - weights * groups.expand(groups.sum(grad))
    return groups.zero_masked(out) if groups.empty_rows else out
