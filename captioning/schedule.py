"""The epoch schedules of self-critical.pytorch's cross-entropy training: the learning rate's step decay and the
scheduled-sampling probability (``opts.py``: ``learning_rate_decay_*``, ``scheduled_sampling_*``)."""
from __future__ import annotations

from omegaconf import DictConfig


def learning_rate(cfg: DictConfig, epoch: int) -> float:
    """``lr * decay_rate ** ((epoch - decay_start) // decay_every)`` once ``epoch > decay_start``
    (self-critical's ``learning_rate_decay_*``; a negative start turns decay off)."""
    o = cfg.optim
    if o.decay_start < 0 or epoch <= o.decay_start:
        return o.lr
    return o.lr * o.decay_rate ** ((epoch - o.decay_start) // o.decay_every)


def ss_probability(cfg: DictConfig, epoch: int) -> float:
    """The scheduled-sampling probability of ``epoch``: ``increase_prob`` more every ``increase_every`` epochs after
    ``start`` (a negative start: never), at most ``max_prob``."""
    s = cfg.scheduled_sampling
    if s.start < 0 or epoch <= s.start:
        return 0.0
    return min(s.increase_prob * ((epoch - s.start) // s.increase_every), s.max_prob)
