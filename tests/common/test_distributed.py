"""Two gloo processes on the CPU follow the same trajectory as one process on the same global batch."""
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from common.utils.distributed import all_reduce_mean, init_distributed, wrap_model

from .ddp_worker import TinyAttentionModel, data, train

WORKER = Path(__file__).with_name("ddp_worker.py")


def test_two_gloo_processes_match_one_process(tmp_path):
    out = tmp_path / "ddp.pt"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER), str(out)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    ddp = torch.load(out)
    assert ddp["world_size"] == 2
    single = TinyAttentionModel()
    xs, ys = data()
    single_losses = train(single, xs, ys)
    assert torch.allclose(ddp["losses"], single_losses, atol=1e-5)
    for name, value in single.state_dict().items():
        assert torch.allclose(ddp["state"][name], value, atol=1e-5), name
    assert not torch.allclose(single.state_dict()["head.weight"], TinyAttentionModel().state_dict()["head.weight"])
    assert single.norm.prior_net.out.weight.grad is not None  # the KL trained the prior network too


def test_single_process_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    env = init_distributed()
    model = nn.Linear(2, 2)
    assert not env.distributed and env.is_main and wrap_model(model, env) is model
    assert torch.equal(all_reduce_mean(torch.tensor(3.0), env), torch.tensor(3.0))
