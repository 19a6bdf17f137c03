"""Evaluation metrics shared by the domains."""
from .uncertainty import (
    expected_calibration_error, mean_probabilities, pavpu_entropy, pavpu_ttest, predictive_entropy, ttest_uncertain,
)

__all__ = [
    "expected_calibration_error", "mean_probabilities", "pavpu_entropy", "pavpu_ttest", "predictive_entropy",
    "ttest_uncertain",
]
