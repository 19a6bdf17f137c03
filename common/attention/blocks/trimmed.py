"""Adaptive span that skips the keys beyond every head's span (Sukhbaatar et al., 2019, Sec. 3).

With token distance ``|i - j|``, key ``j`` gets exactly zero weight from every head once
``|i - j| >= max_h z_h S + R``. The reference implementation keeps only the last span's keys in
memory; here the queries are cut into blocks of ``C`` and each block's scores cover just the keys
that any of its queries can reach: ``C + 2(W - 1)`` keys instead of all ``L`` (``W`` the window
of :meth:`~common.attention.maps.span.AdaptiveSpan.token_window`). The score matmul, the
normaliser, the span mask and the weighted sum all shrink from ``L^2`` to ``L (C + 2W - 2)``.

Exact for the softmax normaliser: the span renormalises ``m w / (sum m w + eps)``, so softmax's
partition function cancels and the keys dropped (``m = 0``) change nothing except through the
reference's ``eps = 1e-8`` (relative differences of ``eps / sum(m w)``; the reference code,
which keeps only the span's keys, computes what this path computes). Entmax and BAM weights
depend on every key, so they keep the full path.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..maps.span import AdaptiveSpan

MIN_BLOCK = 32


def _blocks_of_keys(x: Tensor, window: int, block: int, num_blocks: int) -> Tensor:
    """``[..., H, L, d]`` -> ``[..., blocks, H, C + 2(W-1), d]``: the keys each query block can reach."""
    pad_after = num_blocks * block - x.shape[-2] + window - 1
    padded = F.pad(x, (0, 0, window - 1, pad_after))
    return padded.unfold(-2, block + 2 * (window - 1), block).transpose(-1, -2).transpose(-4, -3)


def _block_mask(mask: Optional[Tensor], length: int, window: int, block: int, num_blocks: int,
                device) -> Tensor:
    """Which keys of each block exist (inside ``[0, L)``) and are allowed by ``mask`` ``[..., Q, K]``."""
    rows = torch.arange(num_blocks * block, device=device).view(num_blocks, block, 1)
    cols = (torch.arange(num_blocks, device=device) * block).view(num_blocks, 1, 1) - (window - 1) \
        + torch.arange(block + 2 * (window - 1), device=device)
    inside = (cols >= 0) & (cols < length)
    if mask is None:
        return inside.unsqueeze(-3)  # [blocks, 1, 1, keys]
    full = mask.expand(*mask.shape[:-2], length, length)
    picked = full[..., rows.clamp(max=length - 1), cols.clamp(0, length - 1)] & inside
    return picked.transpose(-4, -3) if mask.dim() >= 3 else picked.unsqueeze(-3)


def trimmed_span_attention(q: Tensor, k: Tensor, v: Tensor, span: AdaptiveSpan, normalizer, scale: float,
                           mask: Optional[Tensor], dropout_p: float, training: bool) -> Optional[Tensor]:
    """Self-attention ``[..., H, L, dv]`` with token-distance span over the reachable keys only,
    or ``None`` when trimming would not shrink the key range (then use the full path)."""
    length = q.shape[-2]
    window = span.token_window()
    block = max(window, MIN_BLOCK)
    keys_per_block = block + 2 * (window - 1)
    if 2 * keys_per_block > length:
        return None
    num_blocks = -(-length // block)
    q_blocks = F.pad(q, (0, 0, 0, num_blocks * block - length)).unflatten(-2, (num_blocks, block)).transpose(-4, -3)
    k_blocks = _blocks_of_keys(k, window, block, num_blocks)
    v_blocks = _blocks_of_keys(v, window, block, num_blocks)
    scores = torch.matmul(q_blocks, k_blocks.transpose(-1, -2)) * scale  # [..., blocks, H, C, keys]
    weights = normalizer(scores, mask=_block_mask(mask, length, window, block, num_blocks, q.device))
    offsets = torch.arange(block, device=q.device, dtype=scores.dtype)
    relative = torch.arange(keys_per_block, device=q.device, dtype=scores.dtype) - (window - 1)
    weights = span(weights, (offsets.unsqueeze(-1) - relative).abs())  # |i - j| is the same in every block
    if dropout_p:
        weights = F.dropout(weights, dropout_p, training)
    out = torch.matmul(weights, v_blocks).transpose(-4, -3)  # [..., H, blocks, C, dv]
    return out.flatten(-3, -2)[..., :length, :]
