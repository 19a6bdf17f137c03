"""Sparse normalizers: alpha-entmax with a learnable alpha per head, 1.5-entmax and sparsemax.

alpha-entmax (Peters, Niculae & Martins, 2019; Correia et al., 2019):
``entmax_alpha(z)_j = [(alpha - 1) z_j - tau]_+^{1/(alpha-1)}`` with ``tau`` making the row sum
to one; alpha = 2 is sparsemax, alpha -> 1 is softmax. A learnable alpha is parameterised as
``alpha = clamp(1 + sigmoid(z), 1.01, 2)`` (the entmax authors' advice), so it stays in
(1, 2] and never reaches the alpha = 1 singularity of the bisection.

Where :func:`~common.attention.kernels.use_triton` says so (CUDA tensors by default), both
layouts run the fused Triton bisection (:mod:`common.attention.kernels.entmax_bisect`: one
program per row or per (node, head) segment, analytic gradients for the scores and alpha).
Otherwise the dense layout uses the ``entmax`` package (exact sort-based 1.5-entmax and
sparsemax, bisection with an analytic alpha gradient) and the edge-wise layout bisects per
target node with scatter operations (:func:`~common.attention.functional.entmax_bisect_groups`).
The dense layout is one custom operator, :func:`dense_entmax` (``torch.ops.attention_suite.entmax``),
whatever runs inside it, and the edge-wise kernels over target-sorted edges are another
(``torch.ops.attention_suite.entmax_csr``), so ``torch.compile`` keeps them in one graph.
"""
from __future__ import annotations

import math
from typing import Optional

import entmax as entmax_lib
import torch
from torch import Tensor, nn

from .base import Normalizer
from .functional import bisect_iterations, entmax_bisect_groups
from .groups import DenseGroups
from .kernels import KernelFailure, fall_back, use_triton

MIN_ALPHA = 1.01
#: ``power`` of the dense operator: any alpha (bisection), sparsemax, 1.5-entmax (exact on the support found).
ANY_ALPHA, SPARSEMAX, ENTMAX15 = 0, 1, 2


def _fused(scores: Tensor, alpha, groups, n_iter: Optional[int]) -> Optional[Tensor]:
    """The fused Triton bisection of edge-wise groups where it applies, else ``None`` (the PyTorch path).
    Under ``torch.compile`` it applies to target-sorted groups (``ptr``), whose kernels are one custom
    operator (``torch.ops.attention_suite.entmax_csr``); unsorted ones would be sorted first, by value."""
    if not use_triton(scores, "entmax", behind_op=groups.ptr is not None):
        return None
    from .kernels.entmax_bisect import entmax_bisect_groups as fused_bisect

    try:
        return fused_bisect(scores, alpha, groups, n_iter or bisect_iterations(scores.dtype))
    except KernelFailure as failure:  # cannot compile or run on this GPU: warn once, PyTorch path from now on
        fall_back(failure)
        return None


@torch.library.custom_op("attention_suite::entmax", mutates_args=())
def dense_entmax(scores: Tensor, mask: Optional[Tensor], alpha: Tensor, n_iter: int, power: int) -> Tensor:
    """alpha-entmax over the last dimension of dense ``scores [..., heads, queries, keys]`` with a boolean
    ``mask`` (True = attend, or None; masked keys and fully masked rows get exact zeros), ``alpha`` one value
    or one per head, and ``power`` :data:`ANY_ALPHA`, :data:`SPARSEMAX` or :data:`ENTMAX15`.

    A custom operator (``torch.ops.attention_suite.entmax``), so that ``torch.compile`` sees one op: the fused
    Triton bisection where :func:`~common.attention.kernels.use_triton` says so, else the ``entmax`` package
    (bisection, or the exact sort-based 1.5-entmax and sparsemax). Its gradient is
    ``torch.ops.attention_suite.entmax_backward``.
    """
    if use_triton(scores, "entmax"):
        from .kernels.entmax_bisect import dense_forward
        try:
            return dense_forward(scores, alpha, mask, n_iter, power)
        except KernelFailure as failure:  # cannot compile or run on this GPU: warn once, PyTorch path from now on
            fall_back(failure)
    filled = _dense_fill(scores, mask)
    if power == SPARSEMAX:
        weights = entmax_lib.sparsemax(filled, dim=-1)
    elif power == ENTMAX15:
        weights = entmax_lib.entmax15(filled, dim=-1)
    else:
        per_row = _per_row(alpha, scores.dtype).expand(scores.shape[:-1] + (1,))
        weights = entmax_lib.entmax_bisect(filled, per_row, dim=-1, n_iter=n_iter)
    return weights if mask is None else weights.masked_fill(~mask, 0.0)


