"""The training engine (common.training) against a toy task: exact resume after Ctrl-C, the exit status and hint,
seed reuse and config refusal, an epoch without an update, the progress totals, the results, and two gloo
processes following one."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.training import Engine, Plan, Task, TrainState, seeds_record, train_seeds
from common.utils import Checkpointer, console, read_metrics
from common.utils.runtime import Runtime

from .engine_toy import EXAMPLES, BATCH, ToyTask, fit

CPU = Runtime(torch.device("cpu"))


@pytest.fixture(autouse=True)
def python_handles_ctrl_c():
    """A suite started in the background by a shell without job control inherits SIGINT ignored: the toy task's
    Ctrl-C needs Python's handler, as a terminal gives it."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
PLAN = Plan(max_epochs=4, patience=2, log_every=2, checkpoint_every=3, keep=2)
PER_EPOCH = EXAMPLES // BATCH


def _same_weights(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("interrupt_at", [4, PER_EPOCH, 2 * PER_EPOCH + 1])  # mid-epoch, an epoch's last
def test_ctrl_c_then_rerun_follows_the_uninterrupted_run_exactly(tmp_path, interrupt_at):
    whole, whole_state = fit(tmp_path / "whole", CPU, PLAN)
    with pytest.raises(KeyboardInterrupt):
        fit(tmp_path / "cut", CPU, PLAN, interrupt_at=interrupt_at)
    saved = torch.load(Checkpointer(tmp_path / "cut").paths()[-1], weights_only=False)
    assert saved["step"] == interrupt_at and saved["extra"]["interrupted"]  # the update Ctrl-C arrived in, done
    resumed, state = fit(tmp_path / "cut", CPU, PLAN)
    assert _same_weights(resumed.model.state_dict(), whole.model.state_dict())
    assert _same_weights(resumed.best_weights or whole.best_weights, whole.best_weights)
    assert state.history == whole_state.history and state.step == whole_state.step
    assert resumed.counter == whole.counter == state.step  # the task's own state came back too
    assert resumed.scheduler.last_epoch == whole.scheduler.last_epoch
    # the checkpoint Ctrl-C wrote is gone: the kept ones are those of the uninterrupted run
    names = lambda d: sorted(p.name for p in (d / "checkpoints").glob("*.pt"))  # noqa: E731
    assert names(tmp_path / "cut") == names(tmp_path / "whole")
    losses = lambda d: [r["train/loss"] for r in read_metrics(d / "metrics.jsonl", "train/loss")]  # noqa: E731
    assert losses(tmp_path / "cut")[-3:] == losses(tmp_path / "whole")[-3:]


def test_a_tasks_saved_attributes_round_trip_a_schedule_through_its_own_state_dict():
    class Halving:  # a schedule that is not a torch scheduler
        def __init__(self):
            self.lr = 1.0

        def state_dict(self):
            return {"lr": self.lr}

        def load_state_dict(self, state):
            self.lr = state["lr"]

    class Saving(Task):
        saved = ("schedule", "best")

        def __init__(self):
            self.schedule, self.best = Halving(), None

    task = Saving()
    task.schedule.lr, task.best = 0.25, {"acc": 0.8}
    state = task.state_dict()
    assert state == {"schedule": {"lr": 0.25}, "best": {"acc": 0.8}}
    restored = Saving()
    schedule = restored.schedule
    restored.load_state_dict(state)
    assert restored.schedule is schedule and schedule.lr == 0.25 and restored.best == {"acc": 0.8}
    assert Task().state_dict() == {}
    with pytest.raises(ValueError, match=r"holds \['best', 'loss'\] where Saving saves \['best', 'schedule'\]"):
        Saving().load_state_dict({"loss": 0.5, "best": None})  # another version's checkpoint


def test_a_checkpoint_of_another_task_state_is_refused_with_its_path(tmp_path):
    fit(tmp_path, CPU, Plan(max_epochs=1))
    path = Checkpointer(tmp_path).paths()[-1]
    saved = torch.load(path, weights_only=False)
    saved["extra"]["task"] = {"count": 3}  # what an older ToyTask saved
    torch.save(saved, path)
    with pytest.raises(ValueError, match=f"checkpoint {path}: its task state holds"):
        fit(tmp_path, CPU, Plan(max_epochs=2))


def _records(run_dir):
    """metrics.jsonl without the (timing) training seconds."""
    return [{k: v for k, v in row.items() if k != "train_seconds"} for row in read_metrics(run_dir / "metrics.jsonl")]


def _tensorboard_steps(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), purge_orphaned_data=True)
    events.Reload()
    return [(event.step, round(event.value, 5)) for event in events.Scalars(tag)]


