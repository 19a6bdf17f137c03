"""tagging.evaluate on an interrupted run (a seed with its best.pt but no seed<k>.json) names the seed as
unfinished and the checkpoint it scored, on the terminal and in the evaluation JSON."""
from __future__ import annotations

import json

from tagging import evaluate, train
from tests.tagging.test_cli import TINY


def test_evaluate_names_an_unfinished_seed_and_its_checkpoint(tiny_treebank, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["--treebank", str(tiny_treebank), "--data-root", str(tmp_path), "--out", str(out),
                       "--seeds", "1", "--variant", "pr", "--threads", "1", "--no-progress", *TINY]) == 0
    (out / "seed0.json").unlink()  # what a run stopped inside seed 0 leaves: its best.pt, no record
    capsys.readouterr()
    assert evaluate.main([str(out), "--threads", "1"]) == 0
    captured = capsys.readouterr()
    best = out / "seed0" / "best.pt"
    assert f"seed 0: checkpoint {best} (training unfinished: the weights saved so far)" in captured.err.splitlines()
    assert ("unfinished: seed 0 scored at the weights saved so far; re-run the run's python -m tagging.train "
            "command to finish its training") in captured.out.splitlines()
    evaluation = json.loads((out / "evaluation-UD_Toy-Tiny-test.json").read_text())
    (scored,) = evaluation["per_seed"]
    assert scored["finished"] is False and scored["checkpoint"] == str(best)
    assert evaluation["unfinished_seeds"] == [0]
