"""Weight schedules for the KL term (BAM Eq. 4 anneals its weight lambda towards one)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

KINDS = ("constant", "linear", "sigmoid")


@dataclass(frozen=True)
class KLSchedule:
    """``weight * f(step)`` with ``f`` one of:

    * ``constant``: 1;
    * ``linear``: ``min(1, step / warmup)`` (0 at step 0);
    * ``sigmoid``: ``sigmoid(rate * (step - offset))``, the BAM GAT code's schedule
      (``att_kl * sigmoid(epoch * kl_anneal_rate)``); note it starts at 0.5 when ``offset=0``.

    ``step`` is whatever unit the training loop counts (epochs for GAT, updates elsewhere).
    """

    weight: float = 1.0
    kind: str = "constant"
    warmup: int = 0
    rate: float = 1.0
    offset: float = 0.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"KL schedule kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "linear" and self.warmup <= 0:
            raise ValueError("a linear KL schedule needs warmup > 0 steps")

    @classmethod
    def from_config(cls, kl: Mapping[str, Any]) -> "KLSchedule":
        """The schedule of a domain config's ``kl:`` block (keys ``weight``, ``schedule``, ``warmup``, ``rate``,
        ``offset``)."""
        return cls(weight=kl["weight"], kind=kl["schedule"], warmup=kl["warmup"], rate=kl["rate"],
                   offset=kl["offset"])

    def __call__(self, step: float) -> float:
        if self.kind == "constant":
            factor = 1.0
        elif self.kind == "linear":
            factor = min(1.0, max(0.0, step / self.warmup))
        else:
            factor = 1.0 / (1.0 + math.exp(-self.rate * (step - self.offset)))
        return self.weight * factor
