"""tagging.train stopped by Ctrl-C inside an update: the update the stop message names is the one saved, and the
bound of its position is where patience runs out (not max_epochs' updates)."""
from __future__ import annotations

import json
import re

from tagging import train, training
from tests.tagging.test_cli import TINY


def test_ctrl_c_names_the_update_it_saved(tiny_treebank, tmp_path, ctrl_c_on_call, capsys):
    out = tmp_path / "run"
    args = ["--treebank", str(tiny_treebank), "--data-root", str(tmp_path), "--out", str(out), "--seeds", "1",
            "--threads", "1", *TINY, "train.patience=1"]
    restore = ctrl_c_on_call(training.TaggingTask, "train_step", 5)  # a Ctrl-C while update 5 runs
    assert train.main(args) == 130
    restore()
    lines = capsys.readouterr().err.splitlines()
    assert f"seed 0: update 5 saved to {out / 'seed0' / 'checkpoints' / 'step_5.pt'}" in lines
    stopped = re.fullmatch(r"interrupted at seed 0 update (\d+) of at most (\d+); re-run the same command to resume",
                           lines[-1])
    assert stopped and int(stopped.group(1)) == 5, lines
    assert train.main(args) == 0  # resumed to the end
    (seed,) = json.loads((out / "results.json").read_text())["per_seed"]
    assert int(stopped.group(2)) == seed["updates_per_epoch"]  # patience 1 in epoch 1: this epoch's updates at most
