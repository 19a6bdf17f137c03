"""Convolutions over the stack of per-head attention logits, and the two cross-layer
operators built on them.

The ``H`` heads of one layer form an ``H``-channel image ``[..., H, queries, keys]``;
:class:`AttnMapConv` runs ``Conv2d(H -> H, 3x3)`` + activation over it, one or more times.

* Predictive attention (Wang et al., "Predictive Attention Transformer", Eq. 4):
  ``A = softmax(alpha * CNN(A_prev_logits) + (1 - alpha) * logits)``.
* Evolving attention (Wang et al., "Evolving Attention with Residual Convolutions", Eq. 4):
  ``A_in = alpha * A_prev_logits + (1 - alpha) * logits``;
  ``A_logits = beta * CNN(A_in) + (1 - beta) * A_in``; ``A = softmax(A_logits)``.

Both return the mixed pre-normalisation logits, which the caller hands to the next layer.
A layer without previous logits (the first one, or one whose predecessors were all
dropped by LayerDrop) leaves its logits unchanged, as both papers (and the EA code, which
builds no attention convolution in layer 0) do for the first block.

Masked entries are set to zero before every convolution and after it, so padding keys
never reach real entries. ``causal=True`` (decoders) makes every window cover only rows
``i-2..i`` and columns ``j-2..j`` (EA paper Sec. 3.5, "upper-left pixels": a 3x3
convolution shifted one pixel down and right), so a query never reads a later query's
row; with future keys zeroed this keeps decoder self- and cross-attention causal.
"""
from __future__ import annotations

from typing import Optional

import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = {"relu": nn.ReLU, "leaky_relu": nn.LeakyReLU}


