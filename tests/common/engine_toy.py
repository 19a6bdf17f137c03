"""A toy task for the training engine's tests: noisy linear regression with dropout (so that resuming must restore
the generators), momentum SGD with a step scheduler and gradient clipping; run by the tests and, under torchrun,
by two gloo processes (``python engine_toy.py OUT [N]``: each process takes its half of every batch; with N, a
Ctrl-C in update N and a rerun)."""
import os
import signal
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.training import Engine, Plan, Task  # noqa: E402
from common.utils.distributed import wrap_model  # noqa: E402
from common.utils.seed import seed_everything  # noqa: E402

EXAMPLES, BATCH, DIM = 40, 8, 4


class ToyTask(Task):
    saved = ("counter",)

    def __init__(self, seed, runtime, dropout=0.2, interrupt_at=None, batch=BATCH, ctrl_c=1):
        seed_everything(seed)
        data = torch.Generator().manual_seed(123)
        self.x = torch.randn(EXAMPLES, DIM, generator=data)
        self.y = self.x @ torch.arange(1.0, DIM + 1) + 0.1 * torch.randn(EXAMPLES, generator=data)
        self.seed, self.runtime, self.env, self.batch = seed, runtime, runtime.env, batch
        self.model = nn.Sequential(nn.Linear(DIM, 8), nn.Dropout(dropout), nn.Linear(8, 1))
        self.forward = wrap_model(self.model, self.env)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, 4, 0.8)
        self.clip = lambda: nn.utils.clip_grad_norm_(self.model.parameters(), 5.0)
        self.interrupt_at, self.ctrl_c, self.best_weights, self.counter = interrupt_at, ctrl_c, None, 0

    def updates(self, epoch):
        order = torch.randperm(EXAMPLES, generator=torch.Generator().manual_seed(self.seed * 1000 + epoch)).tolist()
        return [order[i:i + self.batch] for i in range(0, EXAMPLES - self.batch + 1, self.batch)]

    def train_step(self, update, state):
        for _ in range(self.ctrl_c if state.step + 1 == self.interrupt_at else 0):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C inside the update: the engine lets it end, then saves
        mine = torch.tensor_split(torch.tensor(update), self.env.world_size)[self.env.rank]
        loss = F.mse_loss(self.forward(self.x[mine]).squeeze(-1), self.y[mine])
        self.runtime.backward(loss)
        return {"train/loss": loss}

    def initial_values(self):
        return {"init/weight_norm": float(self.model[0].weight.detach().norm())}

    def after_update(self, state):
        self.counter += 1

    def record(self, state):
        return {"seed": self.seed, "dev": {"mse": state.history[-1]["dev/mse"]}, "train_seconds": state.train_seconds}

    def evaluate(self, state):
        self.model.eval()
        with torch.no_grad():
            return {"dev/mse": float(F.mse_loss(self.model(self.x).squeeze(-1), self.y))}

    def score(self, metrics):
        return -metrics["dev/mse"]

    def on_best(self, state):
        self.best_weights = {k: v.clone() for k, v in self.model.state_dict().items()}


def fit(run_dir, runtime, plan, seed=0, **task_options):
    task = ToyTask(seed, runtime, **task_options)
    state = Engine(runtime, run_dir, plan, progress=False).fit(task)
    return task, state


if __name__ == "__main__":  # under torchrun: two processes, each half of every batch; [Ctrl-C at update N, rerun]
    from common.utils.distributed import barrier, cleanup
    from common.utils.runtime import Runtime

    runtime = Runtime.create("cpu", distributed=True)
    plan, interrupt_at = Plan(max_epochs=3, log_every=2), int(sys.argv[2]) if len(sys.argv) > 2 else None
    if interrupt_at:
        try:
            fit(Path(sys.argv[1]) / "ddp", runtime, plan, dropout=0.0, interrupt_at=interrupt_at)
        except KeyboardInterrupt:
            barrier(runtime.env)
    task, state = fit(Path(sys.argv[1]) / "ddp", runtime, plan, dropout=0.0)
    if runtime.env.is_main:
        torch.save({"state": task.model.state_dict(), "history": state.history,
                    "world_size": runtime.env.world_size}, Path(sys.argv[1]) / "ddp.pt")
    cleanup(runtime.env)
