"""MCAN's answer logits: the model a run's config describes, and its predictions for every question of a loader,
on clean or noisy region features (used by training's evaluation and by :mod:`vqa.evaluate`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Tuple

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from common.utils import console
from common.utils.runtime import Runtime

if TYPE_CHECKING:  # the model is imported once the command line and config have been checked
    from .mcan import MCAN


def build_model(cfg: DictConfig, vocab_size: int, num_answers: int,
                word_vectors: Optional[torch.Tensor] = None) -> MCAN:
    """The MCAN of ``cfg.model`` with ``cfg.attention``'s normalizer (``word_vectors``: its initial embeddings)."""
    from .mcan import MCAN, MCANConfig

    config = MCANConfig(vocab_size=vocab_size, num_answers=num_answers, attention=cfg.attention.name,
                        attention_options=dict(cfg.attention.options), **cfg.model)
    return MCAN(config, word_vectors)


def add_feature_noise(features: torch.Tensor, region_mask: torch.Tensor, std: float,
                      generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``features + std * eps`` on the real regions, ``eps ~ N(0, 1)`` (BAM Table 2 "noisy");
    padded regions stay exact zeros."""
    if std == 0:
        return features
    noise = torch.randn(features.shape, generator=generator, dtype=features.dtype, device="cpu").to(features.device)
    return features + std * noise * region_mask.unsqueeze(-1)


@torch.no_grad()
def predict_logits(model: MCAN, loader: DataLoader, runtime: Runtime, noise_std: float = 0.0, seed: int = 0,
                   progress: bool = True, desc: str = "predict") -> Tuple[List[int], torch.Tensor]:
    """Question ids and answer logits ``[N, A]`` of every question in ``loader`` (eval mode)."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    ids, logits = [], []
    for batch in console.progress(loader, desc=f"{desc} batch", enabled=progress):
        batch = runtime.to_device(batch)
        features = add_feature_noise(batch["features"], batch["region_mask"], noise_std, generator)
        with runtime.autocast():
            out = model(batch["question_tokens"], batch["question_mask"], features, batch["region_mask"])
        logits.append(out.float().cpu())
        ids += batch["question_id"].tolist()
    return ids, torch.cat(logits)
