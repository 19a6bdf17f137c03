"""GLUE metrics against hand computations and against scikit-learn/scipy called directly."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from nlu.metrics import compute_metrics

# gold/predicted with a known confusion matrix: TP=3, TN=2, FP=1, FN=2 (8 examples)
GOLD = [1, 1, 1, 1, 1, 0, 0, 0]
PRED = [1, 1, 1, 0, 0, 0, 0, 1]
TP, TN, FP, FN = 3, 2, 1, 2


def test_mcc_by_formula():
    expected = (TP * TN - FP * FN) / math.sqrt((TP + FP) * (TP + FN) * (TN + FP) * (TN + FN))  # 4 / sqrt(240)
    assert compute_metrics("cola", PRED, GOLD) == {"mcc": pytest.approx(expected)}
    assert expected == pytest.approx(0.2581988897)


def test_mrpc_accuracy_and_f1_by_hand():
    precision, recall = TP / (TP + FP), TP / (TP + FN)  # 3/4, 3/5
    scores = compute_metrics("MRPC", PRED, GOLD)
    assert list(scores) == ["accuracy", "f1"]
    assert scores["accuracy"] == pytest.approx(5 / 8)
    assert scores["f1"] == pytest.approx(2 * precision * recall / (precision + recall)) == pytest.approx(2 / 3)


def test_single_metric_tasks():
    for task in ("rte", "SST-2", "wnli"):
        assert compute_metrics(task, PRED, GOLD) == {"accuracy": pytest.approx(5 / 8)}


def test_pearson_and_spearman_by_hand():
    x, y = [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 5.0]
    # Pearson: means 2.5 and 2.75; sum dx*dy = 5.5; sum dx^2 = 5; sum dy^2 = 8.75
    pearson = 5.5 / math.sqrt(5 * 8.75)
    # Spearman: ranks of y are 1, 3, 2, 4; d = 0, -1, 1, 0; 1 - 6 * 2 / (4 * 15)
    spearman = 1 - 6 * 2 / (4 * (4 ** 2 - 1))
    scores = compute_metrics("sts-b", x, y)
    assert list(scores) == ["pearson", "spearman"]
    assert scores["pearson"] == pytest.approx(pearson) and scores["spearman"] == pytest.approx(spearman) == 0.8


def test_agrees_with_sklearn_and_scipy():
    rng = np.random.default_rng(0)
    gold, pred = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    assert compute_metrics("cola", pred, gold)["mcc"] == pytest.approx(matthews_corrcoef(gold, pred))
    scores = compute_metrics("mrpc", pred.tolist(), gold.tolist())
    assert scores == {"accuracy": pytest.approx(accuracy_score(gold, pred)), "f1": pytest.approx(f1_score(gold, pred))}
    y = rng.uniform(0, 5, 100)
    x = y + rng.normal(0, 1, 100)
    scores = compute_metrics("stsb", x, y)
    assert scores["pearson"] == pytest.approx(pearsonr(x, y)[0])
    assert scores["spearman"] == pytest.approx(spearmanr(x, y)[0])
    assert all(type(v) is float for v in scores.values())


def test_degenerate_inputs():
    assert compute_metrics("cola", [1, 1, 1, 1], [0, 1, 1, 0]) == {"mcc": 0.0}
    assert compute_metrics("cola", [1, 1], [1, 1]) == {"mcc": 0.0}
    assert compute_metrics("mrpc", [0, 0, 0], [0, 0, 0]) == {"accuracy": 1.0, "f1": 0.0}
    constant = compute_metrics("stsb", [2.0, 2.0, 2.0], [0.0, 1.0, 2.0])
    assert math.isnan(constant["pearson"]) and math.isnan(constant["spearman"])
    assert math.isnan(compute_metrics("stsb", [1.0], [2.0])["pearson"])


def test_invalid_inputs():
    with pytest.raises(ValueError, match="equal length"):
        compute_metrics("rte", [0, 1], [0, 1, 1])
    with pytest.raises(ValueError, match="no examples"):
        compute_metrics("rte", [], [])
    with pytest.raises(ValueError, match="class ids in 0..1"):
        compute_metrics("rte", [0, 2], [0, 1])
    with pytest.raises(ValueError, match="class ids"):
        compute_metrics("mrpc", [0.2, 0.9], [0, 1])  # probabilities, not ids
    with pytest.raises(ValueError, match="argmax"):
        compute_metrics("cola", [[0.1, 0.9]], [1])
