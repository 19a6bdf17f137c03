"""mt.evaluate on an interrupted run (checkpoints and best.pt but no results.json) says that training is
unfinished and which checkpoint(s) it scored, on the terminal and in the evaluation JSON."""
from __future__ import annotations

import json

from common.utils.checkpoint import Checkpointer
from mt import evaluate

from tests.unfinished_runs import assert_reported_unfinished

from .test_cli import run_train


def test_evaluate_names_an_unfinished_run_and_its_checkpoints(tiny_root, tmp_path, capsys):
    out = tmp_path / "run"
    run_train(tiny_root, tmp_path, out, 6)
    (out / "results.json").unlink()  # what a run stopped before its end leaves: checkpoints and best.pt
    capsys.readouterr()
    assert evaluate.main([str(out), "--split", "val", "--beam", "1", "--data-root", str(tiny_root)]) == 0
    captured = capsys.readouterr()
    assert_reported_unfinished(captured, out / "eval_val_beam1.json", 1, out / "best.pt", "python -m mt.train")

    assert evaluate.main([str(out), "--split", "val", "--beam", "1", "--data-root", str(tiny_root),
                          "--average", "2"]) == 0
    averaged = [str(path) for path in Checkpointer(out).paths()[-2:]]
    assert f"seed 1: checkpoint the average of {', '.join(averaged)} (training unfinished: the weights saved " \
           f"so far)" in capsys.readouterr().err.splitlines()
    assert json.loads((out / "eval_val_avg2_beam1.json").read_text())["checkpoint"] == averaged
