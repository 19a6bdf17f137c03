"""Direct position interactions (Dufter, Schmitt & Schütze, 2020, Sec. 2.3).

Instead of position embeddings, the first layer's attention logits get a learned
per-head bias: ``A^{P+R} = A + A^p + A^r`` with

* absolute ``A^p in R^{t x t}``: one free scalar per (query position, key position);
* relative ``A^r_{ij} = a^r_{i-j+t-1}``, ``a^r in R^{2t-1}``: one scalar per offset.

Neither is shared across heads. Both start at zero (the paper does not state its
initialisation), so a fresh layer is plain attention. The paper adds them in the first
layer only: configure them on the first layer of a stack.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


def _check_length(name: str, length: int, max_len: int) -> None:
    if length > max_len:
        raise ValueError(f"{name} has {length} positions but the position interactions were built "
                         f"for max_len={max_len}; build them with a larger max_len")


class AbsolutePositionInteraction(nn.Module):
    """``A^p``: a learned ``[heads, t, t]`` table added to the logits."""

    def __init__(self, num_heads: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Parameter(torch.zeros(num_heads, max_len, max_len))

    def forward(self, num_queries: int, num_keys: int) -> Tensor:
        """The bias ``[heads, queries, keys]`` for positions ``0..num_queries-1`` x ``0..num_keys-1``."""
        _check_length("queries", num_queries, self.max_len)
        _check_length("keys", num_keys, self.max_len)
        return self.table[:, :num_queries, :num_keys]


class RelativePositionInteraction(nn.Module):
    """``A^r_{ij} = a^r_{i - j + t - 1}``: a learned ``[heads, 2t - 1]`` vector indexed by offset."""

    def __init__(self, num_heads: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.offsets = nn.Parameter(torch.zeros(num_heads, 2 * max_len - 1))

    def forward(self, num_queries: int, num_keys: int) -> Tensor:
        """The bias ``[heads, queries, keys]``; entry ``(i, j)`` depends only on ``i - j``."""
        _check_length("queries", num_queries, self.max_len)
        _check_length("keys", num_keys, self.max_len)
        device = self.offsets.device
        rel = torch.arange(num_queries, device=device)[:, None] - torch.arange(num_keys, device=device)[None, :]
        return self.offsets[:, rel + self.max_len - 1]
