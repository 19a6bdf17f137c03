"""Collecting auxiliary losses (BAM KL, span penalties) without changing forward signatures.

Usage::

    with aux_losses() as aux:
        logits = model(batch)             # any PyG / Hugging Face / plain model
    loss = task_loss + aux.total({"bam_kl": kl_weight})

Modules call :func:`add_aux_loss` while a collector is active; outside one the call is a
no-op, so evaluation pays nothing. A fresh collector per step means no stale values, and
the terms keep their autograd graph. The active collector lives in a ``ContextVar``: it is
per thread and per process, which is what DistributedDataParallel (one process per rank)
needs.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Dict, Iterator, Mapping, Optional

import torch
from torch import Tensor

_ACTIVE: ContextVar[Optional["AuxLosses"]] = ContextVar("attention_aux_losses", default=None)


class AuxLosses:
    """The auxiliary loss terms added while a :func:`aux_losses` block ran."""

    def __init__(self) -> None:
        self.terms: list[tuple[str, Tensor]] = []

    def add(self, name: str, value: Tensor) -> None:
        if value.dim() != 0:
            raise ValueError(f"auxiliary loss {name!r} must be a scalar, got shape {tuple(value.shape)}")
        self.terms.append((name, value))

    def by_name(self) -> Dict[str, Tensor]:
        """Sum of the terms of each name (e.g. the KL of every attention layer)."""
        out: Dict[str, Tensor] = {}
        for name, value in self.terms:
            out[name] = out[name] + value if name in out else value
        return out

    def total(self, weights: Optional[Mapping[str, float]] = None) -> Tensor:
        """Weighted sum of all terms; a name missing from ``weights`` has weight 1."""
        weights = weights or {}
        sums = self.by_name()
        if not sums:
            return torch.zeros(())
        return sum(weights.get(name, 1.0) * value for name, value in sums.items())

    def __len__(self) -> int:
        return len(self.terms)


@contextmanager
def aux_losses() -> Iterator[AuxLosses]:
    """Collect the auxiliary losses of the modules run inside the block (innermost block wins)."""
    collector = AuxLosses()
    token = _ACTIVE.set(collector)
    try:
        yield collector
    finally:
        _ACTIVE.reset(token)


def collecting() -> bool:
    """True when a collector is active, so modules can skip computing unused losses."""
    return _ACTIVE.get() is not None


def add_aux_loss(name: str, value: Tensor) -> None:
    """Add ``value`` to the active collector, if any."""
    collector = _ACTIVE.get()
    if collector is not None:
        collector.add(name, value)
