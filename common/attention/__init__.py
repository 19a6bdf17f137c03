"""Attention normalizers: one implementation per paper, in dense and edge-wise layouts.

>>> from common import attention
>>> norm = attention.build("bam-wc", key_dim=64)
>>> with attention.aux_losses() as aux:
...     weights = norm(scores, mask=mask, keys=keys)        # dense [..., heads, q, k]
>>> loss = task_loss + kl_weight * aux.total()

Blocks (``common.attention.blocks``) and map operators (``common.attention.maps``) build on
the normalizers: predictive/evolving/convoluted attention, position interactions, learnable
temperature, adaptive span, and LayerDrop (``common.attention.structure``).
:func:`swap_attention` puts any of them into a pretrained Hugging Face encoder
(``common.attention.surgery``).

Variants: ``softmax``; BAM ``bam-wf``, ``bam-wc``, ``bam-lf``, ``bam-lc`` (Weibull/Lognormal
posterior, fixed/contextual prior); ``entmax`` (learnable alpha), ``entmax15``, ``sparsemax``.
"""
from common.lazy import lazy_exports

#: Public names and their submodules, imported on first use: ``available()`` and a config check need
#: no torch (:mod:`common.attention.registry`).
_EXPORTS = {
    "functional": None, "blocks": None, "maps": None, "structure": None,
    "AuxLosses": "aux", "add_aux_loss": "aux", "aux_losses": "aux", "collecting": "aux",
    "BAM": "bam", "ContextualPrior": "bam", "freeze_priors": "bam", "Normalizer": "base", "mc_sampling": "base",
    "Entmax": "entmax", "Entmax15": "entmax", "Sparsemax": "entmax", "DenseGroups": "groups",
    "EdgeGroups": "groups", "available": "registry", "build": "registry", "is_stochastic": "registry",
    "register": "registry",
    "KLSchedule": "schedule", "Softmax": "softmax",
    "AdditiveAttention": "blocks", "Attend": "blocks", "AttendConfig": "blocks", "AttentionMaps": "blocks",
    "MultiHeadAttention": "blocks", "clamp_spans": "maps", "LayerDropList": "structure",
    "every_other_layers": "structure", "prune_layers": "structure",
    "swap_attention": "surgery", "swapped_attention": "surgery",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
