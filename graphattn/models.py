"""The two-layer GAT of Velickovic et al. (ICLR 2018, Sec. 3.3) with any attention variant; the one a run's config
describes (:func:`build_model`), its inputs (:func:`prepare_features`) and its loss and accuracy on a split."""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.typing import Adj

from common.attention import AuxLosses
from common.utils.distributed import DistEnv

from .config import KL_REDUCTIONS
from .conv import GATConv
from .dropout import Dropout, SparseDropout

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from torch_geometric.data import Data

    from common.utils.runtime import Runtime


class GAT(nn.Module):
    r"""``dropout -> GATConv(heads x hidden, concat) -> ELU -> dropout -> GATConv(out_heads, mean)``.

    The paper's transductive model: 8 heads x 8 hidden units, ELU, one output head (8, averaged,
    on PubMed), dropout 0.6 on both layers' inputs and on the normalised attention coefficients.
    ``value_dropout`` also drops each layer's projected features before aggregation, as the
    original GAT code does (see :class:`graphattn.GATConv`; 0 = PyG's layers).
    ``attention``/``attention_options`` choose the normalizer of both layers (see
    :class:`graphattn.GATConv`). ``x`` may be dense or a sparse CSR matrix.

    ``per_head_input_dropout`` draws the input dropout of each layer independently for every
    head, and ``attention_bias`` adds the per-head biases inside the LeakyReLU, as the original
    TF code does (see :class:`graphattn.GATConv`; both off by default).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        hidden_channels: int = 8,
        heads: int = 8,
        out_heads: int = 1,
        dropout: float = 0.6,
        negative_slope: float = 0.2,
        value_dropout: float = 0.0,
        attention: str = "softmax",
        attention_options: Optional[Mapping[str, Any]] = None,
        per_head_input_dropout: bool = False,
        attention_bias: bool = False,
    ):
        super().__init__()
        options = dict(attention_options or {})
        shared, per_head = (0.0, dropout) if per_head_input_dropout else (dropout, 0.0)
        layer = dict(dropout=dropout, negative_slope=negative_slope, value_dropout=value_dropout,
                     input_dropout=per_head, attention_bias=attention_bias, attention=attention, **options)
        self.input_dropout = SparseDropout(shared)
        self.conv1 = GATConv(in_channels, hidden_channels, heads=heads, concat=True, **layer)
        self.hidden_dropout = Dropout(shared)
        self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=out_heads, concat=False, **layer)

    def forward(self, x: Tensor, edge_index: Adj) -> Tensor:
        x = F.elu(self.conv1(self.input_dropout(x), edge_index))
        return self.conv2(self.hidden_dropout(x), edge_index)

    @torch.no_grad()
    def inference(self, x: Tensor, loader, env=None) -> Tensor:
        """The eval-mode output for every node, layer by layer over ``loader``'s full neighbourhoods
        (:func:`graphattn.layerwise.inference_loader`): what ``self(x, edge_index)`` gives in eval mode,
        without holding every layer's whole graph at once. ``env``: share the work over ``torchrun``
        processes (:class:`common.utils.distributed.DistEnv`)."""
        from .layerwise import layer_over_batches

        self.eval()
        env = env if env is not None else DistEnv()
        x = F.elu(layer_over_batches(self.conv1, x, loader, env))
        return layer_over_batches(self.conv2, x, loader, env)

    def kl(self, aux: AuxLosses, reduction: str = "layer_sum") -> Tensor:
        """The BAM KL collected in ``aux`` during a forward pass. Each layer adds the mean of its
        per-edge KL over edges and heads; ``"layer_sum"`` (ours) sums the two layers,
        ``"head_mean"`` averages over all heads of both layers (the official code's
        ``add_n(kl_list) / len(kl_list)``: 9 heads on Cora, so layer 1 weighs 8/9)."""
        terms = [value for name, value in aux.terms if name == "bam_kl"]
        if reduction not in KL_REDUCTIONS:
            raise ValueError(f"kl.reduction must be one of {KL_REDUCTIONS}, got {reduction!r}")
        if not terms:
            return torch.zeros(())
        if reduction == "layer_sum":
            return sum(terms)
        heads = [self.conv1.heads, self.conv2.heads]
        if len(terms) != len(heads):
            raise ValueError(f"expected one KL term per layer ({len(heads)}), got {len(terms)}")
        return sum(h * t for h, t in zip(heads, terms)) / sum(heads)


def build_model(cfg: DictConfig, num_features: int, num_classes: int) -> GAT:
    """The GAT described by ``cfg.model`` and ``cfg.attention``."""
    return GAT(num_features, num_classes, attention=cfg.attention.name,
               attention_options=dict(cfg.attention.options), **cfg.model)


def prepare_features(data: Data, cfg: DictConfig) -> Tensor:
    """``data.x`` as a sparse CSR matrix when ``train.sparse_features`` (same maths, faster)."""
    if not cfg.train.sparse_features:
        return data.x
    with warnings.catch_warnings():  # "sparse CSR support is in beta": we only use stable ops
        warnings.simplefilter("ignore", UserWarning)
        return data.x.to_sparse_csr()


def split_metrics(logits: Tensor, y: Tensor, mask: Tensor) -> Dict[str, float]:
    """Cross-entropy and accuracy of ``logits`` on the nodes of ``mask``."""
    logits = logits[mask].float()
    return {"loss": float(F.cross_entropy(logits, y[mask])),
            "acc": float((logits.argmax(-1) == y[mask]).float().mean())}


@torch.no_grad()
def evaluate_split(model: GAT, x, edge_index, y, mask, runtime: Optional[Runtime] = None) -> Dict[str, float]:
    """Cross-entropy and accuracy on ``mask`` with the model in eval mode (posterior mean)."""
    model.eval()
    with runtime.autocast() if runtime is not None else nullcontext():
        logits = model(x, edge_index)
    return split_metrics(logits, y, mask)