def test_every_step_is_logged_once_after_a_killed_attempt_in_the_file_and_in_tensorboard(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    fit(tmp_path / "whole", CPU, PLAN)
    with pytest.raises(KeyboardInterrupt):
        fit(tmp_path / "cut", CPU, PLAN, interrupt_at=7)
    with open(tmp_path / "cut" / "metrics.jsonl", "a") as f:  # a killed attempt logged past its checkpoint
        f.write(json.dumps({"step": 8, "train/loss": 123.0}) + "\n")
    with SummaryWriter(str(tmp_path / "cut")) as writer:
        writer.add_scalar("train/loss", 123.0, 8)
    fit(tmp_path / "cut", CPU, PLAN)
    whole = _records(tmp_path / "whole")
    assert _records(tmp_path / "cut") == whole and whole[0] == {"step": 0, "init/weight_norm": whole[0]["init/weight_norm"]}
    assert _tensorboard_steps(tmp_path / "cut", "train/loss") == _tensorboard_steps(tmp_path / "whole", "train/loss")
    # killed before its first checkpoint: the rerun starts afresh and keeps none of its records
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "metrics.jsonl").write_text(json.dumps({"step": 0, "init/weight_norm": 9.0}) + "\n"
                                                      + json.dumps({"step": 2, "train/loss": 123.0}) + "\n")
    fit(tmp_path / "fresh", CPU, PLAN)
    assert _records(tmp_path / "fresh") == whole


def test_ctrl_c_in_the_last_update_of_the_budget_resumes_to_the_end(tmp_path, capsys):
    plan = Plan(max_epochs=10, max_updates=7, eval_every=3)
    whole, whole_state = fit(tmp_path / "whole", CPU, plan)
    with pytest.raises(KeyboardInterrupt):
        fit(tmp_path / "cut", CPU, plan, interrupt_at=7)
    resumed, state = fit(tmp_path / "cut", CPU, plan)
    assert state.step == 7 and state.history == whole_state.history  # no update past the budget
    assert _same_weights(resumed.model.state_dict(), whole.model.state_dict())


def test_patience_stops_and_keeps_the_best(tmp_path):
    task, state = fit(tmp_path, CPU, Plan(max_epochs=50, patience=2))
    scores = [row["dev/mse"] for row in state.history]
    assert state.done and state.epoch < 50 and len(scores) == state.epoch
    best = min(range(len(scores)), key=scores.__getitem__)
    assert state.best == -scores[best] and state.best_step == (best + 1) * PER_EPOCH
    assert state.bad == 2 and len(scores) == best + 3  # two evaluations without improvement, then the stop
    assert all(row["epoch"] == i + 1 and "train/loss" in row for i, row in enumerate(state.history))


def test_every_run_evaluates_its_last_update_and_stops_at_the_update_budget(tmp_path):
    _, state = fit(tmp_path, CPU, Plan(max_epochs=10, max_updates=7, eval_every=3))
    assert state.step == 7 and [row["step"] for row in state.history] == [3, 6, 7]
    assert state.history[-1]["epoch"] == 2  # update 7 is the second epoch's second


def test_ctrl_c_exits_130_with_the_hint(tmp_path, capsys):
    main = console.interruptible(lambda: fit(tmp_path, CPU, PLAN, interrupt_at=2) and 0)
    assert main() == console.INTERRUPTED == 130
    err = capsys.readouterr().err
    assert "update 2 saved to" in err and "re-run the same command to resume" in err


def test_a_second_ctrl_c_stops_inside_the_update_and_says_where_the_rerun_resumes(tmp_path, capsys):
    with pytest.raises(console.InterruptedMidway):
        fit(tmp_path, CPU, PLAN, interrupt_at=5, ctrl_c=2)  # update 3 was checkpointed (checkpoint_every=3)
    assert "stopped inside update 5: the rerun resumes from update 3" in capsys.readouterr().err
    assert [path.name for path in Checkpointer(tmp_path).paths()] == ["step_3.pt"]  # no half update saved


def test_an_epoch_without_an_update_is_refused(tmp_path):
    with pytest.raises(ValueError, match="an epoch would make no update: .*lower the batch size"):
        fit(tmp_path, CPU, PLAN, batch=EXAMPLES + 1)


@pytest.mark.parametrize("plan, total, bound", [
    (Plan(max_epochs=3), 3 * PER_EPOCH, None),
    (Plan(max_epochs=3, max_updates=7), 7, None),
    (Plan(max_epochs=30, patience=2), None, 2 * PER_EPOCH),
    (Plan(max_epochs=30, patience=4, eval_every=2), None, 8)])
def test_progress_shows_a_fixed_total_or_the_bound_patience_sets(tmp_path, monkeypatch, capsys, plan, total, bound):
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "0")
    task = ToyTask(0, CPU)
    Engine(CPU, tmp_path, plan, desc="seed 0 update").fit(task)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"seed 0 update 1/{total} ") if total else f"update 1 of at most {bound} " in first


