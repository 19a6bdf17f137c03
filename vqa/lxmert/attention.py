"""A drop-in replacement for ``transformers``' ``LxmertAttention`` built on :class:`common.attention.Attend`.

``LxmertAttention`` computes ``softmax(q k^T / sqrt(d) + mask) v`` with three projections named
``query``, ``key`` and ``value``. :class:`AdaptiveLxmertAttention` keeps those three
``nn.Linear`` modules (the very objects, so a pretrained state dict loads unchanged) and hands
the projected heads to ``Attend``, which applies the configured normalizer (softmax, alpha-entmax
with a learnable alpha per head, BAM, ...) and adaptive span. The forward signature and outputs
are those of ``LxmertAttention``: ``(context,)`` or ``(context, attention_probs)``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from common.attention import Attend, AttendConfig


def additive_to_boolean(attention_mask: Optional[Tensor]) -> Optional[Tensor]:
    """LXMERT's additive mask (0 = attend, the dtype's minimum = masked) as a boolean mask (True = attend)."""
    if attention_mask is None:
        return None
    if attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2


class AdaptiveLxmertAttention(nn.Module):
    """``LxmertAttention`` with the attention core of ``common.attention``.

    Args:
        query, key, value: the projections of the module being replaced (reused, not copied).
        num_heads: ``config.num_attention_heads``.
        config: what ``Attend`` does between the projections and the weighted sum.
    """

    def __init__(self, query: nn.Linear, key: nn.Linear, value: nn.Linear, num_heads: int, config: AttendConfig):
        super().__init__()
        if query.out_features % num_heads:
            raise ValueError(f"projection size {query.out_features} is not a multiple of {num_heads} heads")
        self.query, self.key, self.value = query, key, value
        self.num_attention_heads = num_heads
        self.attention_head_size = query.out_features // num_heads
        self.attend = Attend(num_heads, self.attention_head_size, config)

    @classmethod
    def replacing(cls, module: nn.Module, config: AttendConfig) -> "AdaptiveLxmertAttention":
        """The adaptive module that takes over ``module``'s projections (an ``LxmertAttention``)."""
        return cls(module.query, module.key, module.value, module.num_attention_heads, config)

    def _heads(self, x: Tensor) -> Tensor:
        return x.view(*x.shape[:-1], self.num_attention_heads, self.attention_head_size).transpose(-3, -2)

    def forward(self, hidden_states: Tensor, context: Tensor, attention_mask: Optional[Tensor] = None,
                output_attentions: bool = False):
        q = self._heads(self.query(hidden_states))
        k = self._heads(self.key(context))
        v = self._heads(self.value(context))
        out, maps = self.attend(q, k, v, mask=additive_to_boolean(attention_mask), need_maps=output_attentions)
        out = out.transpose(-3, -2).flatten(-2)
        return (out, maps.weights) if output_attentions else (out,)
