"""``vqa.train`` with its output piped: a line per epoch, the summary and the files written."""
import json

from vqa import train as vqa_train

from .test_cli import SMALL


def test_piped_run_prints_epoch_lines_summary_and_files(vqa_fixture, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--data-root", str(vqa_fixture.root), "--out", str(out), "--attention", "softmax", *SMALL]
    assert vqa_train.main([*args, "--epochs", "1"]) == 0
    assert vqa_train.main([*args, "--epochs", "2"]) == 0  # resumes after epoch 1
    captured = capsys.readouterr()
    assert "epoch 1/1: train BCE/question" in captured.err and "epoch 2/2: train BCE/question" in captured.err
    assert "\r" not in captured.err
    last = captured.out.splitlines()[-9:]
    assert last[0].startswith("MCAN softmax: 2 epochs, ") and "val accuracy" in last[0]
    assert last[1] == "files written:" and last[2] == f"  {out / 'results.json'}"
    assert last[-1] == f"  {out / 'val_predictions.json'}"
    results = json.loads((out / "results.json").read_text())
    assert results["train_seconds"] == sum(epoch["seconds"] for epoch in results["epochs"]) > 0