def test_seeds_are_reused_a_changed_config_refused_and_records_written(tmp_path):
    calls = []

    def task(seed, run_dir):
        calls.append(seed)
        assert run_dir == tmp_path / f"seed{seed}"
        return ToyTask(seed, CPU)

    config, plan, line = {"lr": 0.05, "seeds": 2}, Plan(max_epochs=2), lambda r: f"{r['dev']['mse']:.3f}"
    first = train_seeds(tmp_path, config, ["seeds"], [0, 1], CPU, task, plan, line, progress=False)
    assert calls == [0, 1] and json.loads((tmp_path / "seed1.json").read_text()) == first[1]
    assert (tmp_path / "seed1" / "metrics.jsonl").is_file()  # the engine ran under the seed's directory
    again = train_seeds(tmp_path, {**config, "seeds": 3}, ["seeds"], [0, 1, 2], CPU, task,
                        lambda t: Plan(max_epochs=2 + t.seed), line, progress=False)
    assert calls == [0, 1, 2] and again[:2] == first  # seeds 0 and 1 reused, no training
    assert json.loads((tmp_path / "seed2" / "metrics.jsonl").read_text().splitlines()[-1])["epoch"] == 4  # its plan
    assert first[0]["dev"] != first[1]["dev"]  # the seed matters
    with pytest.raises(ValueError, match="lr"):
        train_seeds(tmp_path, {**config, "lr": 0.1}, ["seeds"], [0], CPU, task, plan, line, progress=False)


def test_the_seeds_record_summarises_metric_dicts_and_numbers_over_the_seeds():
    per_seed = [{"seed": 0, "dev": {"acc": 80.0, "f1": 70.0}, "speed": 10, "curve": [1], "train_seconds": 2.5},
                {"seed": 1, "dev": {"acc": 84.0, "f1": 74.0}, "speed": None, "curve": [2], "train_seconds": 1.5}]
    record = seeds_record({"lr": 0.1}, per_seed, ("dev", "speed", "dev_mc"), task="toy")
    assert record["dev"]["acc"] == {"mean": 82.0, "std": pytest.approx(8 ** 0.5), "n": 2}
    assert record["dev"]["f1"]["mean"] == 72.0
    assert record["speed"] == {"mean": 10.0, "std": 0.0, "n": 1}  # a seed without the number is not counted
    assert "dev_mc" not in record and "curve" not in record  # absent, and not asked for
    assert record["train_seconds"] == {"per_seed": [2.5, 1.5], "total": 4.0}
    assert record["per_seed"] == per_seed and record["task"] == "toy" and record["config"] == {"lr": 0.1}


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.5])
def test_the_engine_clips_the_gradient_norm_to_the_tasks_max_grad_norm(tmp_path, max_grad_norm):
    task = ToyTask(0, CPU, dropout=0.0)
    task.clip, task.scheduler, task.max_grad_norm = None, None, max_grad_norm
    task.optimizer = torch.optim.SGD(task.model.parameters(), lr=1.0)  # an update is minus the gradient
    before = [p.detach().clone() for p in task.model.parameters()]
    Engine(CPU, tmp_path, Plan(max_updates=1, max_epochs=1), progress=False).fit(task)
    step = torch.cat([(p.detach() - b).flatten() for p, b in zip(task.model.parameters(), before)]).norm()
    if max_grad_norm:
        assert step.item() == pytest.approx(max_grad_norm, rel=1e-5)
    else:
        assert step.item() > 5  # the toy's first gradient, unclipped


def test_the_state_round_trips_through_a_checkpoint(tmp_path):
    _, state = fit(tmp_path, CPU, Plan(max_epochs=2))
    saved = torch.load(Checkpointer(tmp_path).paths()[-1], weights_only=False)
    assert TrainState(**saved["extra"]["engine"]) == state and state.done


@pytest.mark.parametrize("interrupt_at", [None, PER_EPOCH])  # PER_EPOCH: a Ctrl-C in an epoch's last update
def test_two_gloo_processes_follow_one_process(tmp_path, interrupt_at):
    worker = Path(__file__).with_name("engine_toy.py")
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker),
           str(tmp_path), *([str(interrupt_at)] if interrupt_at else [])]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=False)
    single, state = fit(tmp_path / "one", CPU, Plan(max_epochs=3, log_every=2), dropout=0.0)
    assert ddp["world_size"] == 2
    for name, value in single.model.state_dict().items():
        assert torch.allclose(ddp["state"][name], value, atol=1e-5), name
    assert [r["dev/mse"] for r in ddp["history"]] == pytest.approx([r["dev/mse"] for r in state.history], rel=1e-5)
    losses = [r["train/loss"] for r in state.history]
    if interrupt_at:  # the sums a Ctrl-C saves are the main process's alone: that epoch's mean is its half's
        losses = losses[1:]
        assert f"update {interrupt_at} saved to" in run.stderr and f"resuming from update {interrupt_at}" in run.stderr
    assert [r["train/loss"] for r in ddp["history"]][-len(losses):] == pytest.approx(losses, rel=1e-5)
