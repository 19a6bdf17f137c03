"""Adaptive attention span (Sukhbaatar et al., 2019), with one learned span per head.

A soft mask over the distance ``x`` between a query and a key,
``m_z(x) = clamp((R + z S - x) / R, 0, 1)``, multiplies the normalised weights, which are
then renormalised: ``a = m * w / (sum(m * w) + 1e-8)`` (the reference code,
facebookresearch/adaptive-span). ``z in [0, 1]`` is a parameter per head, ``S`` the
maximum span and ``R`` the ramp width. Keys at distance ``<= z S`` keep their weight
exactly, keys at distance ``>= z S + R`` get exactly zero. The penalty
``loss_coef * S * mean(z)`` goes to the active :func:`~common.attention.aux_losses`
collector as ``"adaptive_span"``; call :func:`clamp_spans` after every optimiser step.

What "distance" means (``SpanConfig.distance`` of :class:`~common.attention.blocks.Attend`):

* ``"position"``: ``|p_i - p_j|`` for 1-d positions (token index by default, so this is the
  paper's ``t - r`` for causal attention and its symmetric form for bidirectional
  attention) or the Euclidean distance for coordinates, e.g. box centres of image regions
  in normalised image coordinates (:func:`box_centres`; then ``S`` is in image units,
  ``sqrt(2)`` covers the whole image). Queries and keys need a shared coordinate frame.
* ``"rank"``: the rank of the key by its attention logit for that query (0 = the best).
  Image regions have no order, and text-to-region cross-attention has no shared frame;
  the rank turns the span into a learned soft top-``zS`` per head: "how many regions does
  this head look at". The rank is a constant (no gradient), like the token distance.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from ..aux import add_aux_loss, collecting

DISTANCES = ("position", "rank")
RENORM_EPS = 1e-8  # the reference implementation's constant


def position_distance(query_positions: Tensor, key_positions: Tensor) -> Tensor:
    """Euclidean distance between positions ``[..., queries, dims]`` and ``[..., keys, dims]``.

    With ``dims = 1`` this is ``|p_i - p_j|`` (token distance). Returns ``[..., queries, keys]``.
    """
    if query_positions.dim() < 2 or query_positions.shape[-1] != key_positions.shape[-1]:
        raise ValueError(
            f"positions must be [..., N, dims] with the same dims for queries and keys, got "
            f"{tuple(query_positions.shape)} and {tuple(key_positions.shape)}; token indices are "
            "[..., N, 1], box centres [..., N, 2]"
        )
    diff = query_positions.unsqueeze(-2) - key_positions.unsqueeze(-3)
    if diff.shape[-1] == 1:
        return diff.squeeze(-1).abs()
    return diff.square().sum(-1).sqrt()


def token_positions(length: int, device=None, dtype=None) -> Tensor:
    """Token positions ``[length, 1]`` = ``0..length-1``, the default for sequences."""
    return torch.arange(length, device=device, dtype=dtype or torch.get_default_dtype()).unsqueeze(-1)


def box_centres(boxes: Tensor) -> Tensor:
    """Centres ``[..., N, 2]`` of boxes ``[..., N, 4]`` given as ``(x1, y1, x2, y2)``."""
    if boxes.shape[-1] != 4:
        raise ValueError(f"boxes must be [..., N, 4] as (x1, y1, x2, y2), got {tuple(boxes.shape)}")
    return (boxes[..., :2] + boxes[..., 2:]) / 2


@torch.no_grad()
def rank_distance(logits: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Rank of every key by its logit within its query's row (0 = highest), masked keys last."""
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    order = logits.argsort(dim=-1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(logits.shape[-1], device=logits.device).expand_as(order))
    return ranks.to(logits.dtype)


class AdaptiveSpan(nn.Module):
    """Soft span mask with one ``z`` per head, applied to normalised weights ``[..., heads, q, k]``.

    Args:
        num_heads: one span per head.
        max_span: ``S``, in units of the distance (tokens, image units or ranks).
        ramp: ``R``, the width of the linear ramp from 1 to 0 (same units).
        init: initial ``z`` (the reference default is 0, i.e. a span of ``R``; use 1 to
            start from the full span, e.g. when fine-tuning a pre-trained model).
        loss_coef: weight of the penalty ``S * mean(z)``.
    """

    def __init__(self, num_heads: int, max_span: float, ramp: float = 32.0, init: float = 0.0,
                 loss_coef: float = 0.0):
        super().__init__()
        if max_span <= 0 or ramp <= 0:
            raise ValueError(f"max_span and ramp must be positive, got max_span={max_span}, ramp={ramp}")
        if not 0.0 <= init <= 1.0:
            raise ValueError(f"init is the span fraction z and must be in [0, 1], got {init}")
        self.max_span, self.ramp, self.loss_coef = float(max_span), float(ramp), float(loss_coef)
        self.z = nn.Parameter(torch.full((num_heads, 1, 1), float(init)))

    def extra_repr(self) -> str:
        return f"heads={self.z.shape[0]}, max_span={self.max_span}, ramp={self.ramp}, loss_coef={self.loss_coef}"

    @property
    def spans(self) -> Tensor:
        """Current span ``z * S`` of every head (detached), for logging and plots."""
        return (self.z.detach() * self.max_span).flatten()

    def token_window(self) -> int:
        """``W``: every head gives exactly zero weight to integer distances ``>= W`` (``W > max zS + R``)."""
        reach = float(self.z.detach().max()) * self.max_span + self.ramp
        return math.floor(reach) + 1

    def covers(self, distance: float) -> bool:
        """Whether every head gives full weight (``m = 1``, no gradient for ``z``) up to ``distance``.

        Half a unit of margin keeps the answer right whatever the dtype the mask is computed in.
        """
        return float(self.z.detach().min()) * self.max_span > distance + 0.5

    def penalty(self) -> None:
        """Add ``loss_coef * S * mean(z)`` to the active aux-loss collector (if any)."""
        if collecting() and self.loss_coef:
            add_aux_loss("adaptive_span", self.loss_coef * self.max_span * self.z.mean())

    def mask(self, distance: Tensor) -> Tensor:
        """``m_z(x) = clamp((R + z S - x) / R, 0, 1)``; ``distance`` broadcasts against ``[..., heads, q, k]``."""
        z = self.z.to(distance.dtype)
        # Written as 1 + (zS - x) / R so that x = zS gives exactly 1.
        return ((z * self.max_span - distance) / self.ramp + 1).clamp(0, 1)

    def forward(self, weights: Tensor, distance: Tensor) -> Tensor:
        if weights.shape[-3] != self.z.shape[0]:
            raise ValueError(f"span has {self.z.shape[0]} heads; weights must be [..., heads, q, k], "
                             f"got {tuple(weights.shape)}")
        masked = weights * self.mask(distance)
        self.penalty()
        return masked / (masked.sum(-1, keepdim=True) + RENORM_EPS)

    @torch.no_grad()
    def clamp_(self) -> None:
        """Keep ``z`` in ``[0, 1]`` (the reference ``clamp_param``); call after each optimiser step."""
        self.z.clamp_(0.0, 1.0)


def clamp_spans(model: nn.Module) -> None:
    """Clamp every :class:`AdaptiveSpan` in ``model``; call after every optimiser step."""
    for module in model.modules():
        if isinstance(module, AdaptiveSpan):
            module.clamp_()
