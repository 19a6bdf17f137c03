"""Convoluted attention (Dufter, Schmitt & Schütze, 2020, Sec. 2.5): ``A' = act(conv(softmax(A)))``.

The convolution runs on the normalised weights; the result is not renormalised (as in the
paper). Filter width 3 in both forms, as in the authors' code (``pdufter/convatt``,
``models/seqlabel.py``):

* ``"2d"``: one 3x3 filter per head (their ``Conv2D(1, 3)`` per head; a depthwise ``Conv2d``;
  10 parameters per head).
* ``"1d"``: per head, ``t = max_len`` filters of width 3 that slide along the queries with the
  keys as channels (their ``Conv1D(t, 3)`` on the ``[queries, keys]`` map), so the map keeps
  its shape: ``A'[i, f] = b_f + sum_{d in -1,0,1} sum_j W[f, j, d] A[i + d, j]``. A map with
  ``K < t`` keys uses the first ``K`` channels and filters.

``activation``: ``"relu"`` (the authors' code) or ``None``. ``init``: ``"identity"`` (a fresh
layer leaves the weights unchanged) or ``"glorot"`` (Keras' glorot-uniform kernel and zero
bias, the authors' code). Masked entries are exactly zero after the convolution, so padding
and future keys never get weight; pass a mask that also covers padded *queries*, or the
neighbouring rows of a padded query leak into the last real row. ``causal=True`` (decoders)
shifts both windows to rows ``i-2..i`` (and the 2d window to columns ``j-2..j``).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .conv import conv_over_maps, zero_masked

KINDS = ("1d", "2d")
ACTIVATIONS = (None, "relu")
INITS = ("identity", "glorot")


class ConvolutedAttention(nn.Module):
    """``act(conv(weights))`` with one 3x3 filter per head (``"2d"``) or ``max_len`` width-3 filters along the
    queries per head (``"1d"``)."""

    def __init__(self, num_heads: int, kind: str = "2d", max_len: Optional[int] = None, causal: bool = False,
                 activation: Optional[str] = None, init: str = "identity"):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        self.kind, self.causal, self.num_heads, self.activation, self.init = kind, causal, num_heads, activation, init
        if kind == "2d":
            self.conv = nn.Conv2d(num_heads, num_heads, 3, groups=num_heads)
            weight = self.conv.weight  # [H, 1, 3, 3]
        else:
            if max_len is None or max_len < 1:
                raise ValueError("1d convoluted attention has one filter per key position: pass max_len=<longest "
                                 "sequence>")
            self.max_len = max_len
            self.weight = nn.Parameter(torch.empty(num_heads, max_len, max_len, 3))  # [H, filters, keys, taps]
            self.bias = nn.Parameter(torch.zeros(num_heads, max_len))
            weight = self.weight
        with torch.no_grad():
            bias = self.conv.bias if kind == "2d" else self.bias
            bias.zero_()
            if init == "glorot":
                taps = 9 if kind == "2d" else 3
                fan_in = fan_out = taps if kind == "2d" else taps * max_len
                weight.uniform_(-math.sqrt(6 / (fan_in + fan_out)), math.sqrt(6 / (fan_in + fan_out)))
            elif kind == "2d":
                weight.zero_()
                weight[:, 0, -1 if causal else 1, -1 if causal else 1] = 1.0  # the tap at (i, j)
            else:
                weight.zero_()
                weight[..., -1 if causal else 1].copy_(torch.eye(max_len))  # filter f reads key f of row i

    def extra_repr(self) -> str:
        return (f"kind={self.kind!r}, num_heads={self.num_heads}, causal={self.causal}, "
                f"activation={self.activation!r}, init={self.init!r}")

    def forward(self, weights: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        if weights.shape[-3] != self.num_heads:
            raise ValueError(f"expected maps [..., {self.num_heads} heads, queries, keys], got {tuple(weights.shape)}")
        weights = zero_masked(weights, mask)  # padded query rows must not reach their neighbours
        out = conv_over_maps(weights, self.conv, self.causal) if self.kind == "2d" else self._along_queries(weights)
        if self.activation == "relu":
            out = F.relu(out)
        return zero_masked(out, mask)

    def _along_queries(self, weights: Tensor) -> Tensor:
        K = weights.shape[-1]
        if K > self.max_len:
            raise ValueError(f"1d convoluted attention was built for max_len={self.max_len} keys, got {K}")
        Q = weights.shape[-2]
        padded = F.pad(weights, (0, 0, 2, 0) if self.causal else (0, 0, 1, 1))  # rows i-1, i, i+1 (causal: i-2..i)
        w = self.weight[:, :K, :K]  # [H, F, J, 3]
        out = sum(torch.einsum("...hqj,hfj->...hqf", padded[..., d:d + Q, :], w[..., d]) for d in range(3))
        return out + self.bias[:, None, :K]
