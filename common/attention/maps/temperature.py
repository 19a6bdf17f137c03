"""Learnable temperature (Dufter, Schmitt & Schütze, 2020, Sec. 2.4).

Each projection matrix ``W_i``, ``i in {q, k, v}``, is multiplied by a trainable scalar
``gamma_i`` (initialised to 1); ``gamma_q * gamma_k`` acts as the inverse temperature of
the attention softmax. Only the weight is scaled, not the bias: ``x (gamma W)^T + b``.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROLES = ("q", "k", "v")


class LearnableTemperature(nn.Module):
    """Scalars ``gamma_q``, ``gamma_k``, ``gamma_v`` on the query/key/value projection weights."""

    def __init__(self):
        super().__init__()
        self.gamma = nn.ParameterDict({role: nn.Parameter(torch.ones(())) for role in ROLES})

    def project(self, role: str, x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """``x (gamma_role * W)^T + b``."""
        if role not in self.gamma:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        return F.linear(x, self.gamma[role] * weight, bias)

    @property
    def inverse_temperature(self) -> Tensor:
        """``gamma_q * gamma_k``, the factor on every attention logit."""
        return self.gamma["q"] * self.gamma["k"]
