"""One call that seeds every random number generator a training run touches."""
from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch (CPU and all CUDA devices).

    ``deterministic=True`` also asks torch for deterministic kernels (slower on GPU, and it
    raises for ops that have none), for bit-exact reruns.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
