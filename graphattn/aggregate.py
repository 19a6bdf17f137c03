r"""GAT's weighted neighbourhood sum as one sparse-dense product per layer (GAT Eq. 4):

.. math:: \mathbf{x}'_{i,h} = \sum_{j \in \mathcal{N}(i)} \alpha_{ij,h}\, \mathbf{x}_{j,h}

PyG computes it edge by edge (gather ``x_j``, multiply by ``alpha``, scatter-add), which
materialises two ``[num_edges, heads, channels]`` tensors forward and more backward.
Here the heads form one block-diagonal CSR matrix ``A`` (block ``h`` holds ``alpha[:, h]``
at the graph's non-zeros), so the forward is ``A @ X``, the feature gradient ``A^T @ G``
and the weight gradient the sampled product ``<G_i, X_j>`` at the non-zeros
(``torch.sparse.sampled_addmm``). PyG's own ``EdgeIndex.matmul`` does the first two but
has no gradient for the edge values, which attention needs.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.index import index2ptr, ptr2index


@dataclass(eq=False)
class TargetCSR:
    """A graph's edges sorted by target: ``src[ptr[i]:ptr[i+1]]`` are the sources of target ``i``.

    The block-diagonal index arrays of ``A`` and ``A^T`` (and the permutation that sorts the
    edges by source, which ``A^T`` needs) are built on first use and kept, so a graph that is
    reused across calls (see ``GATConv``) builds them once. They are int32 where the sizes allow.
    """

    src: Tensor
    ptr: Tensor
    num_src: int
    _patterns: Dict[Tuple[int, bool], Tuple[Tensor, Tensor, Optional[Tensor]]] = field(default_factory=dict)

    @property
    def num_dst(self) -> int:
        return self.ptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.src.numel()

    @classmethod
    def from_edge_index(cls, edge_index: EdgeIndex) -> "TargetCSR":
        """From an ``EdgeIndex`` sorted by target (``sort_by("col")``), reusing its CSC cache."""
        (ptr, src), _ = edge_index.get_csc()
        return cls(src.as_subclass(Tensor), ptr.as_subclass(Tensor), edge_index.get_sparse_size(0))

    def _pattern(self, heads: int, transpose: bool) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """``crow``, ``col`` of the block-diagonal matrix, and the edge order of its values."""
        key = (heads, transpose)
        if key not in self._patterns:
            order = None
            ptr, cols, num_cols = self.ptr, self.src, self.num_src
            if transpose:
                order = torch.argsort(self.src, stable=True)
                ptr = index2ptr(self.src.index_select(0, order), self.num_src)
                cols = ptr2index(self.ptr, self.num_edges).index_select(0, order)
                num_cols = self.num_dst
            dtype = torch.int32 if heads * max(self.num_edges, num_cols) < 2**31 else torch.long
            offsets = torch.arange(heads, device=ptr.device).view(-1, 1)
            crow = torch.cat([(ptr[:-1].view(1, -1) + offsets * self.num_edges).view(-1),
                              ptr.new_full((1,), heads * self.num_edges)])
            col = (cols.view(1, -1) + offsets * num_cols).view(-1)
            self._patterns[key] = (crow.to(dtype), col.to(dtype), order)
        return self._patterns[key]

    def block_diagonal(self, values: Tensor, transpose: bool = False) -> Tensor:
        """The ``[heads * rows, heads * cols]`` CSR matrix with block ``h`` = ``values[:, h]``
        at the graph's non-zeros (``transpose=True``: of ``A^T``)."""
        heads = values.shape[1]
        crow, col, order = self._pattern(heads, transpose)
        if order is not None:
            values = values.index_select(0, order)
        num_rows, num_cols = (self.num_src, self.num_dst) if transpose else (self.num_dst, self.num_src)
        with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(crow, col, values.t().reshape(-1),
                                           (heads * num_rows, heads * num_cols), check_invariants=False)


def _heads_first(x: Tensor) -> Tensor:
    """``[nodes, heads, channels]`` -> ``[heads * nodes, channels]`` (one copy)."""
    return x.transpose(0, 1).reshape(-1, x.shape[-1])


class _HeadwiseSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, alpha: Tensor, x: Tensor, csr: TargetCSR) -> Tensor:
        heads, channels = x.shape[1], x.shape[2]
        adjacency = csr.block_diagonal(alpha)
        x_heads = _heads_first(x)
        out = torch.sparse.mm(adjacency, x_heads).view(heads, csr.num_dst, channels)
        ctx.save_for_backward(alpha, x_heads)
        ctx.csr, ctx.adjacency = csr, adjacency
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        alpha, x_heads = ctx.saved_tensors
        csr = ctx.csr
        num_edges, heads = alpha.shape
        grad_heads = _heads_first(grad)
        d_alpha = d_x = None
        if ctx.needs_input_grad[0]:  # <G_i, X_j> at every non-zero (i, j) of every head
            sampled = torch.sparse.sampled_addmm(ctx.adjacency, grad_heads, x_heads.t(), beta=0.0)
            d_alpha = sampled.values().view(heads, num_edges).t()
        if ctx.needs_input_grad[1]:
            d_x = torch.sparse.mm(csr.block_diagonal(alpha, transpose=True), grad_heads)
            d_x = d_x.view(heads, csr.num_src, -1).transpose(0, 1)
        return d_alpha, d_x, None


def attention_aggregate(alpha: Tensor, x: Tensor, csr: TargetCSR) -> Tensor:
    """``out[i, h] = sum_j alpha[e_ij, h] * x[j, h]`` over the target-sorted edges of ``csr``.

    Args:
        alpha: ``[num_edges, heads]`` attention weights, in the order of ``csr``.
        x: ``[num_src, heads, channels]`` source features.
    Returns:
        ``[num_dst, heads, channels]`` (a transposed view; ``reshape`` it to concatenate heads).
    """
    if alpha.shape[0] == 0:
        return x.new_zeros(csr.num_dst, x.shape[1], x.shape[2])
    return _HeadwiseSpMM.apply(alpha, x, csr)
