"""Convoluted attention (Dufter, Schmitt & Schütze, 2020, Sec. 2.5): ``A' = conv(softmax(A))``.

The convolution runs on the normalised weights; the result is not renormalised (as in
the paper). Filter width 3 in both forms:

* ``"2d"``: one 3x3 filter per head (a depthwise ``Conv2d``; 10 parameters per head).
* ``"1d"``: one width-3 filter along the keys for every row (query position) of every
  head, so the layer needs ``max_len`` (the longest query sequence).

Filters start as the identity (centre tap 1, bias 0), so a fresh layer leaves the
weights unchanged; the paper does not state its initialisation. Masked entries are
exactly zero after the convolution, so padding and future keys never get weight.
``causal=True`` (decoders) shifts the 2d window to rows ``i-2..i`` and columns
``j-2..j``; the 1d filter never reads another row and is causal as it is.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .conv import conv_over_maps, zero_masked

KINDS = ("1d", "2d")


class ConvolutedAttention(nn.Module):
    """``conv(weights)`` with one 3x3 filter per head (``"2d"``) or one width-3 filter per row (``"1d"``)."""

    def __init__(self, num_heads: int, kind: str = "2d", max_len: Optional[int] = None, causal: bool = False):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind, self.causal, self.num_heads = kind, causal, num_heads
        if kind == "2d":
            self.conv = nn.Conv2d(num_heads, num_heads, 3, groups=num_heads)
            with torch.no_grad():
                self.conv.weight.zero_()
                self.conv.weight[:, 0, -1 if causal else 1, -1 if causal else 1] = 1.0  # the tap at (i, j)
                self.conv.bias.zero_()
        else:
            if max_len is None or max_len < 1:
                raise ValueError("1d convoluted attention has one filter per row: pass max_len=<longest query length>")
            self.max_len = max_len
            weight = torch.zeros(num_heads, max_len, 3)
            weight[..., 1] = 1.0
            self.weight = nn.Parameter(weight)  # [heads, rows, taps (j-1, j, j+1)]
            self.bias = nn.Parameter(torch.zeros(num_heads, max_len))

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, num_heads={self.num_heads}, causal={self.causal}"

    def forward(self, weights: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        if weights.shape[-3] != self.num_heads:
            raise ValueError(f"expected maps [..., {self.num_heads} heads, queries, keys], got {tuple(weights.shape)}")
        if self.kind == "2d":
            out = conv_over_maps(weights, self.conv, self.causal)
        else:
            out = self._rows(weights)
        return zero_masked(out, mask)

    def _rows(self, weights: Tensor) -> Tensor:
        Q = weights.shape[-2]
        if Q > self.max_len:
            raise ValueError(f"1d convoluted attention was built for max_len={self.max_len} rows, got {Q} queries")
        w = self.weight[:, :Q]  # [H, Q, 3]
        padded = F.pad(weights, (1, 1))
        K = weights.shape[-1]
        return (w[..., 0:1] * padded[..., :K] + w[..., 1:2] * padded[..., 1:K + 1]
                + w[..., 2:3] * padded[..., 2:] + self.bias[:, :Q, None])
