"""Metrics go to JSONL and TensorBoard; a resumed run appends."""
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
