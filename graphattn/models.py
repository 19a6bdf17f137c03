"""The two-layer GAT of Velickovic et al. (ICLR 2018, Sec. 3.3) with any attention variant."""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.typing import Adj

from .conv import GATConv
from .dropout import Dropout, SparseDropout


class GAT(nn.Module):
    r"""``dropout -> GATConv(heads x hidden, concat) -> ELU -> dropout -> GATConv(out_heads, mean)``.

    The paper's transductive model: 8 heads x 8 hidden units, ELU, one output head (8, averaged,
    on PubMed), dropout 0.6 on both layers' inputs and on the normalised attention coefficients.
    ``value_dropout`` also drops each layer's projected features before aggregation, as the
    original GAT code does (see :class:`graphattn.GATConv`; 0 = PyG's layers).
    ``attention``/``attention_options`` choose the normalizer of both layers (see
    :class:`graphattn.GATConv`). ``x`` may be dense or a sparse CSR matrix.
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
    ):
        super().__init__()
        options = dict(attention_options or {})
        self.input_dropout = SparseDropout(dropout)
        self.conv1 = GATConv(in_channels, hidden_channels, heads=heads, concat=True, dropout=dropout,
                             negative_slope=negative_slope, value_dropout=value_dropout,
                             attention=attention, **options)
        self.hidden_dropout = Dropout(dropout)
        self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=out_heads, concat=False,
                             dropout=dropout, negative_slope=negative_slope, value_dropout=value_dropout,
                             attention=attention, **options)

    def forward(self, x: Tensor, edge_index: Adj) -> Tensor:
        x = F.elu(self.conv1(self.input_dropout(x), edge_index))
        return self.conv2(self.hidden_dropout(x), edge_index)
