"""Evaluation metrics shared by the domains."""
from .paired import (
    BootstrapDifference, PairedDifference, bleu_item_stats, cider_item_scores, minimal_detectable_difference,
    paired_bootstrap, paired_t,
)
from .reliability import ReliabilityBins, plot_reliability, reliability_bins
from .uncertainty import (
    expected_calibration_error, mean_probabilities, pavpu_entropy, pavpu_ttest, predictive_entropy, ttest_uncertain,
)

__all__ = [
    "BootstrapDifference", "PairedDifference", "bleu_item_stats", "cider_item_scores", "minimal_detectable_difference",
    "paired_bootstrap", "paired_t",
    "ReliabilityBins", "plot_reliability", "reliability_bins",
    "expected_calibration_error", "mean_probabilities", "pavpu_entropy", "pavpu_ttest", "predictive_entropy",
    "ttest_uncertain",
]
