r"""Uncertainty metrics over Monte Carlo samples: PAvPU (two versions) and calibration error.

PAvPU (Patch Accuracy vs Patch Uncertainty, Mukhoti & Gal 2018) rewards being certain when
right and uncertain when wrong:

.. math:: \mathrm{PAvPU} = \frac{n_{ac} + n_{iu}}{n_{ac} + n_{au} + n_{ic} + n_{iu}}

* :func:`pavpu_ttest` is the BAM paper's version (Fan et al. 2020, App. C.2.1): a prediction is
  *uncertain* when a paired t-test between the scores of the two top classes over the MC
  samples cannot reject equal means (p-value > ``p_threshold``).
* :func:`pavpu_entropy` calls a prediction uncertain when the entropy of the MC-averaged
  probabilities exceeds ``threshold``.

Inputs are ``samples[S, N, C]`` (S Monte Carlo samples of N predictions over C classes) and
``targets[N]``; the prediction is the argmax of the MC-mean probabilities.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from .reliability import reliability_bins


def _check(samples: Tensor, targets: Tensor) -> None:
    if samples.dim() != 3:
        raise ValueError(f"samples must be [mc_samples, N, classes], got shape {tuple(samples.shape)}")
    if targets.shape != samples.shape[1:2]:
        raise ValueError(f"targets must be [N] = [{samples.shape[1]}], got shape {tuple(targets.shape)}")


def _pavpu(correct: Tensor, uncertain: Tensor) -> float:
    accurate_certain = (correct & ~uncertain).sum()
    inaccurate_uncertain = (~correct & uncertain).sum()
    return float((accurate_certain + inaccurate_uncertain).item() / max(correct.numel(), 1))


def mean_probabilities(logits: Tensor) -> Tensor:
    """MC-averaged class probabilities ``[N, C]`` from logit samples ``[S, N, C]``."""
    return torch.softmax(logits.double(), dim=-1).mean(0)


def ttest_uncertain(scores: Tensor, p_threshold: float = 0.05) -> Tensor:
    """Boolean ``[N]``: the paired t-test between the top-2 classes (by MC-mean score) over the
    ``S`` samples gives a p-value above ``p_threshold``.

    Samples where the two scores differ by the same amount every time (zero variance) are
    certain unless that difference is zero.
    """
    if scores.shape[0] < 2:
        raise ValueError("the t-test needs at least 2 Monte Carlo samples")
    top2 = scores.mean(0).topk(2, dim=-1).indices  # [N, 2]
    picked = scores.gather(-1, top2.unsqueeze(0).expand(scores.shape[0], -1, -1))  # [S, N, 2]
    diff = (picked[..., 0] - picked[..., 1]).double().cpu().numpy()  # [S, N]
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        # scipy warns of precision loss for (nearly) constant differences, handled just below
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        p_value = stats.ttest_1samp(diff, 0.0, axis=0).pvalue
    constant = np.isnan(p_value)
    p_value[constant] = np.where(np.abs(diff[0, constant]) > 0, 0.0, 1.0)
    return torch.from_numpy(p_value > p_threshold)


def pavpu_ttest(logits: Tensor, targets: Tensor, p_threshold: float = 0.05) -> float:
    """PAvPU with the BAM paper's hypothesis test on the top-2 class logits (see module doc)."""
    _check(logits, targets)
    correct = mean_probabilities(logits).argmax(-1).cpu() == targets.cpu()
    return _pavpu(correct, ttest_uncertain(logits, p_threshold))


def predictive_entropy(probs: Tensor) -> Tensor:
    r"""``H(p) = -\sum_c p_c \log p_c`` of each row of ``probs[N, C]`` (nats)."""
    return -(probs * probs.clamp_min(torch.finfo(probs.dtype).tiny).log()).sum(-1)


def pavpu_entropy(logits: Tensor, targets: Tensor, threshold: float) -> float:
    """PAvPU where a prediction is uncertain when the entropy (nats) of its MC-mean
    probabilities exceeds ``threshold``."""
    _check(logits, targets)
    probs = mean_probabilities(logits)
    correct = probs.argmax(-1).cpu() == targets.cpu()
    return _pavpu(correct, predictive_entropy(probs).cpu() > threshold)


def expected_calibration_error(probs: Tensor, targets: Tensor, num_bins: int = 15) -> float:
    r"""ECE (Guo et al. 2017): :math:`\sum_b \frac{|B_b|}{N} |\mathrm{acc}(B_b) - \mathrm{conf}(B_b)|`
    over ``num_bins`` equal-width confidence bins; ``probs`` is ``[N, C]``."""
    return reliability_bins(probs, targets, num_bins).ece
