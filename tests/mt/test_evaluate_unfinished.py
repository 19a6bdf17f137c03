"""mt.evaluate on an interrupted run (checkpoints and best.pt but no results.json) says that training is
unfinished and which checkpoint(s) it scored, on the terminal and in the evaluation JSON."""
from __future__ import annotations

import json

from common.utils.checkpoint import Checkpointer
from mt import evaluate

from .test_cli import run_train


def test_evaluate_names_an_unfinished_run_and_its_checkpoints(tiny_root, tmp_path, capsys):
    out = tmp_path / "run"
    run_train(tiny_root, tmp_path, out, 6)
    (out / "results.json").unlink()  # what a run stopped before its end leaves: checkpoints and best.pt
    capsys.readouterr()
    assert evaluate.main([str(out), "--split", "val", "--beam", "1", "--data-root", str(tiny_root)]) == 0
    captured = capsys.readouterr()
    assert f"seed 1: checkpoint {out / 'best.pt'} (training unfinished: the weights saved so far)" in \
        captured.err.splitlines()
    assert ("unfinished: seed 1 scored at the weights saved so far; re-run the run's python -m mt.train "
            "command to finish its training") in captured.out.splitlines()
    record = json.loads((out / "eval_val_beam1.json").read_text())
    assert (record["seed"], record["checkpoint"], record["finished"]) == (1, str(out / "best.pt"), False)
    assert record["unfinished_seeds"] == [1]

    assert evaluate.main([str(out), "--split", "val", "--beam", "1", "--data-root", str(tiny_root),
                          "--average", "2"]) == 0
    averaged = [str(path) for path in Checkpointer(out).paths()[-2:]]
    assert f"seed 1: checkpoint the average of {', '.join(averaged)} (training unfinished: the weights saved " \
           f"so far)" in capsys.readouterr().err.splitlines()
    assert json.loads((out / "eval_val_avg2_beam1.json").read_text())["checkpoint"] == averaged
