"""Attention normalizers: one implementation per paper, in dense and edge-wise layouts.

>>> from common import attention
>>> norm = attention.build("bam-wc", key_dim=64)
>>> with attention.aux_losses() as aux:
...     weights = norm(scores, mask=mask, keys=keys)        # dense [..., heads, q, k]
>>> loss = task_loss + kl_weight * aux.total()

Blocks (``common.attention.blocks``) and map operators (``common.attention.maps``) build on
the normalizers: predictive/evolving/convoluted attention, position interactions, learnable
temperature, adaptive span, and LayerDrop (``common.attention.structure``).

Variants: ``softmax``; BAM ``bam-wf``, ``bam-wc``, ``bam-lf``, ``bam-lc`` (Weibull/Lognormal
posterior, fixed/contextual prior); ``entmax`` (learnable alpha), ``entmax15``, ``sparsemax``.
"""
from functools import partial

from . import functional
from .aux import AuxLosses, add_aux_loss, aux_losses, collecting
from .bam import BAM, ContextualPrior
from .base import Normalizer, mc_sampling
from .entmax import Entmax, Entmax15, Sparsemax
from .groups import DenseGroups, EdgeGroups
from .registry import available, build, register
from .schedule import KLSchedule
from .softmax import Softmax

register("softmax", Softmax)
register("bam-wf", partial(BAM, posterior="weibull", prior="fixed"))
register("bam-wc", partial(BAM, posterior="weibull", prior="contextual"))
register("bam-lf", partial(BAM, posterior="lognormal", prior="fixed"))
register("bam-lc", partial(BAM, posterior="lognormal", prior="contextual"))
register("entmax", Entmax)
register("entmax15", Entmax15)
register("sparsemax", Sparsemax)

# Map operators and blocks import the registry above, so they come after it.
from . import blocks, maps, structure  # noqa: E402
from .blocks import AdditiveAttention, Attend, AttendConfig, AttentionMaps, MultiHeadAttention  # noqa: E402
from .maps import clamp_spans  # noqa: E402
from .structure import LayerDropList, every_other_layers, prune_layers  # noqa: E402

__all__ = [
    "AdditiveAttention", "Attend", "AttendConfig", "AttentionMaps", "LayerDropList", "MultiHeadAttention",
    "blocks", "clamp_spans", "every_other_layers", "maps", "prune_layers", "structure",
    "AuxLosses", "BAM", "ContextualPrior", "DenseGroups", "EdgeGroups", "Entmax", "Entmax15",
    "KLSchedule", "Normalizer", "Softmax", "Sparsemax", "add_aux_loss", "available",
    "aux_losses", "build", "collecting", "functional", "mc_sampling", "register",
]
