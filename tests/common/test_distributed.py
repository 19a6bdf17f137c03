"""Two gloo processes on the CPU follow the same trajectory as one process on the same global batch."""
import os
import socket

import torch
import torch.multiprocessing as mp
from torch import nn

from common import attention
from common.utils.distributed import all_reduce_mean, cleanup, init_distributed, wrap_model

GLOBAL_BATCH, STEPS = 8, 4


class TinyAttentionModel(nn.Module):
    """Self-attention with a BAM normalizer (eval mode: deterministic, KL still collected)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.Linear(6, 18)
        self.norm = attention.build("bam-wc", key_dim=6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        w = self.norm(q @ k.transpose(-1, -2) / 6**0.5, keys=k)
        return self.head((w @ v).mean(1))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, GLOBAL_BATCH, 5, 6, generator=g), torch.randint(0, 3, (STEPS, GLOBAL_BATCH), generator=g)


def _train(model, xs, ys, env=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.eval()  # no dropout/sampling: the trajectories must match exactly
    losses = []
    for x, y in zip(xs, ys):
        with attention.aux_losses() as aux:
            loss = nn.functional.cross_entropy(model(x), y) + 0.1 * aux.total()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach() if env is None else all_reduce_mean(loss, env))
    return torch.stack(losses)


def _worker(rank, world_size, port, out_path):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    env = init_distributed(device="cpu")
    model = wrap_model(TinyAttentionModel(), env)
    xs, ys = _data()
    shard = slice(rank * GLOBAL_BATCH // world_size, (rank + 1) * GLOBAL_BATCH // world_size)
    losses = _train(model, xs[:, shard], ys[:, shard], env)
    if env.is_main:
        torch.save({"state": model.module.state_dict(), "losses": losses}, out_path)
    cleanup(env)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_processes_match_one_process(tmp_path):
    out = tmp_path / "ddp.pt"
    mp.spawn(_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    ddp = torch.load(out)
    single = TinyAttentionModel()
    xs, ys = _data()
    single_losses = _train(single, xs, ys)
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
