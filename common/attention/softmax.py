"""Plain soft attention, Eq. (1) of the BAM paper: ``W_ij = exp(s_ij) / sum_j' exp(s_ij')``."""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from .base import Normalizer


class Softmax(Normalizer):
    """Deterministic softmax over the keys of each query, in either layout."""

    def __init__(self, num_heads: Optional[int] = None, key_dim: Optional[int] = None):
        super().__init__()

    def normalize(self, scores: Tensor, groups, keys=None, key_index=None) -> Tensor:
        return groups.softmax(scores)