@dense_entmax.register_fake
def _(scores, mask, alpha, n_iter, power):
    return torch.empty_like(scores)


@torch.library.custom_op("attention_suite::entmax_backward", mutates_args=())
def dense_entmax_backward(weights: Tensor, grad: Tensor, alpha: Tensor, power: int) -> tuple[Tensor, Tensor]:
    """The gradients of :func:`dense_entmax` for the scores and alpha: with ``g = grad`` and ``s = p^(2 - alpha)``
    on the support (the Jacobian's diagonal, up to rank one), ``d scores = s (g - sum(g s) / sum s)`` and, per
    row, ``d alpha = (sum(g p) - q) / (alpha - 1)^2 - (sum(g p log p) - q sum(p log p)) / (alpha - 1)`` with
    ``q = sum(g s) / sum s`` (the ``entmax`` package's formulas), summed over each head's rows."""
    if use_triton(weights, "entmax"):
        from .kernels.entmax_bisect import dense_backward
        try:
            return dense_backward(weights, grad, alpha, power, alpha_grad=True)
        except KernelFailure as failure:
            fall_back(failure)
    p, g = weights, grad.to(weights.dtype)
    a = _per_row(alpha, p.dtype)
    positive = p > 0
    if power == SPARSEMAX:
        slope = positive.to(p.dtype)
    elif power == ENTMAX15:
        slope = p.sqrt()
    else:
        slope = torch.where(positive, p.clamp_min(torch.finfo(p.dtype).tiny) ** (2 - a), 0.0)
    total = slope.sum(-1, keepdim=True)
    q = (g * slope).sum(-1, keepdim=True) / torch.where(total > 0, total, 1.0)
    d_scores = slope * (g - q)
    plogp = torch.where(positive, p * torch.log(torch.where(positive, p, 1.0)), 0.0)
    am1 = a - 1
    per_row = ((g * p).sum(-1, keepdim=True) - q) / am1 ** 2 \
        - ((g * plogp).sum(-1, keepdim=True) - q * plogp.sum(-1, keepdim=True)) / am1
    d_alpha = per_row.sum() if alpha.numel() == 1 else per_row.transpose(0, -3).reshape(alpha.numel(), -1).sum(1)
    return d_scores, d_alpha.reshape(alpha.shape).to(alpha.dtype)


@dense_entmax_backward.register_fake
def _(weights, grad, alpha, power):
    return torch.empty_like(weights), torch.empty_like(alpha)


def _entmax_setup(ctx, inputs, output):
    _, _, alpha, _, power = inputs
    ctx.save_for_backward(output, alpha)
    ctx.power = power


def _entmax_gradient(ctx, grad):
    weights, alpha = ctx.saved_tensors
    d_scores, d_alpha = dense_entmax_backward(weights, grad, alpha, ctx.power)
    return d_scores, None, d_alpha if ctx.needs_input_grad[2] else None, None, None


dense_entmax.register_autograd(_entmax_gradient, setup_context=_entmax_setup)


def _per_row(alpha: Tensor, dtype: torch.dtype) -> Tensor:
    """One alpha per head as ``[heads, 1, 1]`` (broadcasting over ``[..., heads, queries, 1]``), or one in all."""
    return (alpha.view(-1, 1, 1) if alpha.numel() > 1 else alpha.view(())).to(dtype)


