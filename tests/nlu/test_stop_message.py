"""nlu.train stopped by Ctrl-C inside an update: the update the stop message names is the one saved."""
from __future__ import annotations

import pytest
import torch

from nlu import train, training

from .test_training import rte16  # noqa: F401 (the fixture)


@pytest.mark.realdata
def test_ctrl_c_names_the_update_it_saved(rte16, tmp_path, ctrl_c_on_call, capsys):  # noqa: F811
    model, data_root = rte16
    out, threads = tmp_path / "run", torch.get_num_threads()
    ctrl_c_on_call(training.GlueTask, "train_step", 3)  # a Ctrl-C while update 3 runs
    try:
        code = train.main(["--task", "RTE", "--model", str(model), "--data-root", str(data_root), "--out", str(out),
                           "--threads", "1", "--device", "cpu", "train.batch_size=8", "train.epochs=3",
                           "train.checkpoint_every=1000"])
    finally:
        torch.set_num_threads(threads)
    assert code == 130
    lines = capsys.readouterr().err.splitlines()
    assert f"seed 0: update 3 saved to {out / 'seed0' / 'checkpoints' / 'step_3.pt'}" in lines
    assert lines[-1] == "interrupted at seed 0 update 3/6; re-run the same command to resume"  # a fixed total
