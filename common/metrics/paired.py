"""Paired comparisons of two variants: over seeds (t-interval) and over test items (bootstrap).

* :func:`paired_t` compares per-seed scores of two variants trained from the same seeds: the
  mean paired difference ``b - a``, its sample sd, the two-sided t-interval, and the smallest
  true difference the seeds can detect (:func:`minimal_detectable_difference`).
* :func:`paired_bootstrap` compares two systems scored on the same test items (Koehn, EMNLP
  2004): the items are resampled with replacement, the same resample for both systems, and
  the corpus score recomputed from per-item statistics. :func:`bleu_item_stats` gives
  SacreBLEU's per-sentence n-gram statistics (summed, they give the corpus BLEU exactly) and
  :func:`cider_item_scores` pycocoevalcap's per-image CIDEr-D (averaged, the corpus CIDEr-D).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Mapping, Sequence, Tuple

import numpy as np
from scipy import optimize, stats

__all__ = ["PairedDifference", "BootstrapDifference", "paired_t", "minimal_detectable_difference",
           "paired_bootstrap", "random_effects_mean", "paired_p_value", "equivalence_tost", "holm_adjust",
           "format_p", "bleu_item_stats", "cider_item_scores"]


class _Record:
    def as_dict(self) -> Dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class PairedDifference(_Record):
    """``b - a`` over ``n`` paired seeds: ``mean``, sample ``sd``, ``confidence`` interval
    ``[low, high]``, and ``mdd``, the smallest true mean difference detected with ``power``."""

    mean: float
    sd: float
    n: int
    low: float
    high: float
    confidence: float
    mdd: float
    power: float

    def __str__(self) -> str:
        return f"{self.mean:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


@dataclass(frozen=True)
class BootstrapDifference(_Record):
    """Corpus score of ``b`` minus that of ``a`` (``delta``), its percentile ``confidence``
    interval over ``resamples`` paired resamples, and ``p``: the share of resamples in which
    the difference has the other sign than ``delta`` (one-sided, Koehn's test)."""

    delta: float
    low: float
    high: float
    p: float
    confidence: float
    resamples: int


def minimal_detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean paired difference that a two-sided paired t-test at level
    ``alpha`` over ``n`` pairs with difference sd ``sd`` detects with probability ``power``
    (exact, with the noncentral t distribution; about ``2.9 sd / sqrt(n)`` at the defaults)."""
    if n < 2:
        return math.inf
    if sd == 0:
        return 0.0
    df, crit = n - 1, stats.t.ppf(1 - alpha / 2, n - 1)

    def shortfall(delta: float) -> float:
        nc = delta * math.sqrt(n) / sd
        lower_tail = np.nan_to_num(stats.nct.cdf(-crit, df, nc))  # ~0, and NaN where it underflows
        return stats.nct.sf(crit, df, nc) + lower_tail - power

    upper = 2 * sd * (crit + stats.norm.ppf(power) + 1) / math.sqrt(n)  # power(upper) > power
    return float(optimize.brentq(shortfall, 0.0, upper, xtol=1e-10))


def paired_t(a: Sequence[float], b: Sequence[float], confidence: float = 0.95, power: float = 0.8) -> PairedDifference:
    """``b - a`` over paired values (same seeds, same order): mean, sd, t-interval, MDD."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need two 1-d sequences of one length, got {a.shape} and {b.shape}")
    n = a.size
    if n < 2:
        raise ValueError(f"a paired t-interval needs at least 2 pairs, got {n}")
    d = b - a
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return PairedDifference(mean, sd, n, mean - half, mean + half, confidence,
                            minimal_detectable_difference(sd, n, 1 - confidence, power), power)


