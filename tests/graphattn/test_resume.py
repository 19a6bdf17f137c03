"""A GAT seed stopped by Ctrl-C and run again follows the uninterrupted run exactly: the same snapshot, metrics,
per-epoch history and curves, stopped after the snapshot was taken (with sampled batches: inside an epoch)."""
import pytest
import torch

from common.utils import read_metrics
from graphattn import training
from graphattn.config import load_config
from graphattn.fixtures import demo_graph

from .test_minibatch import NEEDS_SAMPLER

NEIGHBOR = ("loader.kind=neighbor", "loader.batch_size=32", "loader.num_neighbors=[5,5]")  # 4 updates an epoch


def train(out, extra):
    cfg = load_config("demo", "bam-wc", [f"out_dir={out}", "seeds=1", "train.max_epochs=60", "train.patience=4",
                                         "optim.lr=0.02", "kl.weight=0.1", "train.num_threads=1", *extra])
    return training.run(cfg, progress=False, data=demo_graph())


@pytest.mark.parametrize("extra", [(), pytest.param(NEIGHBOR, marks=NEEDS_SAMPLER)], ids=["full-batch", "neighbor"])
def test_ctrl_c_after_the_snapshot_then_rerun_follows_the_uninterrupted_run(tmp_path, ctrl_c_on_call, extra):
    whole = train(tmp_path / "whole", extra)
    a = torch.load(tmp_path / "whole" / "seed0.pt", weights_only=False)
    per_epoch = a["history"][0]["step"]
    interrupt_at = (a["metrics"]["best_epoch"] + 1) * per_epoch + 2  # the snapshot is taken: it must come back
    assert interrupt_at < a["history"][-1]["step"]
    restore = ctrl_c_on_call(training.GATTask, "train_step", interrupt_at)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "cut", extra)
    restore()
    assert not (tmp_path / "cut" / "seed0.pt").exists()
    resumed = train(tmp_path / "cut", extra)
    assert resumed["test_acc"] == whole["test_acc"] and resumed["epochs"] == whole["epochs"]
    b = torch.load(tmp_path / "cut" / "seed0.pt", weights_only=False)
    assert a["history"] == b["history"]
    timing = {"train_seconds"}
    assert {k: v for k, v in a["metrics"].items() if k not in timing} == \
        {k: v for k, v in b["metrics"].items() if k not in timing}
    assert all(torch.equal(a["model_state"][name], b["model_state"][name]) for name in a["model_state"])
    curves = [read_metrics(tmp_path / run / "seed0" / "metrics.jsonl") for run in ("whole", "cut")]
    assert curves[0] == curves[1]
