"""Metrics go to JSONL and TensorBoard; a resumed run appends, after dropping what a killed attempt logged past
its checkpoint."""
import math

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.utils.logger import MetricsLogger, read_metrics


def test_jsonl_and_tensorboard_receive_every_scalar(tmp_path):
    with MetricsLogger(tmp_path) as log:
        log.log(0, loss=1.5, kl=torch.tensor(0.25))
        log.log(1, loss=0.5, bad=math.nan)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records == [{"step": 0, "loss": 1.5, "kl": 0.25}, {"step": 1, "loss": 0.5, "bad": "nan"}]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 1.5), (1, 0.5)]
    assert [e.value for e in events.Scalars("kl")] == [0.25]


def test_resumed_run_appends_and_disabled_logger_writes_nothing(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        log.log(0, loss=2.0)
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        log.log(1, loss=1.0)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", "loss")] == [0, 1]
    with MetricsLogger(tmp_path / "other", enabled=False) as log:
        log.log(0, loss=1.0)
    assert not (tmp_path / "other").exists()


def test_a_resume_keeps_the_records_up_to_its_step_and_a_fresh_start_none(tmp_path):
    with MetricsLogger(tmp_path) as log:  # a killed attempt: checkpoint at step 2, logged up to 3
        for step in range(4):
            log.log(step, loss=float(step))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "lo')  # killed while writing a line
    with MetricsLogger(tmp_path, resume=2) as log:
        log.log(3, loss=30.0)
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]
    events = EventAccumulator(str(tmp_path), purge_orphaned_data=True)
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]
    with MetricsLogger(tmp_path, resume=0) as log:  # no checkpoint: nothing of before is kept
        log.log(0, loss=5.0)
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 0, "loss": 5.0}]
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 5.0)]
