"""nlu.evaluate on an interrupted run (a seed with its checkpoint but no seed<k>.json) names the seed as
unfinished and the checkpoint it scored, on the terminal and in the evaluation JSON; finished seeds stay so."""
from __future__ import annotations

import json

import pytest
import torch

from common.utils.checkpoint import Checkpointer
from nlu import evaluate, train

from .test_training import rte16  # noqa: F401 (the fixture)


@pytest.mark.realdata
def test_evaluate_names_an_unfinished_seed_and_its_checkpoint(rte16, tmp_path, capsys):  # noqa: F811
    model, data_root = rte16
    out, threads = tmp_path / "run", torch.get_num_threads()
    common = ["--data-root", str(data_root), "--threads", "1", "--device", "cpu"]
    try:
        assert train.main(["--task", "RTE", "--model", str(model), "--out", str(out), "--seeds", "2", "--no-progress",
                           "train.epochs=1", *common]) == 0
        (out / "seed1.json").unlink()  # what a run stopped inside seed 1 leaves: its checkpoint, no record
        capsys.readouterr()
        assert evaluate.main([str(out), *common]) == 0
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    checkpoints = [Checkpointer(out / f"seed{seed}").paths()[-1] for seed in (0, 1)]
    assert f"seed 0: checkpoint {checkpoints[0]}" in captured.err.splitlines()
    assert (f"seed 1: checkpoint {checkpoints[1]} (training unfinished: the weights saved so far)"
            in captured.err.splitlines())
    assert ("unfinished: seed 1 scored at the weights saved so far; re-run the run's python -m nlu.train "
            "command to finish its training") in captured.out.splitlines()
    evaluation = json.loads((out / "evaluation-dev.json").read_text())
    assert [(r["seed"], r["checkpoint"], r["finished"]) for r in evaluation["per_seed"]] == [
        (0, str(checkpoints[0]), True), (1, str(checkpoints[1]), False)]
    assert evaluation["unfinished_seeds"] == [1]
