"""The two task kinds beside RTE's sentence pairs, end to end on a tiny random BERT: STS-B (regression: one output,
squared error, Pearson/Spearman, test scores clipped to [0, 5]) and CoLA (single sentences, MCC, no header), each on
16 rows of the real training files (train = dev), then ``nlu.evaluate`` on dev and on the real test file."""
from __future__ import annotations

import gzip
import json
import math
import shutil

import pytest
import torch

from nlu import evaluate, train
from nlu.data import read_split, split_path

from .test_training import write_tiny_bert

ROWS = 16


def _rows(source, target, start: int, rows: int, header: bool) -> None:
    """Rows ``start .. start + rows`` of the gzipped ``source`` (and its header) written to ``target``."""
    with gzip.open(source, "rt", encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    kept = lines[:header] + lines[header + start:header + start + rows]
    target.write_text("\n".join(kept) + "\n", encoding="utf-8")


@pytest.fixture(scope="module", params=["STS-B", "CoLA"])
def task_data(request, tmp_path_factory, attn_data_root):
    """(task, model directory, data root): 16 real training rows (both classes for CoLA) as train and dev, the real
    test file."""
    task = request.param
    root = tmp_path_factory.mktemp(task)
    folder = root / "data" / "glue" / task
    start = 16 if task == "CoLA" else 0  # CoLA's first 16 rows are all acceptable; rows 16-31 hold 7 that are not
    for split in ("train", "dev"):
        _rows(split_path(task, "train", attn_data_root), folder / f"{split}.tsv", start, ROWS, header=task != "CoLA")
    shutil.copy(split_path(task, "test", attn_data_root), folder / "test.tsv.gz")
    split = read_split(task, "train", root / "data")
    texts = split.text_a + (split.text_b or []) + read_split(task, "test", root / "data").text_a[:50]
    threads = torch.get_num_threads()
    model = write_tiny_bert(root / "tiny-bert", texts)
    torch.set_num_threads(threads)
    return task, model, root / "data"


def _quiet(main, *args):
    threads = torch.get_num_threads()
    try:
        return main([*args, "--threads", "1", "--device", "cpu"])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.realdata
def test_regression_and_single_sentence_tasks_train_evaluate_and_predict(task_data, tmp_path, capsys):
    task, model, data_root = task_data
    out = tmp_path / "run"
    code = _quiet(train.main, "--task", task, "--model", str(model), "--data-root", str(data_root), "--out", str(out),
                  "--no-progress", "train.batch_size=8", "train.epochs=40", "optim.lr=5e-3", "optim.warmup_ratio=0")
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    if task == "STS-B":  # the scores are being fitted: a high correlation on the training rows (about 0 untrained)
        assert set(results["dev"]) == {"pearson", "spearman"}
        assert results["dev"]["pearson"]["mean"] > 75 and results["dev"]["spearman"]["mean"] > 75, results["dev"]
    else:
        assert set(results["dev"]) == {"mcc"}
        assert results["dev"]["mcc"]["mean"] > 50  # both classes occur in the 16 rows; a constant guess scores 0
    assert _quiet(evaluate.main, str(out), "--data-root", str(data_root)) == 0
    evaluation = json.loads((out / "evaluation-dev.json").read_text())
    metric = "pearson" if task == "STS-B" else "mcc"
    assert math.isclose(evaluation[metric]["mean"], results["dev"][metric]["mean"], abs_tol=1e-6)  # the same weights
    assert _quiet(evaluate.main, str(out), "--data-root", str(data_root), "--split", "test") == 0
    lines = (out / "predictions" / "seed0" / f"{task}.tsv").read_text().splitlines()
    test_rows = len(read_split(task, "test", data_root))
    assert lines[0] == "index\tprediction" and len(lines) == 1 + test_rows
    values = [line.split("\t")[1] for line in lines[1:]]
    if task == "STS-B":
        assert all(0.0 <= float(v) <= 5.0 for v in values)
    else:
        assert set(values) <= {"0", "1"}
