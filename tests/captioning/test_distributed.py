"""captioning.train under torchrun: two gloo processes train, only the first validates and writes,
and the run resumes on one process."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from captioning import training
from captioning.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kl_weight", [1.0, 0.0])  # 0: no KL, so the frozen priors must stay out of DDP's reduction
def test_two_processes_train_and_the_first_writes(coco_fixture, tiny_overrides, tmp_path, kl_weight):
    out = tmp_path / "run"
    overrides = [*tiny_overrides(coco_fixture["root"], out), "train.epochs=1", "eval.every=1", "eval.split=val",
                 "eval.metrics=[cider]", f"kl.weight={kl_weight}"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "captioning.train", "--attention", "bam-wc", "--no-progress", "--device", "cpu", *overrides]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    assert process.returncode == 0, stderr[-3000:]
    assert stdout.count("bam-wc: best val") == 1  # one summary: the first process's
    results = json.loads((out / "results.json").read_text())
    assert results["runtime"]["world_size"] == 2 and results["best_epoch"] == 0
    # one epoch of 20 images at 5 per process and update: 2 updates (one process alone makes 4)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2.pt"]
    assert torch.load(out / "checkpoints" / "step_2.pt", weights_only=False)["extra"]["engine"]["epoch"] == 1
    resumed = training.run(load_config("bam-wc", [*overrides, "train.epochs=2"]), progress=False)
    assert [row["epoch"] for row in resumed["history"]] == [0, 1]
