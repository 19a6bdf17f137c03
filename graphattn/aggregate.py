r"""GAT's weighted neighbourhood sum as one sparse-dense product per layer (GAT Eq. 4):

.. math:: \mathbf{x}'_{i,h} = \sum_{j \in \mathcal{N}(i)} \alpha_{ij,h}\, \mathbf{x}_{j,h}

PyG computes it edge by edge (gather ``x_j``, multiply by ``alpha``, scatter-add), which
materialises two ``[num_edges, heads, channels]`` tensors forward and more backward.
Here the heads form one sparse CSR matrix ``A`` of size ``[nodes * heads, nodes * heads]``
whose row ``i * heads + h`` holds ``alpha[e, h]`` at column ``j * heads + h`` for every edge
``e = (j -> i)``. With ``X = x.view(-1, channels)`` the forward is ``A @ X``, the feature
gradient ``A^T @ G`` and the weight gradient the sampled product ``<G_i, X_j>`` at the
non-zeros (``torch.sparse.sampled_addmm``); no ``[nodes, heads, channels]`` tensor is ever
transposed. PyG's own ``EdgeIndex.matmul`` does the first two but has no gradient for the
edge values, which attention needs.
"""
from __future__ import annotations

import ctypes
import functools
import os
import warnings
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.index import index2ptr, ptr2index

from common.attention.kernels import cpu_bam
from common.attention.kernels.cpu_bam import threads_for


#: dtypes with sparse CSR products and sampled products on CPU (MKL) and CUDA; others (float16,
#: bfloat16) aggregate edge by edge.
SPARSE_DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class HeadPattern:
    """A ``heads``-interleaved CSR pattern: ``crow``, ``col``, for every non-zero the position
    of its value in the flattened ``[num_edges, heads]`` weights (``value_index``), and
    optionally the inverse permutation (``entry_index``: the non-zero of every weight; kept
    only where the edge ids are the row order itself)."""

    crow: Tensor
    col: Tensor
    value_index: Tensor
    entry_index: Optional[Tensor]
    shape: Tuple[int, int]

    @classmethod
    def build(cls, ptr: Tensor, cols: Tensor, num_cols: int, heads: int,
              order: Optional[Tensor] = None) -> "HeadPattern":
        """For edges sorted by row (``ptr``), each with its column; ``order[q]`` is the edge id
        of the ``q``-th of them (``None``: the edge ids are the row order itself).

        Row ``r * heads + h`` holds the ``degree[r]`` edges of row ``r``, from
        ``heads * ptr[r] + h * degree[r]`` on, so edge ``q`` of row ``r`` and head ``h`` is
        non-zero ``(heads - 1) * ptr[r] + q + h * degree[r]``. On the CPU one pass of C
        (``common/attention/kernels/cpu/head_pattern.c``, where it builds) writes the pattern; else
        gathers over the edges, broadcasts and two scatters over the non-zeros (no repeats or sorts),
        in 32-bit integers where the sizes allow.
        """
        num_rows, num_edges = ptr.numel() - 1, cols.numel()
        small = heads * max(num_edges, num_rows, num_cols) < 2**31
        shape = (num_rows * heads, num_cols * heads)
        if small and ptr.device.type == "cpu" and _native() is not None:
            crow = torch.empty(num_rows * heads + 1, dtype=torch.int32)
            col, value_index = (torch.empty(heads * num_edges, dtype=torch.int32) for _ in range(2))
            entry = torch.empty_like(col) if order is None else None
            inputs = [None if x is None else x.long().contiguous() for x in (ptr, cols, order)]
            outputs = (crow, col, value_index, entry)
            _native().head_pattern(*(None if x is None else x.data_ptr() for x in inputs), num_rows, heads,
                                   *(None if x is None else x.data_ptr() for x in outputs), threads_for(col.numel()))
            return cls(crow, col, value_index, entry, shape)
        dtype = torch.int32 if small else torch.long
        device = ptr.device
        ptr, cols = ptr.to(dtype), cols.to(dtype)
        head = torch.arange(heads, dtype=dtype, device=device)
        degree = ptr.diff()
        crow = torch.cat([(heads * ptr[:-1].view(-1, 1) + head * degree.view(-1, 1)).view(-1),
                          ptr.new_full((1,), heads * num_edges)])
        rows = ptr2index(ptr, num_edges)
        first = ((heads - 1) * ptr[:-1]).index_select(0, rows) + torch.arange(num_edges, dtype=dtype, device=device)
        entry = (first.view(-1, 1) + head * degree.index_select(0, rows).view(-1, 1)).view(-1)
        positions = entry.long()
        col = torch.empty_like(entry).scatter_(0, positions, (cols.view(-1, 1) * heads + head).view(-1))
        edges = torch.arange(num_edges, dtype=dtype, device=device) if order is None else order.to(dtype)
        value_index = torch.empty_like(entry).scatter_(0, positions, (edges.view(-1, 1) * heads + head).view(-1))
        return cls(crow, col, value_index, entry if order is None else None, shape)

    def matrix(self, values: Tensor) -> Tensor:
        """The sparse matrix with ``values`` (``[num_edges, heads]``, contiguous) at the pattern."""
        with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(self.crow, self.col, values.reshape(-1).index_select(0, self.value_index),
                                           self.shape, check_invariants=False)


