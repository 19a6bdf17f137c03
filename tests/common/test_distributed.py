"""Two gloo processes on the CPU follow the same trajectory as one process on the same global batch."""
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from common import attention
from common.utils.distributed import all_reduce_mean, init_distributed, share_of_mean, wrap_model

from .ddp_worker import TinyAttentionModel, data, train

WORKER = Path(__file__).with_name("ddp_worker.py")


def _two_processes(tmp_path, *flags):
    out = tmp_path / "ddp.pt"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER), str(out),
           *flags]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    ddp = torch.load(out)
    assert ddp["world_size"] == 2
    return ddp


def test_two_gloo_processes_match_one_process(tmp_path):
    ddp = _two_processes(tmp_path)
    single = TinyAttentionModel()
    xs, ys = data()
    single_losses = train(single, xs, ys)
    assert torch.allclose(ddp["losses"], single_losses, atol=1e-5)
    for name, value in single.state_dict().items():
        assert torch.allclose(ddp["state"][name], value, atol=1e-5), name
    assert not torch.allclose(single.state_dict()["head.weight"], TinyAttentionModel().state_dict()["head.weight"])
    assert single.norm.prior_net.out.weight.grad is not None  # the KL trained the prior network too


def test_without_the_kl_frozen_priors_let_two_processes_train(tmp_path):
    """Without the KL the contextual prior gets no gradient, which DDP would wait for at the second update (it
    raises "Expected to have finished reduction"): :func:`attention.freeze_priors` takes it out of the reduction."""
    ddp = _two_processes(tmp_path, "--no-kl")
    single = TinyAttentionModel()
    assert attention.freeze_priors(single) == 1
    xs, ys = data()
    assert torch.allclose(ddp["losses"], train(single, xs, ys, kl=False), atol=1e-5)
    for name, value in single.state_dict().items():
        assert torch.allclose(ddp["state"][name], value, atol=1e-5), name
    untrained = TinyAttentionModel().norm.prior_net.state_dict()
    assert all(torch.equal(value, untrained[name]) for name, value in single.norm.prior_net.state_dict().items())
    assert not any(p.requires_grad for p in single.norm.prior_net.parameters())
    assert all(p.requires_grad for name, p in single.named_parameters() if "prior_net" not in name)


def test_single_process_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    env = init_distributed()
    model = nn.Linear(2, 2)
    assert not env.distributed and env.is_main and wrap_model(model, env) is model
    assert torch.equal(all_reduce_mean(torch.tensor(3.0), env), torch.tensor(3.0))


def test_shares_of_a_mean_averaged_over_processes_are_the_global_mean():
    losses = torch.tensor([1.0, 2.0, 4.0, 8.0, 16.0])
    shares = [share_of_mean(part.sum(), losses.numel(), 2) for part in (losses[:2], losses[2:])]  # two processes
    assert torch.isclose(sum(shares) / 2, losses.mean())  # DDP's gradient average of the shares
    assert torch.isclose(share_of_mean(losses.sum(), losses.numel(), 1), losses.mean())
    assert share_of_mean(torch.tensor(0.0), 0, 1) == 0  # a batch without a target: no division by zero
