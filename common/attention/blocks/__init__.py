"""Attention blocks: the configurable core (:class:`Attend`), multi-head attention with
projections (:class:`MultiHeadAttention`) and additive attention for recurrent decoders
(:class:`AdditiveAttention`).

>>> from common.attention.blocks import MultiHeadAttention
>>> cfg = {"normalizer": "softmax", "cross_layer": {"kind": "evolving", "alpha": 0.5, "beta": 0.1}}
>>> layers = [MultiHeadAttention(512, 8, cfg, first_layer=(i == 0)) for i in range(6)]
>>> prev = None
>>> for layer in layers:
...     y, maps = layer(x, mask=pad_mask, prev_logits=prev)
...     x, prev = x + y, maps.logits
"""
from .additive import AdditiveAttention
from .attend import Attend, AttentionMaps, causal_mask
from .config import AttendConfig, ConvolutedConfig, CrossLayerConfig, PositionConfig, SpanConfig
from .multihead import MultiHeadAttention

__all__ = [
    "AdditiveAttention", "Attend", "AttendConfig", "AttentionMaps", "ConvolutedConfig", "CrossLayerConfig",
    "MultiHeadAttention", "PositionConfig", "SpanConfig", "causal_mask",
]