def _native():
    """The C pattern builder (``common/attention/kernels/cpu/head_pattern.c``, compiled on first use as the
    attention kernels are), or None where it does not build or ``ATTN_CPU_KERNELS=0`` (read at each call, as the
    attention kernels read it)."""
    return None if os.environ.get("ATTN_CPU_KERNELS", "1") == "0" else _built()


@functools.lru_cache(maxsize=None)
def _built():
    lib = cpu_bam.build("head_pattern", "graphattn's sparse patterns")
    if lib is not None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.head_pattern.argtypes = [ptr] * 3 + [i64, ctypes.c_int] + [ptr] * 4 + [ctypes.c_int]
        lib.counting_sort.argtypes = [ptr, i64, i64, ptr, ptr]
        lib.head_pattern.restype = lib.counting_sort.restype = None
    return lib


def sort_order(keys: Tensor, bins: int) -> Tuple[Tensor, Tensor]:
    """The stable order of integer ``keys`` in ``[0, bins)`` (node ids of a validated graph: the C pass does
    not check them) and the CSR pointer ``[bins + 1]`` of the sorted keys: one counting pass of C on the CPU
    (where it builds), else a stable sort."""
    if keys.device.type == "cpu" and _native() is not None:
        keys = keys.long().contiguous()
        order, ptr = torch.empty_like(keys), keys.new_empty(bins + 1)
        _native().counting_sort(keys.data_ptr(), keys.numel(), bins, ptr.data_ptr(), order.data_ptr())
        return order, ptr
    order = torch.argsort(keys, stable=True)
    return order, index2ptr(keys.index_select(0, order), bins)


@dataclass(eq=False)
class TargetCSR:
    """A graph's edges sorted by target: ``src[ptr[i]:ptr[i+1]]`` are the sources of target ``i``.

    The patterns of ``A`` and ``A^T`` are built on first use and kept, so a graph that is
    reused across calls (see ``GATConv``) builds them once.
    """

    src: Tensor
    ptr: Tensor
    num_src: int
    _patterns: Dict[Tuple[int, bool], HeadPattern] = field(default_factory=dict)

    @property
    def num_dst(self) -> int:
        return self.ptr.numel() - 1

    @classmethod
    def from_edge_index(cls, edge_index: EdgeIndex) -> "TargetCSR":
        """From an ``EdgeIndex`` sorted by target (``sort_by("col")``), reusing its CSC cache."""
        (ptr, src), _ = edge_index.get_csc()
        return cls(src, ptr, edge_index.get_sparse_size(0))

    def pattern(self, heads: int, transpose: bool = False) -> HeadPattern:
        """The pattern of ``A`` (rows are targets) or of ``A^T`` (rows are sources)."""
        key = (heads, transpose)
        if key not in self._patterns:
            if transpose:
                order, ptr = sort_order(self.src, self.num_src)
                dst = ptr2index(self.ptr, self.src.numel())
                self._patterns[key] = HeadPattern.build(ptr, dst.index_select(0, order), self.num_dst, heads, order)
            else:
                self._patterns[key] = HeadPattern.build(self.ptr, self.src, self.num_src, heads)
        return self._patterns[key]


