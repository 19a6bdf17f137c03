"""The normalizer interface and the Monte Carlo switch.

A normalizer maps attention scores to weights over the keys of each query, in either
layout (see :mod:`common.attention.groups`)::

    weights = norm(scores, mask=None, keys=None)                  # dense
    weights = norm(scores, index=index, num_nodes=n, keys=None)   # edge-wise
    weights = norm(scores, index=index, ptr=ptr, keys=None)       # edge-wise, sorted by target

``keys`` feeds normalizers with a key-contextual prior (BAM ``-wc``/``-lc``): dense keys are
``[..., heads, keys, key_dim]``; edge-wise keys are ``[num_edges, heads, key_dim]``, or
per node ``[num_nodes, heads, key_dim]`` together with ``key_index`` (the source node of
each edge), which avoids materialising per-edge key features.

Under mixed precision (``torch.autocast``, or half-precision scores) every normalizer computes
in float32: its softmax, its noise, its prior network and its KL, with autocast off inside;
the weights come back in the dtype of ``scores`` and auxiliary losses stay float32.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch import Tensor, nn

from .groups import make_groups


class Normalizer(nn.Module, ABC):
    """Base class: resolves the layout and dispatches to :meth:`normalize`."""

    #: True for normalizers that sample in training (and under :func:`mc_sampling`).
    stochastic = False

    def __init__(self) -> None:
        super().__init__()
        self.mc_sampling = False

    @property
    def sampling(self) -> bool:
        """Whether this call draws a sample (training, or Monte Carlo evaluation)."""
        return self.stochastic and (self.training or self.mc_sampling)

    def forward(
        self,
        scores: Tensor,
        mask: Optional[Tensor] = None,
        keys: Optional[Tensor] = None,
        *,
        index: Optional[Tensor] = None,
        num_nodes: Optional[int] = None,
        key_index: Optional[Tensor] = None,
        ptr: Optional[Tensor] = None,
    ) -> Tensor:
        groups = make_groups(scores, mask, index, num_nodes, ptr)
        device = scores.device.type
        if not (scores.dtype in _HALF or torch.is_autocast_enabled(device)):
            return self.normalize(scores, groups, keys=keys, key_index=key_index)
        with torch.autocast(device, enabled=False):
            weights = self.normalize(_float(scores), groups, keys=_float(keys), key_index=key_index)
        return weights.to(scores.dtype)

    @abstractmethod
    def normalize(self, scores: Tensor, groups, keys=None, key_index=None) -> Tensor:
        """Weights for ``scores`` in the layout described by ``groups``."""


_HALF = (torch.float16, torch.bfloat16)


def _float(x: Optional[Tensor]) -> Optional[Tensor]:
    """Floating tensors at least float32 (float64 stays), anything else as it is."""
    if x is None or not x.is_floating_point() or x.dtype == torch.float64:
        return x
    return x.float()


@contextmanager
def mc_sampling(model: nn.Module, dropout: bool = False) -> Iterator[nn.Module]:
    """Keep stochastic attention sampling while ``model`` is in eval mode (Monte Carlo uncertainty).

    With ``dropout=True`` the model's dropout layers are also kept active (MC dropout, as the
    BAM paper does for its uncertainty estimates). Everything is restored on exit.
    """
    normalizers = [m for m in model.modules() if isinstance(m, Normalizer)]
    dropouts = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd)] if dropout else []
    saved = [(m, m.mc_sampling) for m in normalizers]
    saved_train = [(m, m.training) for m in dropouts]
    try:
        for m in normalizers:
            m.mc_sampling = True
        for m in dropouts:
            m.train(True)
        yield model
    finally:
        for m, value in saved:
            m.mc_sampling = value
        for m, value in saved_train:
            m.train(value)
