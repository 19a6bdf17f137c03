r"""The BAM KL (Fan et al., 2020, Eq. 4) of a dense attention layer without its
``[queries x keys]`` matrix.

With scores ``s_ij = scale * q_i . k_j`` over the visible keys ``V_i`` of query ``i``,
``LSE_i = log sum_{j in V_i} exp(s_ij)``, ``log p_ij = s_ij - LSE_i``, ``n_i = |V_i|``, and
the contextual prior ``log pi_j`` (a log-softmax of the prior logits over the visible keys,
the same for every query when the mask is a key padding mask), the per-entry closed forms
of :mod:`common.attention.bam` sum over a row to:

* Weibull, fixed prior (value ``beta p - alpha0 log p``)::

      R_i = beta - alpha0 (scale q_i . K_i - n_i LSE_i),       K_i = sum_{j in V_i} k_j

  (a prefix sum of the keys under a causal mask);
* Weibull, contextual prior (value ``beta p + lgamma(a_j) + a_j (c - log p)``, ``a_j = beta pi_j``,
  kept above the smallest normal float as the materialised path keeps it)::

      R_i = beta + sum_j lgamma(a_j) + c A - scale q_i . (sum_j a_j k_j) + A LSE_i,   A = sum_j a_j

  so ``sum_j pi_j s_ij = scale q_i . (sum_j pi_j k_j)``: one vector per (batch, head);
* Lognormal (value ``(diff_ij)^2 / (2 sigma_p^2)``, ``diff_ij = s_ij - t_j + u_i``, with
  ``t_j = log pi_j`` (contextual) or 0 (fixed) and ``u_i = offset - LSE_i``)::

      sum_j diff_ij^2 = S2_i - 2 scale q_i . (sum_j t_j k_j) + sum_j t_j^2
                        + 2 u_i (scale q_i . K_i - sum_j t_j) + n_i u_i^2,

  where ``S2_i = sum_j s_ij^2 = scale^2 q_i^T (sum_j k_j k_j^T) q_i``. The quadratic form costs
  ``d^2`` per query against ``n_i`` for the direct sum, so the attention kernel accumulates
  ``S2_i`` from its score tiles while it has them (it is one of its row statistics).

The layer's KL is ``sum_i R_i / sum_i n_i + const`` over non-empty rows, the mean over real
entries of :class:`~common.attention.bam._MeanKL`. Everything here is ``O(L d)``; the row
statistics ``LSE_i`` (and ``S2_i``) come with their gradients from the attention kernel
(``d LSE_i / d s_ij = p_ij``, ``d S2_i / d s_ij = 2 s_ij``), and autograd carries the rest
to ``q``, ``k`` and the prior network. The dot products run in the dtype of ``q`` (matrix
the per-row sums in float64: the Lognormal expansion subtracts terms of size
``n_i LSE_i^2`` from each other.

A causal mask makes ``K_i`` a prefix sum, but the contextual prior's normaliser then
changes with the query (``lgamma(beta pi_ij)`` sums no longer factor) and ``S2_i`` would need
prefix sums of ``d x d`` matrices: those cases keep the materialised KL (:func:`supports`).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from .bam import LognormalKL, WeibullGammaKL


def supports(kernel, causal: bool) -> bool:
    """Whether :func:`dense_kl` has the closed form for this KL under this mask."""
    return not causal or (isinstance(kernel, WeibullGammaKL) and kernel.alpha is not None)


def needs_square_sums(kernel) -> bool:
    """Whether the KL needs the row statistic ``S2_i = sum_j s_ij^2``."""
    return isinstance(kernel, LognormalKL)


def projection_weights(kernel, k: Tensor, *, key_mask: Optional[Tensor] = None,
                       prior_logits: Optional[Tensor] = None, prior_over_all_keys: bool = False) -> Tensor:
    """The per-key weights ``w_r [..., H, m, K]`` whose projections ``P_ir = scale q_i . sum_j w_rj k_j``
    :func:`dense_kl` needs (zero on hidden keys), in ``k``'s dtype: the visibility (fixed priors,
    and the Lognormal ``q_i . K_i``), ``a_j = beta pi_j`` (Weibull, contextual prior), and
    ``t_j = log pi_j`` (Lognormal, contextual prior) after the visibility. An attention kernel
    that has ``q_i`` at hand computes the projections (:func:`dense_kl`'s ``projections``)."""
    visible = _visible(k, key_mask)
    if isinstance(kernel, WeibullGammaKL):
        rows = [visible if kernel.alpha is not None else
                _gamma_shapes(kernel, prior_logits, visible, prior_over_all_keys)]
    else:
        rows = [visible]
        if prior_logits is not None:
            rows.append(_log_prior_visible(prior_logits, visible, prior_over_all_keys))
    return torch.stack([r.to(k.dtype).expand(k.shape[:-1]) for r in rows], -2)


def dense_kl(
    kernel,
    q: Tensor,
    k: Tensor,
    lse: Tensor,
    *,
    scale: float,
    key_mask: Optional[Tensor] = None,
    causal: bool = False,
    prior_logits: Optional[Tensor] = None,
    square_sums: Optional[Tensor] = None,
    prior_over_all_keys: bool = False,
    projections: Optional[Tensor] = None,
    sums_dtype: torch.dtype = torch.float64,
) -> Tensor:
    """The layer's KL from row statistics: ``q [..., H, Q, d]``, ``k [..., H, K, d]``,
    ``lse [..., H, Q]`` (``-inf`` on rows without keys), ``key_mask`` boolean broadcastable to
    ``[..., H, K]`` (True = visible), ``prior_logits [..., H, K]`` (contextual prior),
    ``square_sums [..., H, Q]`` (Lognormal). ``prior_over_all_keys``: the prior is normalised over
    every key, hidden ones included (BAM's ``prior_scope="all"``); the sums still run over visible keys.
    ``projections [..., H, Q, m]``: ``scale q_i . sum_j w_rj k_j`` for the weights of
    :func:`projection_weights` (no causal mask), computed here when not given. ``sums_dtype``: the per-row sums'
    dtype (float64 by default: the Lognormal expansion cancels; the GPU path's fixed-prior Weibull takes float32).
    """
    if not supports(kernel, causal):
        raise ValueError("this KL has no closed form under a causal mask; use the materialised path")
    if projections is not None and causal:
        raise ValueError("projections cover all visible keys; under a causal mask dense_kl computes prefix sums")
    f64 = sums_dtype
    visible = _visible(k, key_mask)
    rows = _row_select(causal, q.shape[-2], k.shape[-2], k.device)
    n = _key_sums(visible.to(f64).unsqueeze(-1), rows).squeeze(-1)  # [..., H, Q or 1]
    nonempty = n > 0
    lse = torch.where(nonempty, lse.to(f64), 0.0)
    if projections is None:
        weights = projection_weights(kernel, k, key_mask=key_mask, prior_logits=prior_logits,
                                     prior_over_all_keys=prior_over_all_keys)
        if rows is None:  # two matrix products: no [..., Q, d] temporary in either pass
            projections = torch.matmul(q, torch.matmul(weights, k).transpose(-1, -2)) * scale
        else:  # prefix sums of the keys (one weight row, the visibility, under a causal mask)
            projections = (q * _key_sums(weights.squeeze(-2).unsqueeze(-1) * k, rows)).sum(-1, keepdim=True) * scale
    projections = projections.to(f64)

    if isinstance(kernel, WeibullGammaKL):
        beta = math.exp(kernel.log_beta)
        if kernel.alpha is not None:
            row = beta - kernel.alpha * (projections[..., 0] - n * lse)
        else:
            alpha = _gamma_shapes(kernel, prior_logits, visible, prior_over_all_keys)
            alpha_sum = alpha.sum(-1, keepdim=True)
            lgamma_sum = torch.where(visible, torch.lgamma(torch.where(visible, alpha, 1.0)), 0.0).sum(-1, keepdim=True)
            row = beta + lgamma_sum + kernel.c * alpha_sum - projections[..., 0] + alpha_sum * lse
    else:
        if square_sums is None:
            raise ValueError("the Lognormal KL needs square_sums (sum_j s_ij^2 of every query)")
        u = kernel.offset - lse
        qk_sum = projections[..., 0]
        if prior_logits is None:
            row = square_sums.to(f64) + 2 * u * qk_sum + n * u.square()
        else:
            t = _log_prior_visible(prior_logits, visible, prior_over_all_keys)
            t_sum, t_sq = t.sum(-1, keepdim=True), t.square().sum(-1, keepdim=True)
            row = square_sums.to(f64) - 2 * projections[..., 1] + t_sq + 2 * u * (qk_sum - t_sum) + n * u.square()
        row = row * kernel.scale
    row = torch.where(nonempty, row, 0.0)
    count = n.expand_as(row).sum().clamp_min(1)
    return (row.sum() / count + kernel.const).to(q.dtype)


def _visible(k: Tensor, key_mask: Optional[Tensor]) -> Tensor:
    """The key visibility ``[..., H, K]`` (True = attend)."""
    visible = torch.ones((), dtype=torch.bool, device=k.device) if key_mask is None else key_mask
    return visible.expand(k.shape[:-1])


def _gamma_shapes(kernel, prior_logits: Tensor, visible: Tensor, over_all_keys: bool) -> Tensor:
    """``a_j = beta pi_j`` in float64 on visible keys (0 on hidden ones), kept above the smallest
    normal float of the logits' dtype as the materialised path keeps it."""
    log_tiny = math.log(torch.finfo(prior_logits.dtype).tiny)
    log_pi = _log_prior(prior_logits.to(torch.float64), visible, over_all_keys)
    return torch.where(visible, (log_pi + kernel.log_beta).clamp_min(log_tiny).exp(), 0.0)


def _log_prior_visible(prior_logits: Tensor, visible: Tensor, over_all_keys: bool) -> Tensor:
    """``t_j = log pi_j`` in float64 on visible keys, 0 on hidden ones."""
    return torch.where(visible, _log_prior(prior_logits.to(torch.float64), visible, over_all_keys), 0.0)


def _row_select(causal: bool, num_queries: int, num_keys: int, device) -> Optional[Tensor]:
    """For a causal mask, the last key each query sees (top-left aligned); None otherwise."""
    if not causal:
        return None
    return torch.arange(num_queries, device=device).clamp_max(num_keys - 1)


def _key_sums(x: Tensor, rows: Optional[Tensor]) -> Tensor:
    """``sum_{j in V_i} x_j`` for ``x [..., K, c]``: ``[..., 1, c]`` (all keys) or ``[..., Q, c]`` (prefix)."""
    if rows is None:
        return x.sum(-2, keepdim=True)
    return x.cumsum(-2).index_select(-2, rows)


def _log_prior(logits: Tensor, visible: Tensor, over_all_keys: bool) -> Tensor:
    """``log pi_j``: the log-softmax of the prior logits over the visible keys, or over every key."""
    return logits.log_softmax(-1) if over_all_keys else _masked_log_softmax(logits, visible)


def _masked_log_softmax(logits: Tensor, visible: Tensor) -> Tensor:
    """Log-softmax over the visible keys; finite everywhere (and in its gradient) even when no key is visible."""
    top = torch.where(visible, logits, float("-inf")).amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0).detach()
    total = torch.where(visible, (logits - top).exp(), 0.0).sum(-1, keepdim=True)
    return logits - top - torch.where(total > 0, total, 1.0).log()
