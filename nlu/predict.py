"""Predictions of a fine-tuned GLUE classifier and its official dev metrics: what the training's evaluations and
``python -m nlu.evaluate`` score."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Dict

import numpy as np
import torch

from common import attention
from common.text.batching import length_sorted_batches
from common.utils.runtime import Runtime

from .metrics import compute_metrics
from .model import Encoded, GlueData, collate
from .tasks import TaskSpec


@torch.no_grad()
def predict(model, tokenizer, spec: TaskSpec, encoded: Encoded, runtime: Runtime, batch_size: int,
            mc_samples: int = 0) -> np.ndarray:
    """Predicted class ids (STS-B: scores) of every example of ``encoded``, in order: the eval-mode forward,
    or the mean of ``mc_samples`` sampled passes (probabilities; STS-B: scores)."""
    model.eval()
    out = np.empty(len(encoded), dtype=np.float64 if spec.regression else np.int64)
    with attention.mc_sampling(model) if mc_samples else nullcontext(), runtime.autocast():
        for indices in length_sorted_batches(encoded.lengths, batch_size):
            batch = runtime.to_device(collate(tokenizer, encoded, indices, spec.regression))
            batch.pop("labels", None)
            passes = [model(**batch).logits.float() for _ in range(max(mc_samples, 1))]
            if spec.regression:
                out[indices] = torch.stack(passes).mean(0).squeeze(-1).cpu().numpy()
            else:
                out[indices] = torch.stack([p.softmax(-1) for p in passes]).mean(0).argmax(-1).cpu().numpy()
    return out


def evaluate(model, data: GlueData, runtime: Runtime, batch_size: int, mc_samples: int = 0) -> Dict[str, float]:
    """The task's official dev metrics, in percent."""
    predictions = predict(model, data.tokenizer, data.spec, data.dev, runtime, batch_size, mc_samples)
    return {name: 100 * value for name, value in compute_metrics(data.spec, predictions, data.dev.labels).items()}
