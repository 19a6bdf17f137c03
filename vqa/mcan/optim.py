"""MCAN's optimiser (``MILVLG/mcan-vqa`` ``core/model/optim.py``): Adam (0.9, 0.98, eps 1e-9) under a learning rate
warmed up over the first epochs and decayed at given epochs, set per update."""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
from omegaconf import DictConfig
from torch import nn


def lr_factor(update: int, steps_per_epoch: int, warmup_epochs: int, decay_epochs: Sequence[int],
              decay_rate: float) -> float:
    """MCAN's learning-rate multiplier for the ``update``-th update (1-based).

    Warm-up (``WarmupOptimizer.rate``): ``k / (warmup_epochs + 1)`` while
    ``update <= k * steps_per_epoch`` for ``k = 1 .. warmup_epochs``; then
    ``decay_rate ** #{e in decay_epochs : e <= epoch}`` with ``epoch = (update - 1) // steps_per_epoch``.
    """
    warm = 1.0
    for k in range(1, warmup_epochs + 1):
        if update <= int(steps_per_epoch * k):
            warm = k / (warmup_epochs + 1)
            break
    epoch = (update - 1) // steps_per_epoch
    return warm * decay_rate ** sum(1 for e in decay_epochs if e <= epoch)


def build_optimizer(model: nn.Module, optim: DictConfig, steps_per_epoch: int
                    ) -> Tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam at ``optim.lr`` times :func:`lr_factor` of the coming update (the scheduler steps after every update)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps)
    decay_epochs = list(optim.decay_epochs)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(
        step + 1, steps_per_epoch, optim.warmup_epochs, decay_epochs, optim.decay_rate))
