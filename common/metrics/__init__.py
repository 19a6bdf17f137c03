"""Evaluation metrics shared by the domains (each name imports its submodule on first use, :mod:`common.lazy`)."""
from common.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("BootstrapDifference", "PairedDifference", "bleu_item_stats", "cider_item_scores",
                     "equivalence_tost", "holm_adjust", "minimal_detectable_difference", "paired_bootstrap",
                     "paired_p_value", "paired_t", "random_effects_mean"), "paired"),
    **dict.fromkeys(("ReliabilityBins", "plot_reliability", "reliability_bins"), "reliability"),
    **dict.fromkeys(("expected_calibration_error", "mean_probabilities", "pavpu_entropy", "pavpu_ttest",
                     "predictive_entropy", "ttest_uncertain"), "uncertainty"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
