"""An MCAN run stopped by Ctrl-C and rerun ends exactly as the run that never stopped: BAM-WC with dropout and
the KL, so the generators, the order of the batches and the loaders' seeds must all follow."""
import json

import pytest
import torch

from common.utils import read_metrics
from vqa import train as vqa_train
from vqa import training as vqa_training

from .test_cli import SMALL


def _run(root, out) -> int:
    return vqa_train.main(["--data-root", str(root), "--out", str(out), "--attention", "bam-wc", "kl.weight=0.01",
                           "--epochs", "2", "--no-progress", *SMALL])


def _without_seconds(rows):
    return [{key: value for key, value in row.items() if key != "seconds"} for row in rows]


# 50 questions / batches of 10: 5 updates an epoch; the last update of epoch 1, one inside epoch 2
@pytest.mark.parametrize("interrupt_at", [5, 7])
def test_ctrl_c_then_rerun_follows_the_uninterrupted_run_exactly(vqa_fixture, tmp_path, ctrl_c_on_call,
                                                                 interrupt_at):
    assert _run(vqa_fixture.root, tmp_path / "whole") == 0
    restore = ctrl_c_on_call(vqa_training.MCANTask, "train_step", interrupt_at)
    assert _run(vqa_fixture.root, tmp_path / "cut") == 130
    restore()
    assert (tmp_path / "cut" / "checkpoints" / f"step_{interrupt_at}.pt").is_file()
    assert _run(vqa_fixture.root, tmp_path / "cut") == 0
    whole, cut = (torch.load(tmp_path / run / "checkpoints" / "step_10.pt", weights_only=False)
                  for run in ("whole", "cut"))
    for name, value in whole["model"].items():
        assert torch.equal(cut["model"][name], value), name
    for index, state in whole["optimizer"]["state"].items():
        assert all(torch.equal(cut["optimizer"]["state"][index][key], value) for key, value in state.items())
    assert torch.equal(cut["rng"]["torch"], whole["rng"]["torch"])
    results = [json.loads((tmp_path / run / "results.json").read_text()) for run in ("whole", "cut")]
    assert _without_seconds(results[1]["epochs"]) == _without_seconds(results[0]["epochs"])
    logged = [[row for row in read_metrics(tmp_path / run / "metrics.jsonl") if "train/bce" in row]
              for run in ("whole", "cut")]
    assert logged[1] == logged[0] and len(logged[0]) == 5  # every other update's line, none twice
