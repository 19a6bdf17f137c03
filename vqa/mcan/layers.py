"""MCAN's building blocks (Yu et al., CVPR 2019, Sec. 3), with any ``common`` normalizer.

Post-LayerNorm residual blocks, as ``MILVLG/mcan-vqa`` ``core/model/mca.py``:

* ``SA(X)``:      ``X = LN(X + MHA(X, X))``;  ``X = LN(X + FFN(X))``
* ``SGA(Y, X)``:  ``Y = LN(Y + MHA(Y, Y))``;  ``Y = LN(Y + MHA(Y, X))`` (guided: queries from
  the image ``Y``, keys/values from the question ``X``);  ``Y = LN(Y + FFN(Y))``
* ``FFN(X) = W_2 Dropout(ReLU(W_1 X))``

and the attention-flattening head (``AttFlat``, Eq. 8 of the paper):
``alpha = norm(MLP(X))`` over the tokens (or boxes) of each sample and glimpse,
``x = W_m [sum_i alpha_i^g x_i]_g``. Every attention (self, guided, flattening) maps its
scores to weights with the normalizer named in the config (softmax, bam-*, entmax, ...).
"""
from __future__ import annotations

from typing import Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from common import attention
from common.attention import AttendConfig, MultiHeadAttention


class FeedForward(nn.Sequential):
    """``Linear -> ReLU -> Dropout -> Linear`` (MCAN's ``MLP`` with ``use_relu=True``)."""

    def __init__(self, dim: int, hidden: int, out: int, dropout: float):
        super().__init__(nn.Linear(dim, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout), nn.Linear(hidden, out))


class SelfAttentionLayer(nn.Module):
    """MCAN's ``SA`` unit; ``mask`` is ``[B, 1, 1, L]`` (True = a real token)."""

    def __init__(self, dim: int, heads: int, ffn: int, dropout: float, attend: AttendConfig):
        super().__init__()
        self.attn = MultiHeadAttention(dim, heads, attend)
        self.ffn = FeedForward(dim, ffn, dim, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor, need_maps: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        y, maps = self.attn(x, mask=mask, need_maps=need_maps)
        x = self.norm1(x + self.drop1(y))
        return self.norm2(x + self.drop2(self.ffn(x))), maps.weights


class GuidedAttentionLayer(nn.Module):
    """MCAN's ``SGA`` unit: self-attention on ``y``, then attention from ``y`` to ``x``."""

    def __init__(self, dim: int, heads: int, ffn: int, dropout: float, attend: AttendConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(dim, heads, attend)
        self.guided_attn = MultiHeadAttention(dim, heads, attend)
        self.ffn = FeedForward(dim, ffn, dim, dropout)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.drop1, self.drop2, self.drop3 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, y: Tensor, x: Tensor, y_mask: Tensor, x_mask: Tensor, need_maps: bool = False
                ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        a, self_maps = self.self_attn(y, mask=y_mask, need_maps=need_maps)
        y = self.norm1(y + self.drop1(a))
        a, guided_maps = self.guided_attn(y, x, mask=x_mask, need_maps=need_maps)
        y = self.norm2(y + self.drop2(a))
        return self.norm3(y + self.drop3(self.ffn(y))), self_maps.weights, guided_maps.weights


class AttentionFlatten(nn.Module):
    """MCAN's ``AttFlat``: ``glimpses`` attention poolings over the sequence, merged to ``out``.

    The glimpses are the normalizer's heads: scores ``[B, G, 1, L]`` over the ``L`` keys, whose
    key vectors (for a contextual prior) are the inputs ``x``.
    """

    def __init__(self, dim: int, mlp_dim: int, glimpses: int, out: int, dropout: float,
                 normalizer: str = "softmax", normalizer_options: Optional[Mapping] = None):
        super().__init__()
        self.mlp = FeedForward(dim, mlp_dim, glimpses, dropout)
        self.normalizer = attention.build(normalizer, num_heads=glimpses, key_dim=dim, **dict(normalizer_options or {}))
        self.merge = nn.Linear(dim * glimpses, out)

    def forward(self, x: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor]:
        """``x [B, L, E]``, ``mask [B, L]`` -> pooled ``[B, out]`` and weights ``[B, G, 1, L]``."""
        scores = self.mlp(x).transpose(1, 2).unsqueeze(2)                      # [B, G, 1, L]
        keys = x.unsqueeze(1).expand(-1, scores.shape[1], -1, -1)              # [B, G, L, E]
        weights = self.normalizer(scores, mask=mask[:, None, None, :], keys=keys)
        pooled = torch.matmul(weights, x.unsqueeze(1)).squeeze(2)              # [B, G, E]
        return self.merge(pooled.flatten(1)), weights
