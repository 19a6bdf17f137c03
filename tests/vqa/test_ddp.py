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
    return torch.load(out / "checkpoints" / "step_10.pt", map_location="cpu", weights_only=False)


def test_two_processes_match_one_on_the_global_batch(vqa_fixture, tmp_path):
    ddp = _train(vqa_fixture.root, tmp_path / "ddp", processes=2, batch=5)
    single = _train(vqa_fixture.root, tmp_path / "single", processes=1, batch=10)
    assert ddp["step"] == single["step"] == 10  # 2 epochs of 5 global batches of 10
    states = sorted(single["optimizer"]["state"])
    assert len(states) == len(single["model"])  # one Adam state per parameter, in the model's order
    moments = {}  # Adam's first moment: a running mean of the gradients, linear in them
    for name, index in zip(single["model"], states):
        mine, theirs = single["optimizer"]["state"][index], ddp["optimizer"]["state"][index]
        torch.testing.assert_close(theirs["exp_avg"], mine["exp_avg"], rtol=1e-4, atol=1e-7, msg=name)
        moments[name] = mine["exp_avg"]
    for name, value in single["model"].items():
        # Adam moves a weight by about lr whatever its gradient's size, so where the gradient is at
        # rounding level (a constant shift of every score under softmax, a unit that never fires)
        # the sign of the rounding decides the step; compare the weights with real gradients.
        real = moments[name].abs() > 1e-6
        assert real.float().mean() > 0.5 or name.endswith("bias"), name
        assert torch.allclose(ddp["model"][name][real], value[real], atol=1e-5), name
    ddp_eval, single_eval = (run["extra"]["engine"]["history"][-1]["eval"] for run in (ddp, single))
    assert ddp_eval == single_eval
