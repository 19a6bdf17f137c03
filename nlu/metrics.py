"""The official GLUE metrics of each task (scikit-learn and scipy, as in GLUE's and Hugging Face's scorers).

Values are fractions: accuracy and F1 in [0, 1], Matthews correlation and Pearson/Spearman in
[-1, 1]; reports multiply by 100. MRPC's F1 is the binary F1 of class 1 (paraphrase). Degenerate
inputs: constant predictions give MCC 0 (scikit-learn's convention) and F1 0 when no example is
predicted or labelled positive; a correlation with a constant vector, or of fewer than two pairs,
is undefined and returned as ``float('nan')``.
"""
from __future__ import annotations

import math
import warnings
from typing import Dict, Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from .tasks import get_task


def _correlation(function, predictions: np.ndarray, labels: np.ndarray) -> float:
    if len(labels) < 2 or np.all(predictions == predictions[0]) or np.all(labels == labels[0]):
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # near-constant input warnings: the value is still defined
        return float(function(predictions, labels)[0])


def compute_metrics(task, predictions: Sequence, labels: Sequence) -> Dict[str, float]:
    """``{metric: value}`` for the task's metrics (``get_task(task).metrics``, in that order).

    ``predictions`` are class ids (STS-B: float scores), ``labels`` the gold ids (scores), of equal length.
    """
    spec = get_task(task)
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.ndim != 1 or labels.ndim != 1 or len(predictions) != len(labels):
        raise ValueError(f"compute_metrics({spec.name}): predictions {predictions.shape} and labels {labels.shape} "
                         f"must be 1-d of equal length; pass one prediction per example (argmax the logits first)")
    if len(labels) == 0:
        raise ValueError(f"compute_metrics({spec.name}): no examples; pass a non-empty split")
    if spec.regression:
        predictions, labels = predictions.astype(np.float64), labels.astype(np.float64)
        return {"pearson": _correlation(pearsonr, predictions, labels),
                "spearman": _correlation(spearmanr, predictions, labels)}
    for name, values in (("predictions", predictions), ("labels", labels)):
        if values.dtype.kind not in "iub" or values.min() < 0 or values.max() >= spec.num_labels:
            raise ValueError(f"compute_metrics({spec.name}): {name} must be class ids in 0..{spec.num_labels - 1}, "
                             f"got dtype {values.dtype} with range [{values.min()}, {values.max()}]; "
                             f"argmax the logits (and map label names through TaskSpec.labels)")
    metrics = {"accuracy": lambda: accuracy_score(labels, predictions),
               "f1": lambda: f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0),
               "mcc": lambda: matthews_corrcoef(labels, predictions)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="A single label was found")  # all one class: MCC is 0
        return {name: float(metrics[name]()) for name in spec.metrics}
