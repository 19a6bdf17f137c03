"""Paired comparisons (common.metrics.paired) on known answers."""
import math

import numpy as np
import pytest
import sacrebleu

from common.metrics import (
    bleu_item_stats, cider_item_scores, minimal_detectable_difference, paired_bootstrap, paired_t,
)


def test_paired_t_interval_known_answer():
    # d = (1, 2, 0, 2): mean 1.25, sd sqrt(2.75 / 3); t(0.975, 3) = 3.182446
    diff = paired_t([1, 2, 3, 4], [2, 4, 3, 6])
    sd = math.sqrt(2.75 / 3)
    half = 3.182446305 * sd / 2
    assert diff.n == 4 and diff.mean == pytest.approx(1.25) and diff.sd == pytest.approx(sd)
    assert diff.low == pytest.approx(1.25 - half) and diff.high == pytest.approx(1.25 + half)
    assert str(diff) == "+1.25 [-0.27, +2.77]"
    with pytest.raises(ValueError, match="at least 2 pairs"):
        paired_t([1.0], [2.0])
    with pytest.raises(ValueError, match="one length"):
        paired_t([1.0, 2.0], [2.0])


def test_minimal_detectable_difference_known_answers():
    # G*Power, paired t-test, two-tailed alpha 0.05, power 0.8: dz = 0.5292 (n=30), 0.9960 (n=10)
    assert minimal_detectable_difference(1.0, 30) == pytest.approx(0.5292, abs=1e-4)
    assert minimal_detectable_difference(1.0, 10) == pytest.approx(0.9960, abs=1e-4)
    assert minimal_detectable_difference(0.5, 30) == pytest.approx(0.5 * 0.5292, abs=1e-4)  # scales with sd
    # large n: the normal approximation (z_0.975 + z_0.8) sd / sqrt(n)
    assert minimal_detectable_difference(1.0, 10_000) * 100 == pytest.approx(1.95996 + 0.84162, rel=1e-3)
    diff = paired_t(np.zeros(30), np.random.default_rng(0).normal(size=30))
    assert diff.mdd == pytest.approx(minimal_detectable_difference(diff.sd, 30)) and diff.power == 0.8


def test_paired_bootstrap_known_cases():
    same = np.arange(20.0).reshape(-1, 1)
    result = paired_bootstrap(same, same, lambda rows: float(rows.mean()), resamples=200)
    assert result.delta == 0 and result.low == 0 and result.high == 0
    better = paired_bootstrap(np.zeros((20, 1)), np.ones((20, 1)), lambda rows: float(rows.mean()), resamples=200)
    assert (better.delta, better.low, better.high, better.p) == (1.0, 1.0, 1.0, 0.0)
    # b beats a on half the items by 1: delta 0.5, and the interval is the bootstrap spread of a mean
    a, b = np.zeros((400, 1)), np.repeat([[0.0], [1.0]], 200, axis=0)
    mixed = paired_bootstrap(a, b, lambda rows: float(rows.mean()), resamples=2000, seed=1)
    assert mixed.delta == 0.5 and mixed.low == pytest.approx(0.5 - 1.96 * 0.025, abs=0.01)
    assert mixed.high == pytest.approx(0.5 + 1.96 * 0.025, abs=0.01) and mixed.p == 0.0


def test_bleu_item_stats_sum_to_the_corpus_bleu():
    refs = ["the cat sat on the mat", "a dog runs in the park", "it is raining today", "we like green tea"]
    hyp_a = ["the cat sat on a mat", "a dog runs in a park", "it rains today", "we like tea"]
    hyp_b = ["the cat sat on the mat", "a dog runs in the park", "it is raining", "we like green tea"]
    stats_a, score = bleu_item_stats(hyp_a, refs, tokenize="none")
    assert stats_a.shape == (4, 10)
    assert score(stats_a) == pytest.approx(sacrebleu.corpus_bleu(hyp_a, [refs], tokenize="none").score)
    assert score(stats_a[[0, 2]]) == pytest.approx(
        sacrebleu.corpus_bleu([hyp_a[0], hyp_a[2]], [[refs[0], refs[2]]], tokenize="none").score)
    stats_b, _ = bleu_item_stats(hyp_b, refs, tokenize="none")
    result = paired_bootstrap(stats_a, stats_b, score, resamples=100)
    assert result.delta == pytest.approx(score(stats_b) - score(stats_a)) and result.delta > 0
    with pytest.raises(ValueError, match="3 hypotheses but 4 references"):
        bleu_item_stats(hyp_a[:3], refs)


