"""vqa.evaluate on an interrupted run (checkpoints but no results.json) says that training is unfinished and which
checkpoint it scored, on the terminal and in eval_<split>.json."""
from __future__ import annotations

import json

from vqa import evaluate, train

from .test_cli import SMALL


def test_evaluate_names_an_unfinished_run_and_its_checkpoint(vqa_fixture, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["--data-root", str(vqa_fixture.root), "--out", str(out), "--no-progress", "--epochs", "1",
                       *SMALL]) == 0
    (out / "results.json").unlink()  # what a run stopped before its end leaves: its checkpoints
    capsys.readouterr()
    assert evaluate.main([str(out), "--no-progress", "--threads", "1"]) == 0
    captured = capsys.readouterr()
    checkpoint = out / "checkpoints" / "step_0.pt"
    assert f"seed 0: checkpoint {checkpoint} (training unfinished: the weights saved so far)" in \
        captured.err.splitlines()
    assert ("unfinished: seed 0 scored at the weights saved so far; re-run the run's python -m vqa.train "
            "command to finish its training") in captured.out.splitlines()
    report = json.loads((out / "eval_val.json").read_text())
    assert (report["seed"], report["checkpoint"], report["finished"]) == (0, str(checkpoint), False)
    assert report["unfinished_seeds"] == [0]
