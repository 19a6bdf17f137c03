"""A tagger built from its config, its predicted tags and its accuracies: what the training's evaluations and
``python -m tagging.evaluate`` score."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Dict, List

import torch
from omegaconf import DictConfig

from common import attention
from common.utils.runtime import Runtime

from .data import Batch, Chunk, Vocabulary, batches, length_sorted_order
from .metrics import accuracies
from .model import Tagger


def build_model(cfg: DictConfig, vocab: Vocabulary) -> Tagger:
    options = {"normalizer": cfg.attention.name, "normalizer_options": dict(cfg.attention.options)}
    return Tagger(len(vocab.words), len(vocab.chars), len(vocab.tags), cfg.variant, max_len=cfg.data.max_len,
                  attention=options, **cfg.model)


@torch.no_grad()
def predict(model: Tagger, chunks: List[Chunk], runtime: Runtime, mc_samples: int = 0, batch_size: int = 256
            ) -> List[Batch]:
    """Each eval batch with ``tags`` replaced by the predicted tags (the MC mean over ``mc_samples`` sampled
    passes when given, else the eval-mode forward)."""
    model.eval()
    out = []
    sampling = attention.mc_sampling(model) if mc_samples else nullcontext()
    with sampling, runtime.autocast():
        for batch in batches(chunks, batch_size, length_sorted_order(chunks, batch_size)):
            batch = batch.to(runtime.device)
            if mc_samples:
                probs = sum(model(batch.words, batch.chars, batch.char_index, batch.mask).float().softmax(-1)
                            for _ in range(mc_samples))
            else:
                probs = model(batch.words, batch.chars, batch.char_index, batch.mask)
            out.append((batch, probs.argmax(-1)))
    return out


def evaluate(model: Tagger, chunks: List[Chunk], runtime: Runtime, mc_samples: int = 0) -> Dict[str, float]:
    """Accuracy (%) over all, OOV and ambiguous words."""
    return accuracies(predict(model, chunks, runtime, mc_samples))


def dev_accuracy(model: Tagger, chunks: List[Chunk], runtime: Runtime) -> float:
    return evaluate(model, chunks, runtime)["all"]
