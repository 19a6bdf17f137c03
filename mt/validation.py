"""Validation during translation training: the cross-entropy per target token (perplexity) and the greedy BLEU
of the validation split."""
from __future__ import annotations

import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from common.utils.runtime import Runtime

from .batching import iterate_batches, token_batches
from .data import ParallelData, Prepared
from .translation import bleu_on_split


@torch.no_grad()
def validation_loss(model, data: ParallelData, src_pad: int, tgt_pad: int, max_tokens: int,
                    runtime: Optional[Runtime] = None) -> float:
    """Mean cross-entropy per target token (no smoothing, posterior-mean attention)."""
    runtime = runtime or Runtime(torch.device("cpu"))
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for batch in iterate_batches(data, token_batches(data.src_lengths, data.tgt_lengths, max_tokens, shuffle=False),
                                 src_pad, tgt_pad):
        batch = runtime.to_device(batch)
        with runtime.autocast():
            logits = model(batch.src, batch.src_mask, batch.tgt_in)
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=tgt_pad,
                                       reduction="sum"))
        tokens += int(batch.tgt_out.ne(tgt_pad).sum())
    model.train(was_training)
    return total / tokens


def validate(model, prepared: Prepared, data: ParallelData, cfg, runtime: Runtime) -> Dict[str, float]:
    """``val/loss`` (cross-entropy per target token), ``val/ppl`` and ``val/bleu`` (greedy, on the first
    ``eval.valid_bleu_sentences`` sentences) of ``model`` on ``data``, the split ``data.valid_split``."""
    loss = validation_loss(model, data, prepared.src_vocab.pad, prepared.tgt_vocab.pad, cfg.batching.max_tokens,
                           runtime)
    e = cfg.eval
    bleu = bleu_on_split(model, prepared, cfg.data.valid_split, beam=1, length_penalty=1.0, max_len_a=e.max_len_a,
                         max_len_b=e.max_len_b, batch_size=e.batch_sentences, limit=e.valid_bleu_sentences,
                         detok=False, runtime=runtime)["bleu"]
    return {"val/loss": loss, "val/ppl": math.exp(min(loss, 50.0)), "val/bleu": bleu}