def test_cider_item_scores_average_to_the_corpus_cider():
    from pycocoevalcap.cider.cider import Cider

    refs = {1: ["a man riding a horse", "a person on a horse"], 2: ["two dogs play in snow", "dogs in the snow"],
            3: ["a plate of food", "food on a white plate"]}
    hyps = {1: ["a man on a horse"], 2: ["a cat on a sofa"], 3: ["a plate of food"]}
    scores = cider_item_scores(refs, hyps)
    corpus, _ = Cider().compute_score(refs, hyps)
    assert scores.shape == (3,) and scores.mean() == pytest.approx(corpus)
    assert scores[1] < scores[0] and scores[1] < scores[2]


def test_random_effects_mean_known_answers():
    from common.metrics.paired import random_effects_mean

    # two studies 2 apart with unit standard errors: Q = 2, tau^2 = (2 - 1) / (2 - 2 / 2) = 1, weights 1/2 each
    spread = random_effects_mean([1.0, 3.0], [1.0, 1.0])
    assert (spread["mean"], spread["tau"], spread["k"]) == (pytest.approx(2.0), pytest.approx(1.0), 2)
    assert (spread["low"], spread["high"]) == (pytest.approx(2 - 1.959964, abs=1e-6), pytest.approx(2 + 1.959964,
                                                                                                     abs=1e-6))
    # Q = 0.125 < k - 1: tau = 0, the fixed-effect mean with standard error 1/sqrt(2)
    close = random_effects_mean([1.0, 1.5], [1.0, 1.0])
    assert (close["mean"], close["tau"]) == (pytest.approx(1.25), 0.0)
    assert close["high"] - close["mean"] == pytest.approx(1.959964 / 2 ** 0.5, abs=1e-6)
    with pytest.raises(ValueError, match="two or more effects with positive standard errors"):
        random_effects_mean([1.0], [1.0])
    with pytest.raises(ValueError, match="positive standard errors"):
        random_effects_mean([1.0, 2.0], [1.0, 0.0])


def test_holm_adjust_known_answer():
    from common.metrics.paired import holm_adjust

    # ascending 0.01, 0.02, 0.04, 0.30 x (4, 3, 2, 1) = 0.04, 0.06, 0.08, 0.30, made monotone; given order kept
    assert holm_adjust([0.04, 0.30, 0.01, 0.02]) == pytest.approx([0.08, 0.30, 0.04, 0.06])
    assert holm_adjust([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1, monotone


def test_equivalence_tost_against_the_two_one_sided_tests():
    from scipy import stats as st

    from common.metrics.paired import equivalence_tost, paired_p_value

    a = np.array([90.0, 91.0, 89.5, 92.0, 90.5])
    b = a + np.array([0.2, -0.1, 0.3, 0.0, 0.1])
    result = equivalence_tost(a, b, margin=1.0)
    d = b - a
    lower = st.ttest_1samp(d, -1.0, alternative="greater").pvalue
    upper = st.ttest_1samp(d, 1.0, alternative="less").pvalue
    assert result["p"] == pytest.approx(max(lower, upper)) and result["p"] < 0.05
    assert -1 < result["low"] < result["high"] < 1  # the 90% interval inside the margin: equivalent
    wide = equivalence_tost(a, a + np.array([2.0, -1.5, 1.8, -2.2, 0.4]), margin=1.0)
    assert wide["p"] > 0.05 and (wide["low"] < -1 or wide["high"] > 1)
    assert paired_p_value(a, b) == pytest.approx(st.ttest_rel(b, a).pvalue)


def test_a_table_p_value_never_reads_zero():
    from common.metrics.paired import format_p

    assert [format_p(p) for p in (0.0, 4e-4, 0.001, 0.0126, 1.0)] == ["<0.001", "<0.001", "0.001", "0.013", "1.000"]
