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


def _fused(scores: Tensor, alpha, groups, n_iter: Optional[int]) -> Optional[Tensor]:
    """The fused Triton bisection where it applies, else ``None`` (take the PyTorch path)."""
    if not use_triton(scores, "entmax"):
        return None
    from .kernels.entmax_bisect import entmax_bisect_groups as fused_bisect

    try:
        return fused_bisect(scores, alpha, groups, n_iter or bisect_iterations(scores.dtype))
    except KernelFailure as failure:  # cannot compile or run on this GPU: warn once, PyTorch path from now on
        fall_back(failure)
        return None


def _dense_fill(scores: Tensor, groups: DenseGroups) -> Tensor:
    # A finite fill (not -inf) keeps masked keys out of the support; a fully masked row is filled
    # with zeros instead (the package gives NaN on a row of dtype minima, and NaN alpha gradients).
    filled = groups.fill(scores, torch.finfo(scores.dtype).min)
    if groups.empty_rows:
        filled = filled.masked_fill(~groups.mask.any(-1, keepdim=True), 0.0)
    return filled


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
        fused = _fused(scores, alpha, groups, self.n_iter)
        if fused is not None:
            return fused
        if isinstance(groups, DenseGroups):
            shape = list(scores.shape)
            shape[-1] = 1
            weights = entmax_lib.entmax_bisect(
                _dense_fill(scores, groups), alpha.expand(shape), dim=-1,
                n_iter=self.n_iter or bisect_iterations(scores.dtype),
            )
            return groups.zero_masked(weights)
        return entmax_bisect_groups(scores, alpha, groups, self.n_iter)


class _FixedEntmax(Normalizer):
    """Shared body of the fixed-alpha variants: exact dense op, bisection edge-wise (fused where it applies)."""

    alpha_value: float

    def __init__(self, num_heads: Optional[int] = None, key_dim: Optional[int] = None, n_iter: Optional[int] = None):
        super().__init__()
        self.n_iter = n_iter

    def normalize(self, scores: Tensor, groups, keys=None, key_index=None) -> Tensor:
        fused = _fused(scores, self.alpha_value, groups, self.n_iter)
        if fused is not None:
            return fused
        if isinstance(groups, DenseGroups):
            return groups.zero_masked(self.dense_op(_dense_fill(scores, groups), dim=-1))
        return entmax_bisect_groups(scores, self.alpha_value, groups, self.n_iter)


class Entmax15(_FixedEntmax):
    """1.5-entmax (exact sort-based in the dense layout)."""

    alpha_value = 1.5
    dense_op = staticmethod(entmax_lib.entmax15)


class Sparsemax(_FixedEntmax):
    """Sparsemax, i.e. 2-entmax (Martins & Astudillo, 2016)."""

    alpha_value = 2.0
    dense_op = staticmethod(entmax_lib.sparsemax)
