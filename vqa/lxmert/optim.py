"""Optimisers of the LXMERT fine-tuning.

* ``lamb_lookahead`` (the paper's): LAMB (You et al., 2019) inside Lookahead (Zhang et al., 2019),
  both from ``torch_optimizer``, with a cyclical learning rate (Smith, 2017; ``CyclicLR``,
  triangular between ``lr`` and ``max_lr``).
* ``adamw``: the plain option, with linear warm-up then linear decay (BERT's schedule).

Three parameter groups: weights (with weight decay), biases and LayerNorm (without), and the
adaptive per-head parameters (span ``z``, entmax ``alpha``; no decay, learning rate times
``adaptive_lr_mult``: at a fine-tuning rate of 1e-5 a span of z in [0, 1] would barely move).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import List, Tuple

import torch
import torch_optimizer
from omegaconf import DictConfig
from torch import nn

from .config import OPTIMIZERS  # optim.name: checked with the config, before torch is imported

ADAPTIVE = ("attend.span.z", "attend.normalizer.alpha_logit")


class Lookahead(torch_optimizer.Lookahead):
    """``torch_optimizer.Lookahead``, fixed for resuming on current torch.

    * It skips ``torch.optim.Optimizer.__init__``, so the hook tables ``state_dict()`` needs are
      missing; they are created here.
    * Its ``load_state_dict`` leaves the wrapper and the inner optimiser with separate copies of
      the parameter groups, so a scheduler's learning rate no longer reaches the inner
      optimiser; the groups are shared again after loading.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, k: int = 5, alpha: float = 0.5):
        super().__init__(optimizer, k=k, alpha=alpha)
        for table in ("step_pre", "step_post", "state_dict_pre", "state_dict_post", "load_state_dict_pre",
                      "load_state_dict_post"):
            setattr(self, f"_optimizer_{table}_hooks", OrderedDict())
        self._patch_step_function()

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self.param_groups = self.optimizer.param_groups


def parameter_groups(model: nn.Module, weight_decay: float, adaptive_lr_mult: float, lr: float) -> List[dict]:
    decay, no_decay, adaptive = [], [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.endswith(ADAPTIVE):
            adaptive.append(param)
        elif param.dim() <= 1:
            no_decay.append(param)
        else:
            decay.append(param)
    groups = [{"params": decay, "weight_decay": weight_decay, "lr": lr},
              {"params": no_decay, "weight_decay": 0.0, "lr": lr},
              {"params": adaptive, "weight_decay": 0.0, "lr": lr * adaptive_lr_mult}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, cfg: DictConfig, total_steps: int) -> Tuple[torch.optim.Optimizer, object]:
    """Optimiser and per-step scheduler described by ``cfg`` (the ``optim`` section)."""
    groups = parameter_groups(model, cfg.weight_decay, cfg.adaptive_lr_mult, cfg.lr)
    if cfg.name == "lamb_lookahead":
        inner = torch_optimizer.Lamb(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                                     weight_decay=cfg.weight_decay)
        optimizer = Lookahead(inner, k=cfg.lookahead_k, alpha=cfg.lookahead_alpha)
        scale = [g["lr"] / cfg.lr for g in groups]
        scheduler = torch.optim.lr_scheduler.CyclicLR(
            optimizer, base_lr=[cfg.lr * s for s in scale], max_lr=[cfg.max_lr * s for s in scale],
            step_size_up=cfg.step_size_up, mode="triangular", cycle_momentum=False)
    elif cfg.name == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                                      weight_decay=cfg.weight_decay)
        warmup = max(1, int(cfg.warmup * total_steps))

        def linear(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear)
    else:
        raise ValueError(f"optim.name must be one of {', '.join(OPTIMIZERS)}, got {cfg.name!r}")
    return optimizer, scheduler