def zero_masked(x: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``x`` with entries where ``mask`` is False set to exactly zero."""
    return x if mask is None else x.masked_fill(~mask, 0.0)


def map_padding(kernel_size: int, causal: bool) -> tuple[int, int, int, int]:
    """``F.pad`` amounts (left, right, top, bottom) for a same-size map convolution.

    Centred windows pad ``k // 2`` on every side; causal windows pad ``k - 1`` on the left
    and top only, so output ``(i, j)`` reads rows ``<= i`` and columns ``<= j``.
    """
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd so that the map keeps its shape, got {kernel_size}")
    if causal:
        return (kernel_size - 1, 0, kernel_size - 1, 0)
    half = kernel_size // 2
    return (half, half, half, half)


def conv_over_maps(x: Tensor, conv: nn.Conv2d, causal: bool) -> Tensor:
    """Apply ``conv`` to maps ``[..., C, queries, keys]`` (any leading dims), keeping the shape."""
    lead, (C, Q, K) = x.shape[:-3], x.shape[-3:]
    x = F.pad(x.reshape(-1, C, Q, K), map_padding(conv.kernel_size[0], causal))
    return conv(x).reshape(*lead, conv.out_channels, Q, K)


class AttnMapConv(nn.Module):
    """``CNN(A)``: ``layers`` x (``Conv2d(H -> H, k x k)`` + activation) over per-head maps.

    Args:
        num_heads: channels ``H`` of the map image.
        layers: number of convolution + activation layers (the PA paper uses 1 or 2).
        kernel_size: odd window size (3 in both papers).
        activation: ``"relu"`` (both papers) or ``"leaky_relu"`` (the EA code).
        causal: windows see only earlier/equal queries and keys (decoders, see module doc).
    """

    def __init__(self, num_heads: int, layers: int = 1, kernel_size: int = 3,
                 activation: str = "relu", causal: bool = False):
        super().__init__()
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        map_padding(kernel_size, causal)  # validates the kernel size
        self.causal = causal
        self.convs = nn.ModuleList(nn.Conv2d(num_heads, num_heads, kernel_size) for _ in range(layers))
        self.activation = ACTIVATIONS[activation]()

    def forward(self, maps: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        x = zero_masked(maps, mask)
        for conv in self.convs:
            x = zero_masked(self.activation(conv_over_maps(x, conv, self.causal)), mask)
        return x


def _check_prev(logits: Tensor, prev_logits: Tensor) -> None:
    if prev_logits.shape != logits.shape:
        raise ValueError(
            f"prev_logits has shape {tuple(prev_logits.shape)} but this layer's logits are "
            f"{tuple(logits.shape)}; pass the previous layer's maps.logits for the same queries and keys"
        )


class _CrossLayerOperator(nn.Module):
    """Shared checks: mixing weights in [0, 1]; the first layer has no convolution."""

    def __init__(self, num_heads: int, first_layer: bool, layers: int, kernel_size: int,
                 activation: str, causal: bool, **weights: float):
        super().__init__()
        for name, value in weights.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        self.first_layer = first_layer
        self.causal = causal
        self.cnn = None if first_layer else AttnMapConv(num_heads, layers, kernel_size, activation, causal)

    def _prev(self, logits: Tensor, prev_logits: Optional[Tensor]) -> Optional[Tensor]:
        if prev_logits is None:
            return None
        if self.first_layer:
            raise ValueError(f"{type(self).__name__} was built with first_layer=True, which takes no "
                             "prev_logits; build later layers with first_layer=False")
        _check_prev(logits, prev_logits)
        return prev_logits


class PredictiveAttention(_CrossLayerOperator):
    """PA Eq. 4: ``alpha * CNN(prev_logits) + (1 - alpha) * logits`` (pre-softmax).

    ``alpha=0.2`` is the PA paper's usual choice for BERT fine-tuning; ``first_layer=True``
    builds no convolution (the paper applies no prediction to the first block).
    """

    def __init__(self, num_heads: int, alpha: float = 0.2, *, first_layer: bool = False, layers: int = 1,
                 kernel_size: int = 3, activation: str = "relu", causal: bool = False):
        super().__init__(num_heads, first_layer, layers, kernel_size, activation, causal, alpha=alpha)
        self.alpha = float(alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, first_layer={self.first_layer}, causal={self.causal}"

    def forward(self, logits: Tensor, prev_logits: Optional[Tensor] = None, mask: Optional[Tensor] = None) -> Tensor:
        prev = self._prev(logits, prev_logits)
        if prev is None:
            return logits
        return self.alpha * self.cnn(prev, mask) + (1 - self.alpha) * logits


class EvolvingAttention(_CrossLayerOperator):
    """EA Eq. 4: ``A_in = alpha * prev + (1 - alpha) * logits``; ``beta * CNN(A_in) + (1 - beta) * A_in``.

    Paper notation: ``alpha`` weights the residual link from the previous layer's logits,
    ``beta`` the convolution branch (EA-Transformer-Base for MT: alpha 0.5, beta 0.1).
    The released EA code writes the same map with the letters swapped (its ``beta`` mixes
    the previous logits, its ``alpha`` the convolution) and a LeakyReLU: its README example
    ``alpha=0.5, beta=0.3`` is ``EvolvingAttention(alpha=0.3, beta=0.5, activation="leaky_relu")``.
    """

    def __init__(self, num_heads: int, alpha: float = 0.5, beta: float = 0.1, *, first_layer: bool = False,
                 layers: int = 1, kernel_size: int = 3, activation: str = "relu", causal: bool = False):
        super().__init__(num_heads, first_layer, layers, kernel_size, activation, causal, alpha=alpha, beta=beta)
        self.alpha, self.beta = float(alpha), float(beta)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, beta={self.beta}, first_layer={self.first_layer}, causal={self.causal}"

    def forward(self, logits: Tensor, prev_logits: Optional[Tensor] = None, mask: Optional[Tensor] = None) -> Tensor:
        prev = self._prev(logits, prev_logits)
        if prev is None:
            return logits
        mixed = self.alpha * prev + (1 - self.alpha) * logits
        return self.beta * self.cnn(mixed, mask) + (1 - self.beta) * mixed


CROSS_LAYER = {"predictive": PredictiveAttention, "evolving": EvolvingAttention}
