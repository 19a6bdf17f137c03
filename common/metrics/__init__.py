"""Evaluation metrics shared by the domains."""
from .reliability import ReliabilityBins, plot_reliability, reliability_bins
from .uncertainty import (
    expected_calibration_error, mean_probabilities, pavpu_entropy, pavpu_ttest, predictive_entropy, ttest_uncertain,
)

__all__ = [
    "ReliabilityBins", "plot_reliability", "reliability_bins",
    "expected_calibration_error", "mean_probabilities", "pavpu_entropy", "pavpu_ttest", "predictive_entropy",
    "ttest_uncertain",
]
