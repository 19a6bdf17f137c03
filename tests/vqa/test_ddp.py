"""vqa.train under torchrun: two gloo processes with batch B take the updates of one process
with batch 2B (the summed BCE is scaled by the world size; the shards tile the same permutation)."""
import os
import subprocess
import sys

import torch

from .helpers import TINY

ARGS = [f"model.{k}={v}" for k, v in TINY.items()] + ["model.dropout=0.0", "model.layers=1", "--epochs", "2",
                                                      "--attention", "softmax", "--no-progress"]


def _train(root, out, processes: int, batch: int):
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)] \
        if processes > 1 else [sys.executable]
    cmd = [*launch, "-m", "vqa.train", "--data-root", str(root), "--out", str(out), f"train.batch_size={batch}", *ARGS]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(out / "checkpoints" / "step_1.pt", map_location="cpu", weights_only=False)


def test_two_processes_match_one_on_the_global_batch(vqa_fixture, tmp_path):
    ddp = _train(vqa_fixture.root, tmp_path / "ddp", processes=2, batch=5)
    single = _train(vqa_fixture.root, tmp_path / "single", processes=1, batch=10)
    assert ddp["step"] == single["step"] == 1
    for name, value in single["model"].items():
        if name.endswith("k_proj.bias") or name.endswith("mlp.3.bias"):
            continue  # a constant shift of every score under softmax: gradient exactly 0, Adam amplifies rounding
        assert torch.allclose(ddp["model"][name], value, atol=1e-5), name
    ddp_eval, single_eval = ddp["extra"]["history"][-1]["eval"], single["extra"]["history"][-1]["eval"]
    assert ddp_eval == single_eval
