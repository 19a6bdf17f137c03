"""Collecting auxiliary losses (BAM KL, span penalties) without changing forward signatures.

Usage::

    with aux_losses() as aux:
        logits = model(batch)             # any PyG / Hugging Face / plain model
    loss = task_loss + aux.total({"bam_kl": kl_weight})

Modules call :func:`add_aux_loss` while a collector is active; outside one the call is a
no-op, so evaluation pays nothing. A fresh collector per step means no stale values, and
the terms keep their autograd graph.

The open blocks live in one process-wide record (one per DistributedDataParallel rank, which is
one process), whose per-level term lists are reused from step to step: ``torch.compile`` traces a
model's ``add_aux_loss`` as appends to the same list every step, so its guards hold and nothing is
recompiled or broken out of the graph (a ``ContextVar`` cannot be traced). Collecting in two threads
at once is refused with an error.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Dict, Iterator, Mapping, Optional

import torch
from torch import Tensor


class AuxLosses:
    """The auxiliary loss terms added while a :func:`aux_losses` block ran."""

    def __init__(self, terms: Optional[list] = None) -> None:
        self.terms: list[tuple[str, Tensor]] = [] if terms is None else terms

    def add(self, name: str, value: Tensor) -> None:
        _check_scalar(name, value)
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
        terms = [value if weights.get(name, 1.0) == 1.0 else weights[name] * value
                 for name, value in self.by_name().items()]
        if not terms:
            return torch.zeros(())
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total

    def __len__(self) -> int:
        return len(self.terms)


class _Blocks:
    """The open :func:`aux_losses` blocks: their depth, the thread that opened them, and one list of
    terms per nesting level, created once and reused (cleared) by every later block at that level."""

    def __init__(self) -> None:
        self.depth = 0
        self.owner: Optional[int] = None
        self.levels: list[list] = []


_OPEN = _Blocks()


@contextmanager
def aux_losses(enabled: bool = True) -> Iterator[Optional[AuxLosses]]:
    """Collect the auxiliary losses of the modules run inside the block (innermost block wins). Not ``enabled``:
    the block opens no collector and gets None (outside any other block, modules then skip computing the losses,
    e.g. BAM's KL)."""
    if not enabled:
        yield None
        return
    thread = None if torch.compiler.is_compiling() else threading.get_ident()  # a compiled step is one thread
    if _OPEN.depth and _OPEN.owner != thread:
        raise RuntimeError("aux_losses() is already open in another thread: auxiliary losses are collected "
                           "per process; run the models of different threads one after the other")
    if len(_OPEN.levels) == _OPEN.depth:
        _OPEN.levels.append([])
    terms = _OPEN.levels[_OPEN.depth]
    terms.clear()
    collector = AuxLosses(terms)
    _OPEN.depth, _OPEN.owner = _OPEN.depth + 1, thread
    try:
        yield collector
    finally:
        _OPEN.depth -= 1
        collector.terms = list(terms)  # the collector keeps its terms; the level's list is free again
        terms.clear()
        if not _OPEN.depth:
            _OPEN.owner = None


def collecting() -> bool:
    """True when a collector is active, so modules can skip computing unused losses."""
    return _OPEN.depth > 0


def add_aux_loss(name: str, value: Tensor) -> None:
    """Add ``value`` to the innermost active collector, if any."""
    if _OPEN.depth:
        _check_scalar(name, value)
        _OPEN.levels[_OPEN.depth - 1].append((name, value))


def _check_scalar(name: str, value: Tensor) -> None:
    if value.dim() != 0:
        raise ValueError(f"auxiliary loss {name!r} must be a scalar, got shape {tuple(value.shape)}")
