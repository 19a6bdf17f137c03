"""vqa.lxmert.evaluate on an interrupted run (checkpoints but no results.json) says that training is unfinished
and which checkpoint it scored, on the terminal and in eval_<split>.json."""
from __future__ import annotations

import json

from common.utils.checkpoint import Checkpointer
from vqa.lxmert import evaluate, train

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
    assert f"seed 0: checkpoint {checkpoint} (training unfinished: the weights saved so far)" in \
        captured.err.splitlines()
    assert ("unfinished: seed 0 scored at the weights saved so far; re-run the run's python -m vqa.lxmert.train "
            "command to finish its training") in captured.out.splitlines()
    record = json.loads((out / "eval_val.json").read_text())
    assert (record["seed"], record["checkpoint"], record["finished"]) == (0, str(checkpoint), False)
    assert record["unfinished_seeds"] == [0]
