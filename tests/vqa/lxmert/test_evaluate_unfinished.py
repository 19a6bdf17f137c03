"""vqa.lxmert.evaluate on an interrupted run (checkpoints but no results.json) says that training is unfinished
and which checkpoint it scored, on the terminal and in eval_<split>.json."""
from __future__ import annotations

from common.utils.checkpoint import Checkpointer
from vqa.lxmert import evaluate, train

from tests.unfinished_runs import assert_reported_unfinished

from .test_lxmert_training import _train_args


def test_evaluate_names_an_unfinished_run_and_its_checkpoint(vqa_root, tmp_path, capsys):
    root, _, _ = vqa_root
    out = tmp_path / "run"
    assert train.main(_train_args(root, out, "train.epochs=1")) == 0
    (out / "results.json").unlink()  # what a run stopped before its end leaves: its checkpoints
    capsys.readouterr()
    assert evaluate.main([str(out), "--no-progress", "--threads", "1"]) == 0
    captured = capsys.readouterr()
    checkpoint = Checkpointer(out).paths()[-1]
    assert_reported_unfinished(captured, out / "eval_val.json", 0, checkpoint, "python -m vqa.lxmert.train")
