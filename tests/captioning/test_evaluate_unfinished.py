"""captioning.evaluate on an interrupted run (best.pt and checkpoints but no results.json) says that training is
unfinished and which checkpoint it scored, on the terminal and in results_<split>.json."""
from __future__ import annotations

from captioning import evaluate, training
from captioning.config import load_config

from tests.unfinished_runs import assert_reported_unfinished


def test_evaluate_names_an_unfinished_run_and_its_checkpoint(coco_fixture, tiny_overrides, tmp_path, capsys):
    out = tmp_path / "run"
    training.run(load_config("softmax", tiny_overrides(coco_fixture["root"], out) + [
        "train.epochs=1", "eval.split=val", "eval.metrics=[cider]"]), progress=False)
    (out / "results.json").unlink()  # what a run stopped before its end leaves: best.pt and checkpoints
    capsys.readouterr()
    assert evaluate.main([str(out), "--split", "val", "--metrics", "cider", "--no-progress", "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert_reported_unfinished(captured, out / "results_val.json", 0, out / "best.pt", "python -m captioning.train")
