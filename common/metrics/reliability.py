"""Reliability diagrams (Guo et al. 2017): accuracy against confidence in equal-width bins."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from torch import Tensor


@dataclass
class ReliabilityBins:
    """Per-bin sample counts, mean confidence and accuracy over ``[0, 1]`` in equal widths."""

    count: Tensor
    confidence: Tensor
    accuracy: Tensor

    @property
    def ece(self) -> float:
        r"""Expected calibration error :math:`\sum_b \frac{|B_b|}{N}|\mathrm{acc}_b - \mathrm{conf}_b|`."""
        weights = self.count / self.count.sum().clamp_min(1)
        return float((weights * (self.accuracy - self.confidence).abs()).sum())


def reliability_bins(probs: Tensor, targets: Tensor, num_bins: int = 15) -> ReliabilityBins:
    """Bin the top-class confidence of ``probs[N, C]`` against correctness of ``targets[N]``.

    A confidence ``c`` falls in bin ``ceil(c * num_bins) - 1`` (bins are right-closed).
    """
    if probs.dim() != 2 or targets.shape != probs.shape[:1]:
        raise ValueError(f"probs must be [N, C] and targets [N], got {tuple(probs.shape)} and {tuple(targets.shape)}")
    confidence, predicted = probs.double().max(-1)
    correct = (predicted.cpu() == targets.cpu()).double()
    confidence = confidence.cpu()
    bins = torch.clamp((confidence * num_bins).ceil().long() - 1, 0, num_bins - 1)
    count = torch.zeros(num_bins, dtype=torch.double).index_add_(0, bins, torch.ones_like(confidence))
    conf_sum = torch.zeros(num_bins, dtype=torch.double).index_add_(0, bins, confidence)
    acc_sum = torch.zeros(num_bins, dtype=torch.double).index_add_(0, bins, correct)
    safe = count.clamp_min(1)
    return ReliabilityBins(count, conf_sum / safe, acc_sum / safe)


#: How the gap between a bin's accuracy and its mean confidence is drawn (translucent, hatched).
GAP_STYLE = dict(color="tab:red", alpha=0.3, edgecolor="tab:red", hatch="//")


def reliability_figure(bins: ReliabilityBins, title: Optional[str] = None):
    """The reliability diagram of ``bins``: accuracy bars, the gap to each bin's mean confidence and the diagonal.

    The gap lies above the bar where a bin is overconfident and over the bar's top where it is
    underconfident, which tints the bar there; the legend shows each of the two as it is drawn.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    num_bins = len(bins.count)
    edges = torch.linspace(0, 1, num_bins + 1)
    centres, width = ((edges[:-1] + edges[1:]) / 2).numpy(), 1 / num_bins
    filled = (bins.count > 0).numpy()
    accuracy, confidence = bins.accuracy.numpy(), bins.confidence.numpy()
    fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=120)
    diagonal, = ax.plot([0, 1], [0, 1], "k--", linewidth=1)
    bars = ax.bar(centres[filled], accuracy[filled], width=width, edgecolor="black", color="tab:blue")
    handles, labels = [diagonal, bars], ["perfect calibration", "accuracy"]
    for kind, where in (("overconfident", filled & (confidence > accuracy)),
                        ("underconfident", filled & (accuracy > confidence))):
        if where.any():
            gap = ax.bar(centres[where], abs(confidence - accuracy)[where],
                         bottom=np.minimum(accuracy, confidence)[where], width=width, **GAP_STYLE)
            handles.append(gap if kind == "overconfident" else (bars, gap))  # a tuple: the gap over the bar
            labels.append(f"gap to mean confidence ({kind})")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy",
           title=title or f"Reliability (ECE {100 * bins.ece:.2f}%)")
    ax.legend(handles, labels, loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def plot_reliability(
    probs: Tensor,
    targets: Tensor,
    path: Union[str, Path],
    num_bins: int = 15,
    title: Optional[str] = None,
) -> ReliabilityBins:
    """Draw the reliability diagram of ``probs`` (:func:`reliability_figure`) to a PNG at ``path``; its bins."""
    bins = reliability_bins(probs, targets, num_bins)
    fig = reliability_figure(bins, title)
    import matplotlib.pyplot as plt  # imported by reliability_figure, with the Agg backend

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return bins