def paired_bootstrap(stats_a: np.ndarray, stats_b: np.ndarray, score: Callable[[np.ndarray], float],
                     resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> BootstrapDifference:
    """Paired bootstrap over test items of ``score(stats_b) - score(stats_a)``.

    ``stats_*`` hold one row of statistics per test item, in the same item order; ``score`` maps
    the rows of a (re)sample to the corpus score (e.g. BLEU from summed n-gram counts).
    """
    stats_a, stats_b = np.asarray(stats_a), np.asarray(stats_b)
    if len(stats_a) != len(stats_b) or len(stats_a) == 0:
        raise ValueError(f"paired bootstrap needs the same non-empty test items, got {len(stats_a)} and {len(stats_b)}")
    delta = score(stats_b) - score(stats_a)
    rng = np.random.default_rng(seed)
    diffs = np.empty(resamples)
    for r in range(resamples):
        idx = rng.integers(0, len(stats_a), len(stats_a))
        diffs[r] = score(stats_b[idx]) - score(stats_a[idx])
    tail = (1 - confidence) / 2
    low, high = np.quantile(diffs, [tail, 1 - tail])
    p = float(np.mean(diffs <= 0) if delta > 0 else np.mean(diffs >= 0))
    return BootstrapDifference(float(delta), float(low), float(high), p, confidence, resamples)


def bleu_item_stats(hypotheses: Sequence[str], references: Sequence[str],
                    **bleu_options) -> Tuple[np.ndarray, Callable[[np.ndarray], float]]:
    """SacreBLEU's per-sentence statistics (``[sentences, 2 + 2 * max_ngram_order]``) and the
    function that turns rows of them into corpus BLEU; ``bleu_options`` go to
    ``sacrebleu.metrics.BLEU`` (e.g. ``tokenize="none", force=True`` for pre-tokenised text)."""
    from sacrebleu.metrics import BLEU

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    metric = BLEU(**bleu_options)
    item_stats = np.asarray(metric._extract_corpus_statistics(list(hypotheses), [list(references)]), dtype=np.int64)

    def corpus_bleu(rows: np.ndarray) -> float:
        return metric._compute_score_from_stats(rows.sum(0).tolist()).score

    return item_stats, corpus_bleu


def cider_item_scores(references: Mapping[int, Sequence[str]], predictions: Mapping[int, Sequence[str]]) -> np.ndarray:
    """pycocoevalcap's CIDEr-D of every image (sorted ids), from tokenised ``{id: [caption]}``
    maps; their mean is the corpus CIDEr-D (document frequencies come from the references)."""
    from pycocoevalcap.cider.cider import Cider

    ids = sorted(references)
    _, scores = Cider().compute_score({k: list(references[k]) for k in ids}, {k: list(predictions[k]) for k in ids})
    return np.asarray(scores, dtype=float)


def random_effects_mean(means: Sequence[float], standard_errors: Sequence[float], confidence: float = 0.95
                        ) -> Dict[str, float]:
    """DerSimonian-Laird random-effects mean of per-study effects ``means`` with ``standard_errors``: the pooled
    ``mean``, its normal ``confidence`` interval ``[low, high]``, the between-study sd ``tau`` and ``k`` studies
    (DerSimonian & Laird, 1986: ``tau^2 = max(0, (Q - (k - 1)) / (S1 - S2 / S1))`` with ``S_r = sum w_i^r``)."""
    y, se = np.asarray(means, dtype=float), np.asarray(standard_errors, dtype=float)
    if y.shape != se.shape or y.size < 2 or (se <= 0).any():
        raise ValueError(f"a random-effects mean needs two or more effects with positive standard errors, got "
                         f"{y.size} effects and standard errors {se.tolist()}")
    w = 1 / se ** 2
    fixed = float((w * y).sum() / w.sum())
    q = float((w * (y - fixed) ** 2).sum())
    tau2 = max(0.0, (q - (y.size - 1)) / (w.sum() - (w ** 2).sum() / w.sum()))
    w_star = 1 / (se ** 2 + tau2)
    mean = float((w_star * y).sum() / w_star.sum())
    half = float(stats.norm.ppf(0.5 + confidence / 2)) / math.sqrt(float(w_star.sum()))
    return {"mean": mean, "low": mean - half, "high": mean + half, "tau": math.sqrt(tau2), "k": int(y.size),
            "confidence": confidence}


def paired_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p of the paired t-test of ``b - a`` against 0 (identical differences: 1 when they are 0, else 0)."""
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    if np.ptp(d) <= 1e-12 * max(1.0, float(np.abs(d).max(initial=0.0))):
        return 1.0 if not d.any() else 0.0
    return float(stats.ttest_1samp(d, 0.0).pvalue)


def equivalence_tost(a: Sequence[float], b: Sequence[float], margin: float, alpha: float = 0.05) -> Dict[str, float]:
    """Schuirmann's two one-sided paired t-tests of ``|mean(b - a)| < margin``: ``p`` (the larger one-sided p;
    equivalence is shown when ``p < alpha``) and the ``1 - 2 alpha`` interval ``[low, high]`` that lies inside
    ``(-margin, margin)`` exactly when it is."""
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    n = d.size
    if n < 2 or margin <= 0:
        raise ValueError(f"an equivalence test needs at least 2 pairs and a positive margin, got {n} and {margin}")
    mean, se = float(d.mean()), float(d.std(ddof=1)) / math.sqrt(n)
    if se == 0:
        p = 0.0 if abs(mean) < margin else 1.0
    else:
        p = max(float(stats.t.sf((mean + margin) / se, n - 1)), float(stats.t.cdf((mean - margin) / se, n - 1)))
    half = float(stats.t.ppf(1 - alpha, n - 1)) * se
    return {"p": p, "low": mean - half, "high": mean + half, "margin": margin, "alpha": alpha, "n": n}


def format_p(p: float) -> str:
    """A p-value for a table: three decimals, ``<0.001`` below that (never a bare ``0.000``)."""
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def holm_adjust(pvalues: Sequence[float]) -> list:
    """Holm's step-down adjusted p-values, in the order given: ``max_{j <= i} min(1, (m - j + 1) p_(j))`` over the
    ascending order (Holm, 1979); a family-wise error rate ``alpha`` rejects where the adjusted p is below it."""
    p = np.asarray(pvalues, dtype=float)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty_like(p)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (p.size - rank) * p[index]))
        adjusted[index] = running
    return adjusted.tolist()
