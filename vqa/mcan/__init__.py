"""MCAN (Deep Modular Co-Attention Networks) with any ``common.attention`` normalizer.

>>> from vqa.mcan import MCAN, MCANConfig
>>> model = MCAN(MCANConfig(vocab_size=len(vocab), num_answers=3129, attention="bam-wc"))
>>> logits = model(batch["question_tokens"], batch["question_mask"], batch["features"], batch["region_mask"])
>>> logits, maps = model(..., need_maps=True)      # maps.question_self[i], maps.image_guided[i], ...
"""
from .layers import AttentionFlatten, FeedForward, GuidedAttentionLayer, SelfAttentionLayer
from .model import MCAN, MCANConfig, MCANMaps

__all__ = ["AttentionFlatten", "FeedForward", "GuidedAttentionLayer", "MCAN", "MCANConfig", "MCANMaps",
           "SelfAttentionLayer"]
