"""Linear maps of sparse CSR node features (bag-of-words: Cora's are 1.3 % non-zero).

``sparse_linear(x, W) = x @ W.T`` costs ``O(nnz * out)`` both ways and never densifies ``x``:

* forward, one weighted gather-sum per row of ``x`` (``F.embedding_bag`` over its CSR pattern);
* backward, ``dL/dW^T = x^T @ G`` the same way over the pattern of ``x^T``, whose rows are ``x``'s columns.
  ``F.embedding_bag``'s own gradient sorts the column indices at every call to get there (on Cora's first
  layer, 3.1 of its 3.6 ms on one CPU thread); here the transposed pattern is made once per feature matrix
  and kept (:func:`transposed`). Both sum each column's entries in row order: the same gradients up to
  the rounding of fused multiply-adds (on Cora's features, the same bits).

Input dropout (:class:`~graphattn.dropout.SparseDropout`) keeps ``x``'s index tensors and changes its values
only, so every epoch of a transductive run reuses one transposed pattern.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.index import index2ptr

#: Transposed patterns kept (least recently used first out): a run's feature matrices, not every batch's.
KEPT = 4


class Pattern(NamedTuple):
    """A CSR pattern ``(crow, col)`` and, for a transposed one, where each of its entries is in the original."""

    crow: Tensor
    col: Tensor
    order: Tensor


_kept: "OrderedDict[tuple, tuple]" = OrderedDict()


def transposed(crow: Tensor, col: Tensor, num_cols: int) -> Pattern:
    """The CSR pattern of ``x^T`` for ``x``'s ``(crow, col)`` with ``num_cols`` columns: its rows in column order,
    each row's entries in ``x``'s row order (a stable sort). Kept for the same index tensors (the same memory,
    unchanged since): the entry holds them, so their addresses cannot be reused by other tensors meanwhile."""
    key = (crow.data_ptr(), col.data_ptr(), col.numel(), crow.numel(), num_cols, crow._version, col._version,
           crow.device)
    if key in _kept:
        _kept.move_to_end(key)
        return _kept[key][2]
    order = torch.sort(col, stable=True).indices
    rows = torch.repeat_interleave(torch.arange(crow.numel() - 1, device=col.device), crow.diff())
    pattern = Pattern(index2ptr(col.long()[order], num_cols), rows[order], order)  # (no bincount: deterministic)
    _kept[key] = (crow, col, pattern)
    if len(_kept) > KEPT:
        _kept.popitem(last=False)
    return pattern


def _gather_sum(pattern_crow: Tensor, pattern_col: Tensor, table: Tensor, weights: Tensor) -> Tensor:
    """Row ``i`` of the result: ``sum_k weights[k] * table[col[k]]`` over row ``i``'s entries ``k``."""
    return F.embedding_bag(pattern_col, table, pattern_crow, mode="sum", per_sample_weights=weights,
                           include_last_offset=True)


class _SparseLinear(torch.autograd.Function):
    """``x @ weight_t`` for a CSR ``x`` given as ``(values, crow, col)``, with the gradients of its values and of
    ``weight_t`` (``[in, out]``)."""

    @staticmethod
    def forward(ctx, values: Tensor, crow: Tensor, col: Tensor, weight_t: Tensor) -> Tensor:
        ctx.save_for_backward(values, crow, col, weight_t)
        return _gather_sum(crow, col, weight_t, values)

    @staticmethod
    def backward(ctx, grad: Tensor):
        values, crow, col, weight_t = ctx.saved_tensors
        d_values = d_weight = None
        if ctx.needs_input_grad[0]:  # dL/dx_rc = G_r . W^T_c, at the stored entries only
            rows = torch.repeat_interleave(torch.arange(crow.numel() - 1, device=col.device), crow.diff())
            d_values = (grad.index_select(0, rows) * weight_t.index_select(0, col)).sum(-1)
        if ctx.needs_input_grad[3]:
            t = transposed(crow, col, weight_t.shape[0])
            d_weight = _gather_sum(t.crow, t.col, grad.contiguous(), values.index_select(0, t.order))
        return d_values, None, None, d_weight


def sparse_linear(x: Tensor, weight: Tensor) -> Tensor:
    """``x @ weight.T`` for a sparse CSR ``x`` ``[N, in]`` and ``weight`` ``[out, in]``: ``[N, out]``."""
    if x.layout != torch.sparse_csr or x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"sparse_linear takes a 2-d sparse CSR x [N, in] and a weight [out, in], got x "
                         f"{tuple(x.shape)} ({x.layout}) and weight {tuple(weight.shape)}")
    weight_t = weight.t().contiguous()
    if torch.compiler.is_compiling():  # traced as plain operators (the transposed pattern is kept in Python)
        return _gather_sum(x.crow_indices(), x.col_indices(), weight_t, x.values())
    return _SparseLinear.apply(x.values(), x.crow_indices(), x.col_indices(), weight_t)
