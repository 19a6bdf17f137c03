"""The attention core: ``q, k, v`` -> scores -> logit operators -> normalizer -> weight
operators -> dropout -> weighted sum, with a record of the maps.

Order of operations (each step only when configured):

1. ``logits = q k^T * scale`` (``scale`` defaults to ``1/sqrt(head_dim)``);
2. ``+ A^p + A^r`` (direct position interactions);
3. predictive or evolving attention with the previous layer's logits (``prev_logits``);
4. the normalizer (any registered name: softmax, BAM, entmax, ...), with the boolean mask
   (True = attend) and, for a causal call, the lower-triangular mask;
5. adaptive span (soft mask, renormalised), then convoluted attention; with softmax and no
   other operator, on the CPU in eager mode (the choice reads the spans back to Python, which
   would be a host synchronisation on a GPU and a graph break under ``torch.compile``), a span
   that covers every key is SDPA, and with token distance in self-attention the keys beyond
   every head's span are skipped, not computed (:mod:`~common.attention.blocks.trimmed`);
6. dropout on the weights, then ``weights @ v``.

The record :class:`AttentionMaps` holds the logits after step 3 (``maps.logits``: hand
them to the next layer as ``prev_logits``) and the weights after step 5. With no
operator on and the softmax normalizer, the call is ``F.scaled_dot_product_attention``
and no map is materialised unless ``need_maps=True``. With a BAM normalizer and no
operator, the call goes through :func:`~common.attention.dense_bam.fused_bam`, which does
not materialise the ``[queries x keys]`` weights either.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..dense_bam import fused_bam
from ..groups import host_reads_are_free
from ..registry import build
from ..maps.conv import CROSS_LAYER
from ..maps.convoluted import ConvolutedAttention
from ..maps.position import AbsolutePositionInteraction, RelativePositionInteraction
from ..maps.span import AdaptiveSpan, position_distance, rank_distance, token_positions
from ..softmax import Softmax
from .config import AttendConfig, as_config
from .trimmed import trimmed_span_attention


@dataclass
class AttentionMaps:
    """Maps of one attention call, ``[..., heads, queries, keys]`` (``None`` on the fast path).

    * ``scores``: this layer's own logits (``q k^T * scale`` + position interactions);
    * ``logits``: what the normalizer received (after predictive/evolving mixing); pass
      them to the next layer as ``prev_logits``. Masked entries hold arbitrary values;
    * ``weights``: the attention weights used for the output (after span and
      convoluted attention, before dropout); masked entries are exactly zero.
    """

    scores: Optional[Tensor] = None
    logits: Optional[Tensor] = None
    weights: Optional[Tensor] = None


def causal_mask(num_queries: int, num_keys: int, device=None) -> Tensor:
    """``[queries, keys]`` boolean mask, True where key ``j <= i`` (top-left aligned, as SDPA's ``is_causal``)."""
    return torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).tril()


def _check_mask(mask: Optional[Tensor]) -> None:
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = attend), got dtype {mask.dtype}; "
                        "convert an additive mask with `mask = additive_mask == 0`")


