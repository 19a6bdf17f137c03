"""Operators on attention maps: cross-layer convolutions (predictive, evolving), convoluted
attention, direct position interactions, learnable temperature and adaptive span.

Logit operators act before normalisation (``[..., heads, queries, keys]`` scores), weight
operators after it. :class:`~common.attention.blocks.Attend` wires them by config.
"""
from .conv import CROSS_LAYER, AttnMapConv, EvolvingAttention, PredictiveAttention
from .convoluted import ConvolutedAttention
from .position import AbsolutePositionInteraction, RelativePositionInteraction
from .span import AdaptiveSpan, box_centres, clamp_spans, position_distance, rank_distance, token_positions
from .temperature import LearnableTemperature

__all__ = [
    "CROSS_LAYER", "AbsolutePositionInteraction", "AdaptiveSpan", "AttnMapConv", "ConvolutedAttention",
    "EvolvingAttention", "LearnableTemperature", "PredictiveAttention", "RelativePositionInteraction",
    "box_centres", "clamp_spans", "position_distance", "rank_distance", "token_positions",
]
