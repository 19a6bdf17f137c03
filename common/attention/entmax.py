"""Sparse normalizers: alpha-entmax with a learnable alpha per head, 1.5-entmax and sparsemax.

alpha-entmax (Peters, Niculae & Martins, 2019; Correia et al., 2019):
``entmax_alpha(z)_j = [(alpha - 1) z_j - tau]_+^{1/(alpha-1)}`` with ``tau`` making the row sum
to one; alpha = 2 is sparsemax, alpha -> 1 is softmax. A learnable alpha is parameterised as
``alpha = clamp(1 + sigmoid(z), 1.01, 2)`` (the entmax authors' advice), so it stays in
(1, 2] and never reaches the alpha = 1 singularity of the bisection.

The dense layout uses the ``entmax`` package (exact sort-based 1.5-entmax and sparsemax,
bisection with an analytic alpha gradient); the edge-wise layout bisects per target node
with scatter operations (:func:`~common.attention.functional.entmax_bisect_groups`).
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

MIN_ALPHA = 1.01


def _dense_fill(scores: Tensor, groups: DenseGroups) -> Tensor:
    # A finite fill (not -inf) keeps fully masked rows finite inside the entmax package.
    return groups.fill(scores, torch.finfo(scores.dtype).min)


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
            shape = list(scores.shape)
            shape[-1] = 1
            weights = entmax_lib.entmax_bisect(
                _dense_fill(scores, groups), alpha.expand(shape), dim=-1,
                n_iter=self.n_iter or bisect_iterations(scores.dtype),
            )
            return groups.zero_masked(weights)
        return entmax_bisect_groups(scores, alpha, groups, self.n_iter)


class _FixedEntmax(Normalizer):
    """Shared body of the fixed-alpha variants: exact dense op, bisection edge-wise."""

    alpha_value: float

    def __init__(self, num_heads: Optional[int] = None, key_dim: Optional[int] = None, n_iter: Optional[int] = None):
        super().__init__()
        self.n_iter = n_iter

    def normalize(self, scores: Tensor, groups, keys=None, key_index=None) -> Tensor:
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
