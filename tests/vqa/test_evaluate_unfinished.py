"""vqa.evaluate on an interrupted run (checkpoints but no results.json) says that training is unfinished and which
checkpoint it scored, on the terminal and in eval_<split>.json."""
from __future__ import annotations

from vqa import evaluate, train

from tests.unfinished_runs import assert_reported_unfinished

from .test_cli import SMALL


def test_evaluate_names_an_unfinished_run_and_its_checkpoint(vqa_fixture, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["--data-root", str(vqa_fixture.root), "--out", str(out), "--no-progress", "--epochs", "1",
                       *SMALL]) == 0
    (out / "results.json").unlink()  # what a run stopped before its end leaves: its checkpoints
    capsys.readouterr()
    assert evaluate.main([str(out), "--no-progress", "--threads", "1"]) == 0
    captured = capsys.readouterr()
    checkpoint = out / "checkpoints" / "step_5.pt"  # the end of epoch 1: update 5
    assert_reported_unfinished(captured, out / "eval_val.json", 0, checkpoint, "python -m vqa.train")
