"""LXMERT adaptive fine-tuning on VQA v2 (Bhargava, *Adaptive Transformers for Learning Multimodal
Representations*): ``transformers.LxmertModel`` with its attention routed through
``common.attention`` by :mod:`common.attention.surgery` (adaptive span, alpha-entmax with a learnable
alpha per head, BAM) and LayerDrop over its three layer stacks, with every-other pruning at inference.

    python -m vqa.lxmert.train --variant span --pretrained <hf-dir>      # fine-tune
    python -m vqa.lxmert.evaluate runs/lxmert/span                 # evaluate, write a submission
"""
from common.lazy import lazy_exports

#: Public names and their submodules, imported on first use (:mod:`common.lazy`): the CLIs answer
#: ``--help`` and check their config before transformers and the model are loaded.
_EXPORTS = {
    **dict.fromkeys(("Adaptation", "LayerDropOptions", "SpanOptions", "adapt_lxmert", "adaptive_attention",
                     "pruned_layers"), "adapt"),
    **dict.fromkeys(("LoadReport", "PretrainedError", "build_vqa_model", "head_parameters", "load_vqa_model",
                     "vqa_loss"), "model"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
