"""Graph attention networks with the suite's attention variants (PyG ``MessagePassing``).

>>> from graphattn import GATConv
>>> conv = GATConv(1433, 8, heads=8, dropout=0.6, attention="bam-wc", k=10, beta=1.0)
"""
from .conv import GATConv, sparse_linear
from .dropout import Dropout, SparseDropout
from .models import GAT

__all__ = ["GAT", "GATConv", "Dropout", "SparseDropout", "sparse_linear"]
