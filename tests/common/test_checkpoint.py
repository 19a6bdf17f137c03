"""A run interrupted and resumed from its checkpoint equals a run that never stopped."""
import pytest
import torch
from torch import nn

from common.utils.checkpoint import Checkpointer, average_checkpoints


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def _run(model, opt, sched, steps, ckpt=None, start=0):
    for step in range(start, steps):
        x = torch.randn(16, 4)  # drawn from the global generator: resuming must restore it
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if ckpt is not None:
            ckpt.save(step, model, opt, sched, extra={"loss": loss.item()})


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    model, opt, sched = _setup()
    _run(model, opt, sched, 10)
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    model, opt, sched = _setup()
    ckpt = Checkpointer(tmp_path, keep=2)
    _run(model, opt, sched, 6, ckpt)  # "crashes" after step 5
    assert [p.name for p in ckpt.paths()] == ["step_4.pt", "step_5.pt"]

    torch.manual_seed(123)  # a new process: different RNG, fresh objects
    model, opt, sched = _setup()
    state = ckpt.load_latest(model, opt, sched)
    assert state["step"] == 5 and "loss" in state["extra"]
    _run(model, opt, sched, 10, ckpt, start=state["step"] + 1)
    for name, value in model.state_dict().items():
        assert torch.equal(value, reference[name]), name


def test_fresh_run_and_unreadable_checkpoint(tmp_path):
    model, opt, _ = _setup()
    ckpt = Checkpointer(tmp_path)
    assert ckpt.load_latest(model, opt) is None
    ckpt.dir.mkdir(parents=True)
    (ckpt.dir / "step_7.pt").write_bytes(b"truncated")
    with pytest.raises(RuntimeError, match="step_7.pt cannot be read.*delete it"):
        ckpt.load_latest(model, opt)


def test_average_checkpoints_is_the_mean_and_keeps_the_last_integer_tensor(tmp_path):
    for i, value in enumerate((1.0, 2.0, 4.0)):
        torch.save({"model": {"w": torch.full((2,), value), "n": torch.tensor(i)}}, tmp_path / f"{i}.pt")
    avg = average_checkpoints([tmp_path / f"{i}.pt" for i in range(3)])
    assert torch.equal(avg["w"], torch.full((2,), 7.0 / 3, dtype=torch.float64).float())
    assert avg["n"].item() == 2
    with pytest.raises(FileNotFoundError, match="no checkpoints"):
        average_checkpoints([])
