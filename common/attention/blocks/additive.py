"""Additive (MLP, Bahdanau) attention for recurrent decoders, with a pluggable normalizer.

``e_tj = v^T tanh(W_q h_t + W_m m_j + b)`` (Bahdanau et al., 2015; Att2in's ``alpha_net(tanh(
ctx2att(att) + h2att(h)))``; OpenNMT's ``mlp`` attention), then ``a_t = normalizer(e_t)``
over the memory (encoder states or image regions) and ``c_t = sum_j a_tj m_j``. Any
registered normalizer name works; BAM's contextual prior sees the projected memory
``W_m m_j`` as its key vectors (``key_dim = hidden_dim``).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..registry import build


class AdditiveAttention(nn.Module):
    """One-head MLP attention of decoder states over a memory.

    Args:
        query_dim: width of the decoder state ``h_t``.
        memory_dim: width of each memory vector ``m_j``.
        hidden_dim: width of the tanh layer (Att2in's ``att_hid_size``, OpenNMT's attention size).
        normalizer: registered normalizer name (``softmax``, ``bam-wc``, ``entmax`` ...).
        normalizer_options: extra options for the normalizer.
    """

    def __init__(self, query_dim: int, memory_dim: int, hidden_dim: int, normalizer: str = "softmax",
                 normalizer_options: Optional[dict] = None):
        super().__init__()
        self.memory_proj = nn.Linear(memory_dim, hidden_dim)
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=False)
        self.score = nn.Linear(hidden_dim, 1, bias=False)  # a bias would cancel in any normalizer
        self.normalizer = build(normalizer, num_heads=1, key_dim=hidden_dim, **(normalizer_options or {}))

    def project_memory(self, memory: Tensor) -> Tensor:
        """``W_m m_j + b`` for memory ``[B, K, memory_dim]``: compute once per sequence, pass to every step."""
        return self.memory_proj(memory)

    def forward(self, query: Tensor, memory: Tensor, mask: Optional[Tensor] = None,
                projected_memory: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """Context and weights for one step (``query [B, query_dim]``) or many (``[B, T, query_dim]``).

        Args:
            memory: ``[B, K, memory_dim]``.
            mask: ``[B, K]`` boolean, True for real memory entries.
            projected_memory: :meth:`project_memory` of ``memory``, to skip recomputing it.

        Returns:
            ``context`` ``[B, memory_dim]`` / ``[B, T, memory_dim]`` and ``weights`` ``[B, K]`` / ``[B, T, K]``.
        """
        single_step = query.dim() == 2
        if single_step:
            query = query.unsqueeze(1)
        if mask is not None and (mask.dtype != torch.bool or mask.shape != memory.shape[:2]):
            raise ValueError(f"mask must be boolean [B, K] = {tuple(memory.shape[:2])} (True = real entry), "
                             f"got {mask.dtype} {tuple(mask.shape)}")
        keys = self.project_memory(memory) if projected_memory is None else projected_memory
        hidden = torch.tanh(keys.unsqueeze(1) + self.query_proj(query).unsqueeze(2))  # [B, T, K, hidden]
        scores = self.score(hidden).squeeze(-1).unsqueeze(1)  # [B, 1 head, T, K]
        weights = self.normalizer(scores, mask=None if mask is None else mask[:, None, None, :],
                                  keys=keys.unsqueeze(1)).squeeze(1)  # [B, T, K]
        context = torch.matmul(weights, memory)
        if single_step:
            return context.squeeze(1), weights.squeeze(1)
        return context, weights
