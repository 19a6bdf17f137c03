"""One rank of the data-parallel test; run by ``torchrun --standalone --nproc_per_node 2`` (``--no-kl``: trained
without the KL, the priors frozen).

Shared with the test: the model, the data and the training loop, so that the single-process
reference runs exactly the same code.
"""
import sys

import torch
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


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, GLOBAL_BATCH, 5, 6, generator=g), torch.randint(0, 3, (STEPS, GLOBAL_BATCH), generator=g)


def train(model, xs, ys, env=None, kl=True):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.eval()  # no dropout/sampling: the trajectories must match exactly
    losses = []
    for x, y in zip(xs, ys):
        with attention.aux_losses(kl) as aux:  # without a collector BAM computes no KL: its prior goes unused
            loss = nn.functional.cross_entropy(model(x), y) + (0.1 * aux.total() if kl else 0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach() if env is None else all_reduce_mean(loss, env))
    return torch.stack(losses)


def main(out_path: str, kl: bool = True) -> None:
    torch.set_num_threads(1)
    env = init_distributed(device="cpu", timeout_s=120)
    model = TinyAttentionModel()
    if not kl:
        attention.freeze_priors(model)
    model = wrap_model(model, env)
    xs, ys = data()
    per_rank = GLOBAL_BATCH // env.world_size
    shard = slice(env.rank * per_rank, (env.rank + 1) * per_rank)
    losses = train(model, xs[:, shard], ys[:, shard], env, kl)
    if env.is_main:
        torch.save({"state": model.module.state_dict(), "losses": losses, "world_size": env.world_size}, out_path)
    cleanup(env)  # with the model alive: the group must go now, not later with the model's reducer
    assert "reducer" not in vars(model) and not torch.distributed.is_initialized()


if __name__ == "__main__":
    main(sys.argv[1], kl="--no-kl" not in sys.argv)