class _HeadwiseSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, alpha: Tensor, x: Tensor, csr: TargetCSR) -> Tensor:
        heads, channels = x.shape[1], x.shape[2]
        alpha, x_rows = alpha.contiguous(), x.reshape(-1, channels)
        adjacency = csr.pattern(heads).matrix(alpha)
        ctx.save_for_backward(alpha, x_rows)
        ctx.csr, ctx.adjacency = csr, adjacency
        return torch.sparse.mm(adjacency, x_rows).view(csr.num_dst, heads, channels)

    @staticmethod
    def backward(ctx, grad: Tensor):
        alpha, x_rows = ctx.saved_tensors
        csr, heads = ctx.csr, alpha.shape[1]
        grad_rows = grad.reshape(-1, grad.shape[-1])
        d_alpha = d_x = None
        if ctx.needs_input_grad[0]:  # <G_i, X_j> at every non-zero (i, j), back in edge order
            sampled = torch.sparse.sampled_addmm(ctx.adjacency, grad_rows, x_rows.t(), beta=0.0).values()
            d_alpha = sampled.index_select(0, csr.pattern(heads).entry_index).view_as(alpha)
        if ctx.needs_input_grad[1]:
            d_x = torch.sparse.mm(csr.pattern(heads, transpose=True).matrix(alpha), grad_rows)
            d_x = d_x.view(csr.num_src, heads, -1)
        return d_alpha, d_x, None


def attention_aggregate(alpha: Tensor, x: Tensor, csr: TargetCSR) -> Tensor:
    """``out[i, h] = sum_j alpha[e_ij, h] * x[j, h]`` over the target-sorted edges of ``csr``.

    Args:
        alpha: ``[num_edges, heads]`` attention weights, in the order of ``csr``.
        x: ``[num_src, heads, channels]`` source features.
    Returns:
        ``[num_dst, heads, channels]``.
    """
    if torch.is_autocast_enabled(x.device.type):  # the inputs' dtypes choose the kernel, not autocast
        with torch.autocast(x.device.type, enabled=False):
            return attention_aggregate(alpha, x, csr)
    if alpha.shape[0] == 0:
        return x.new_zeros(csr.num_dst, x.shape[1], x.shape[2])
    if x.dtype not in SPARSE_DTYPES or alpha.dtype != x.dtype:
        return _edge_by_edge(alpha, x, csr)
    return _HeadwiseSpMM.apply(alpha, x, csr)


def _edge_by_edge(alpha: Tensor, x: Tensor, csr: TargetCSR) -> Tensor:
    """PyG's way (gather, weight, scatter-add), for dtypes the sparse kernels lack."""
    return edge_by_edge(alpha, x, csr.src, ptr2index(csr.ptr, csr.src.numel()), csr.num_dst)


def edge_by_edge(alpha: Tensor, x: Tensor, src: Tensor, dst: Tensor, num_dst: int) -> Tensor:
    """``out[dst[e], h] += alpha[e, h] * x[src[e], h]``: gather, weight, ``index_add`` (what
    ``torch.compile`` traces and inductor fuses; no sparse tensor)."""
    messages = alpha.unsqueeze(-1) * x.index_select(0, src)
    return x.new_zeros(num_dst, x.shape[1], x.shape[2]).index_add_(0, dst, messages.to(x.dtype))
