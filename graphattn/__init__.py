"""Graph attention networks with the suite's attention variants (PyG ``MessagePassing``).

Layer: a drop-in ``torch_geometric.nn.GATConv`` with ``attention=<variant>``::

    from graphattn import GATConv
    conv = GATConv(1433, 8, heads=8, dropout=0.6, attention="bam-wc", k=3.0, beta=1.0)
    with common.attention.aux_losses() as aux:       # collects the BAM KL of every layer
        out = conv(x, edge_index)
    loss = task_loss + kl_weight * aux.total()

Experiments (BAM paper, Table 1)::

    python -m graphattn.train --dataset Cora --attention bam-wc --seeds 10
    python -m graphattn.evaluate runs/gat/Cora/bam-wc --mc-samples 20     # PAvPU, ECE
    python scripts/reproduce_gat_table.py                                  # the whole table

Settings live in ``graphattn/configs/*.yaml`` (any key can be overridden as ``key=value``);
the BAM hyperparameters and how they were chosen are documented in ``configs/cora.yaml``.
"""
from common.lazy import lazy_exports

#: Public names and their submodules, imported on first use (``python -m graphattn.train --help``
#: answers before torch_geometric is loaded).
_EXPORTS = {"GAT": "models", "GATConv": "conv", "sparse_linear": "sparse_features", "Dropout": "dropout",
            "SparseDropout": "dropout"}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
