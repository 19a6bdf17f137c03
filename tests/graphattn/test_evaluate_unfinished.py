"""graphattn.evaluate on an interrupted run: a seed<k>.pt is written when its seed ends, so the seeds of the run
without one are named as unfinished (not scored), on the terminal and in the report; the scored ones as finished."""
from __future__ import annotations

import json

from graphattn import evaluate, train


def test_evaluate_names_the_seeds_without_a_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ATTN_DATA_ROOT", raising=False)
    out = tmp_path / "run"
    assert train.main(["--dataset", "demo", "--seeds", "3", "--out", str(out), "--no-progress", "--threads", "1",
                       "train.max_epochs=3"]) == 0
    for seed in (1, 2):
        (out / f"seed{seed}.pt").unlink()  # what a run stopped inside seed 1 leaves: seed 0's checkpoint alone
    capsys.readouterr()
    assert evaluate.main([str(out), "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert any(line.startswith(f"{out / 'seed0.pt'}: test acc ") for line in captured.err.splitlines())
    printed = captured.out.splitlines()
    assert ("unfinished: seeds 1, 2 not scored (no checkpoint); re-run the run's python -m graphattn.train "
            "command to finish its training") in printed
    report = json.loads((out / "evaluation.json").read_text())
    assert [(r["seed"], r["checkpoint"], r["finished"]) for r in report["checkpoints"]] == [
        (0, str(out / "seed0.pt"), True)]
    assert report["unfinished_seeds"] == [1, 2]
