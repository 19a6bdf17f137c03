"""LayerDrop (Fan, Grave & Joulin, 2019): structured dropout of whole layers, and pruning.

* Training: :class:`LayerDropList` skips each layer independently with probability ``p``
  (fairseq's ``LayerDropModuleList``); in eval mode every layer runs, always.
* Inference: :func:`every_other_layers` is the paper's deterministic "every other"
  pruning rule, and :func:`prune_layers` keeps exactly the chosen layers.

A stack that threads per-layer values (residual stream, previous attention logits) just
iterates; a skipped layer passes its inputs through unchanged::

    for layer in self.layers:          # a LayerDropList
        x, maps = layer(x, prev_logits=prev)
        prev = maps.logits
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import torch
from torch import nn


class LayerDropList(nn.ModuleList):
    """A ``ModuleList`` whose iteration drops each layer with probability ``p`` while training."""

    def __init__(self, modules: Iterable[nn.Module] = (), p: float = 0.0):
        super().__init__(modules)
        if not 0.0 <= p < 1.0:
            raise ValueError(f"LayerDrop probability p must be in [0, 1), got {p}")
        self.p = float(p)

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def __getitem__(self, idx):
        if isinstance(idx, slice):  # ModuleList would rebuild the class without p
            return LayerDropList(list(self._modules.values())[idx], p=self.p)
        return super().__getitem__(idx)

    def __iter__(self) -> Iterator[nn.Module]:
        layers = list(super().__iter__())
        if not (self.training and self.p > 0):
            return iter(layers)
        keep = torch.rand(len(layers)) >= self.p
        return iter([layer for layer, kept in zip(layers, keep.tolist()) if kept])


def every_other_layers(num_layers: int, rate: float = 0.5) -> list[int]:
    """Indices kept by the "every other" rule at pruning rate ``rate`` (LayerDrop Sec. 4).

    Layer ``d`` is dropped when ``(d + 1) % round(1 / rate) == 0``: rate 0.5 keeps
    ``0, 2, 4, ...``; rate 0.25 drops ``3, 7, 11, ...``.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if not 0.0 < rate <= 0.5:
        raise ValueError(f"rate must be in (0, 0.5] (at most every other layer is dropped), got {rate}")
    period = round(1 / rate)
    return [d for d in range(num_layers) if (d + 1) % period != 0]


def prune_layers(layers: Sequence[nn.Module], keep: Sequence[int]) -> nn.ModuleList:
    """A new ``ModuleList`` holding exactly ``layers[i]`` for ``i`` in ``keep`` (in order).

    The layers are shared, not copied; assign the result to the model to prune it, e.g.
    ``model.layers = prune_layers(model.layers, every_other_layers(len(model.layers)))``.
    A :class:`LayerDropList` stays a ``LayerDropList`` with the same ``p``, and the result
    keeps the train/eval mode of ``layers`` (a new module would start in training mode and,
    with ``p > 0``, drop layers of a model pruned for evaluation).
    """
    keep = list(keep)
    if not keep:
        raise ValueError("keep must name at least one layer")
    if len(set(keep)) != len(keep) or sorted(keep) != keep:
        raise ValueError(f"keep must be strictly increasing layer indices, got {keep}")
    if keep[0] < 0 or keep[-1] >= len(layers):
        raise ValueError(f"keep {keep} is out of range for {len(layers)} layers")
    chosen = [layers[i] for i in keep]
    pruned = LayerDropList(chosen, p=layers.p) if isinstance(layers, LayerDropList) else nn.ModuleList(chosen)
    return pruned.train(getattr(layers, "training", True))
