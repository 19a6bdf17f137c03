"""LXMERT adaptive fine-tuning on VQA v2 (Bhargava, *Adaptive Transformers for Learning Multimodal
Representations*): ``transformers.LxmertModel`` with its attention modules swapped for
``common.attention`` ones (adaptive span, alpha-entmax with a learnable alpha per head, BAM) and
LayerDrop over its three layer stacks, with every-other pruning at inference.

    python -m vqa.lxmert.train --variant span --pretrained <hf-dir>      # fine-tune
    python -m vqa.lxmert.evaluate runs/lxmert/span                 # evaluate, write a submission
"""
from .adapt import Adaptation, LayerDropOptions, SpanOptions, adapt_lxmert, adaptive_attention, pruned_layers
from .attention import AdaptiveLxmertAttention
from .model import LoadReport, PretrainedError, build_vqa_model, head_parameters, load_vqa_model, vqa_loss

__all__ = [
    "Adaptation", "AdaptiveLxmertAttention", "LayerDropOptions", "LoadReport", "PretrainedError", "SpanOptions",
    "adapt_lxmert", "adaptive_attention", "build_vqa_model", "head_parameters", "load_vqa_model", "pruned_layers",
    "vqa_loss",
]