class Attend(nn.Module):
    """Multi-head attention over projected ``q [..., H, Q, d]``, ``k [..., H, K, d]``, ``v [..., H, K, dv]``.

    Args:
        num_heads: ``H``.
        head_dim: ``d`` (the normalizer's ``key_dim``, e.g. BAM's contextual prior).
        config: an :class:`~common.attention.blocks.AttendConfig` or a mapping of its fields.
        first_layer: the first layer of a stack: predictive/evolving attention builds no
            convolution there (both papers leave the first block unchanged).
        decoder: queries are produced left to right (decoder self- and cross-attention):
            map convolutions read only earlier queries. Required for ``causal=True`` calls
            when a convolutional operator is configured.
    """

    def __init__(self, num_heads: int, head_dim: int, config: "AttendConfig | Mapping | None" = None, *,
                 first_layer: bool = False, decoder: bool = False):
        super().__init__()
        config = as_config(config)
        if config.temperature:
            raise ValueError("temperature scales the projection weights W_q, W_k, W_v; use MultiHeadAttention, "
                             "which owns them (Attend receives already projected q, k, v)")
        self.config, self.num_heads, self.head_dim = config, num_heads, head_dim
        self.first_layer, self.decoder = first_layer, decoder
        self.plain = config.plain
        self.scale = config.scale
        self.dropout_p = config.dropout
        self.normalizer = build(config.normalizer, num_heads=num_heads, key_dim=head_dim, **config.normalizer_options)
        self.cross_layer = self.absolute = self.relative = self.span = self.convoluted = None
        if config.cross_layer is not None:
            self.cross_layer = CROSS_LAYER[config.cross_layer.kind](
                num_heads, first_layer=first_layer, causal=decoder, **config.cross_layer.operator_options())
        if config.position is not None:
            if config.position.absolute:
                self.absolute = AbsolutePositionInteraction(num_heads, config.position.max_len)
            if config.position.relative:
                self.relative = RelativePositionInteraction(num_heads, config.position.max_len)
        if config.span is not None:
            s = config.span
            self.span = AdaptiveSpan(num_heads, s.max_span, s.ramp, s.init, s.loss_coef)
        if config.convoluted is not None:
            c = config.convoluted
            self.convoluted = ConvolutedAttention(num_heads, c.kind, c.max_len, causal=decoder, activation=c.activation,
                                                  init=c.init)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, dropout={self.dropout_p}, plain={self.plain}"

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Optional[Tensor] = None,
        causal: bool = False,
        prev_logits: Optional[Tensor] = None,
        need_maps: bool = False,
        query_positions: Optional[Tensor] = None,
        key_positions: Optional[Tensor] = None,
    ) -> tuple[Tensor, AttentionMaps]:
        """Attention output ``[..., H, Q, dv]`` and the :class:`AttentionMaps` record.

        Args:
            mask: boolean, broadcastable to ``[..., H, Q, K]``; True = attend.
            causal: also mask keys ``j > i`` (top-left aligned, like SDPA's ``is_causal``).
            prev_logits: the previous layer's ``maps.logits`` (predictive/evolving attention).
            need_maps: materialise the maps even on the fast path (visualisation).
            query_positions, key_positions: ``[..., N, dims]`` coordinates for the span's
                ``"position"`` distance (default: token indices, self-attention only).
        """
        self._check_inputs(q, k, v, mask, causal, prev_logits)
        if self.plain and not need_maps:
            return self._sdpa(q, k, v, mask, causal), AttentionMaps()
        fused = fused_bam(self, q, k, v, mask, causal, need_maps)
        if fused is not None:
            return fused, AttentionMaps()
        Q, K = q.shape[-2], k.shape[-2]
        full_mask = mask
        if causal:
            tri = causal_mask(Q, K, q.device)
            full_mask = tri if mask is None else mask & tri
        scale = self.scale if self.scale is not None else q.shape[-1] ** -0.5
        if (not need_maps and query_positions is None and key_positions is None and self._span_only()
                and host_reads_are_free(q)):  # the shortcut reads the spans back to Python
            out = self._span_fast(q, k, v, mask, causal, full_mask, scale)
            if out is not None:
                return out, AttentionMaps()
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        if self.absolute is not None:
            scores = scores + self.absolute(Q, K)
        if self.relative is not None:
            scores = scores + self.relative(Q, K)
        logits = scores
        if self.cross_layer is not None:
            logits = self.cross_layer(scores, prev_logits, full_mask)
        weights = self.normalizer(logits, mask=full_mask, keys=k)
        if self.span is not None:
            weights = self.span(weights, self._span_distance(logits, full_mask, query_positions, key_positions))
        if self.convoluted is not None:
            weights = self.convoluted(weights, full_mask)
        dropped = F.dropout(weights, self.dropout_p, self.training) if self.dropout_p else weights
        return torch.matmul(dropped, v), AttentionMaps(scores=scores, logits=logits, weights=weights)

    # ------------------------------------------------------------------ helpers ----
    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool) -> Tensor:
        dropout_p = self.dropout_p if self.training else 0.0
        if causal and mask is not None:
            mask = mask & causal_mask(q.shape[-2], k.shape[-2], q.device)
            causal = False
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal,
                                              scale=self.scale)

    def _check_inputs(self, q, k, v, mask, causal, prev_logits) -> None:
        if q.dim() < 3 or q.shape[-3] != self.num_heads:
            raise ValueError(f"q must be [..., {self.num_heads} heads, queries, head_dim], got {tuple(q.shape)}")
        if k.shape[-2] != v.shape[-2] or k.shape[-1] != q.shape[-1]:
            raise ValueError(f"k {tuple(k.shape)} must be [..., heads, keys, {q.shape[-1]}] and v "
                             f"{tuple(v.shape)} must have the same number of keys")
        _check_mask(mask)
        if prev_logits is not None and self.cross_layer is None:
            raise ValueError("prev_logits was given but no cross-layer operator is configured "
                             "(set cross_layer={'kind': 'predictive' | 'evolving', ...}), so it would be ignored")
        if causal and not self.decoder and (self.convoluted is not None or
                                            (self.cross_layer is not None and not self.first_layer)):
            raise ValueError("causal attention with map convolutions needs Attend(..., decoder=True) so that "
                             "the convolutions read no later query (otherwise future tokens leak)")

    def _span_only(self) -> bool:
        """Softmax with adaptive span and no other map operator."""
        return (self.span is not None and isinstance(self.normalizer, Softmax) and self.cross_layer is None
                and self.convoluted is None and self.absolute is None and self.relative is None)

    def _span_fast(self, q, k, v, mask, causal, full_mask, scale) -> Optional[Tensor]:
        """The span's output without the full ``[Q, K]`` maps, or ``None`` (take the full path).

        Token or rank distances are at most ``K - 1``: when every head's span covers that, the mask
        is 1 and the span only renormalises (by ``1 + 1e-8``): SDPA. Otherwise, with token distance
        in self-attention, the keys beyond every head's span are skipped (:mod:`.trimmed`).
        """
        Q, K = q.shape[-2], k.shape[-2]
        position = self.config.span.distance == "position"
        if position and Q != K:
            return None  # the full path explains what is missing
        if self.span.covers(K - 1):
            self.span.penalty()
            return self._sdpa(q, k, v, mask, causal)
        if position:
            return trimmed_span_attention(q, k, v, self.span, self.normalizer, scale, full_mask, self.dropout_p,
                                          self.training)
        return None

    def _span_distance(self, logits, mask, query_positions, key_positions) -> Tensor:
        if self.config.span.distance == "rank":
            return rank_distance(logits, mask)
        Q, K = logits.shape[-2], logits.shape[-1]
        if query_positions is None and key_positions is None:
            if Q != K:
                raise ValueError(
                    f"adaptive span with distance='position' and {Q} queries vs {K} keys: token distance "
                    "only means something for self-attention; pass query_positions/key_positions "
                    "(e.g. box centres) or use span.distance='rank'"
                )
            query_positions = key_positions = token_positions(Q, logits.device, logits.dtype)
        elif query_positions is None or key_positions is None:
            raise ValueError("pass both query_positions and key_positions (or neither, for token distance)")
        distance = position_distance(query_positions.to(logits.dtype), key_positions.to(logits.dtype))
        return distance.unsqueeze(-3) if distance.dim() >= 3 else distance
