"""The learning rate of translation training, per update: an inverse square root after a linear warm-up, halving
on a validation-perplexity plateau, or constant."""
from __future__ import annotations

import math

import torch


class LRSchedule:
    """Learning rate per update: ``inverse_sqrt``, ``plateau`` halving, or ``constant``."""

    def __init__(self, optimizer: torch.optim.Optimizer, kind: str, base_lr: float, warmup: int = 0,
                 plateau_factor: float = 0.5, plateau_start: int = 2):
        if kind not in ("inverse_sqrt", "plateau", "constant"):
            raise ValueError(f"schedule.kind must be inverse_sqrt, plateau or constant, got {kind!r}")
        if kind == "inverse_sqrt" and warmup < 1:
            raise ValueError("schedule.warmup must be >= 1 for inverse_sqrt")
        self.optimizer, self.kind, self.base_lr, self.warmup = optimizer, kind, base_lr, warmup
        self.factor, self.start = plateau_factor, plateau_start
        self.scale, self.last_ppl, self.validations = 1.0, math.inf, 0

    def lr(self, update: int) -> float:
        """lr of update ``update`` (1-based): ``lr * min(u / warmup, sqrt(warmup / u))`` for inverse_sqrt."""
        if self.kind == "inverse_sqrt":
            return self.base_lr * min(update / self.warmup, math.sqrt(self.warmup / update))
        return self.base_lr * self.scale

    def before_update(self, update: int) -> float:
        """Set the learning rate of update ``update`` (1-based) on the optimizer; that rate."""
        lr = self.lr(update)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def after_validation(self, ppl: float) -> None:
        """Plateau: halve when perplexity got worse than at the previous validation (from ``start`` on)."""
        self.validations += 1
        if self.kind == "plateau" and self.validations >= self.start and ppl > self.last_ppl:
            self.scale *= self.factor
        self.last_ppl = ppl

    def state_dict(self) -> dict:
        return {"scale": self.scale, "last_ppl": self.last_ppl, "validations": self.validations}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.last_ppl, self.validations = state["scale"], state["last_ppl"], state["validations"]