def _dense_fill(scores: Tensor, mask: Optional[Tensor]) -> Tensor:
    # A finite fill (not -inf) keeps masked keys out of the support; a fully masked row is filled
    # with zeros instead (the package gives NaN on a row of dtype minima, and NaN alpha gradients).
    if mask is None:
        return scores
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return filled.masked_fill(~mask.any(-1, keepdim=True), 0.0)


class Entmax(Normalizer):
    """alpha-entmax; ``learn_alpha=True`` learns one alpha per head (``num_heads``) or one in all."""

    def __init__(
        self,
        alpha: float = 1.5,
        learn_alpha: bool = True,
        num_heads: Optional[int] = None,
        n_iter: Optional[int] = None,
        key_dim: Optional[int] = None,
    ):
        super().__init__()
        if not MIN_ALPHA <= alpha <= 2:
            raise ValueError(f"entmax alpha must be in [{MIN_ALPHA}, 2], got {alpha}")
        self.n_iter = n_iter
        shape = (num_heads,) if num_heads else ()
        start = torch.full(shape, math.log((alpha - 1) / max(2 - alpha, 1e-6)))  # sigmoid^-1(alpha - 1)
        if learn_alpha:
            self.alpha_logit = nn.Parameter(start)
        else:
            self.register_buffer("alpha_logit", start)

    @property
    def alpha(self) -> Tensor:
        """Current alpha per head, in [1.01, 2]."""
        return (1 + torch.sigmoid(self.alpha_logit)).clamp(MIN_ALPHA, 2.0)

    def _alpha_for(self, scores: Tensor, groups) -> Tensor:
        alpha = self.alpha.to(scores.dtype)
        if alpha.dim() and isinstance(groups, DenseGroups):
            if scores.dim() < 3 or scores.shape[-3] != alpha.shape[0]:
                raise ValueError(
                    f"entmax has {alpha.shape[0]} heads; dense scores must be [..., heads, queries, keys], "
                    f"got {tuple(scores.shape)}"
                )
            return alpha.view(-1, 1, 1)
        return alpha

    def normalize(self, scores: Tensor, groups, keys=None, key_index=None) -> Tensor:
        alpha = self._alpha_for(scores, groups)
        if isinstance(groups, DenseGroups):
            return dense_entmax(scores, groups.mask, alpha.reshape(-1), self.n_iter or bisect_iterations(scores.dtype),
                                ANY_ALPHA)
        fused = _fused(scores, alpha, groups, self.n_iter)
        return fused if fused is not None else entmax_bisect_groups(scores, alpha, groups, self.n_iter)


class _FixedEntmax(Normalizer):
    """Shared body of the fixed-alpha variants: exact dense op, bisection edge-wise (fused where it applies)."""

    alpha_value: float
    power: int

    def __init__(self, num_heads: Optional[int] = None, key_dim: Optional[int] = None, n_iter: Optional[int] = None):
        super().__init__()
        self.n_iter = n_iter

    def normalize(self, scores: Tensor, groups, keys=None, key_index=None) -> Tensor:
        if isinstance(groups, DenseGroups):
            alpha = scores.new_full((1,), self.alpha_value, dtype=torch.promote_types(scores.dtype, torch.float32))
            return dense_entmax(scores, groups.mask, alpha, self.n_iter or bisect_iterations(scores.dtype), self.power)
        fused = _fused(scores, self.alpha_value, groups, self.n_iter)
        return fused if fused is not None else entmax_bisect_groups(scores, self.alpha_value, groups, self.n_iter)


class Entmax15(_FixedEntmax):
    """1.5-entmax (exact sort-based in the dense layout)."""

    alpha_value, power = 1.5, ENTMAX15


class Sparsemax(_FixedEntmax):
    """Sparsemax, i.e. 2-entmax (Martins & Astudillo, 2016)."""

    alpha_value, power = 2.0, SPARSEMAX
