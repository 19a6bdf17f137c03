"""Translation on the shared runtime: bf16 / fp16 autocast follow fp32, torch.compile trains and
checkpoints the plain model, and a run written on a GPU resumes and evaluates on the CPU."""
import functools

import pytest
import torch

from mt import evaluate

from ..runtime_checks import BF16, assert_follows, rewrite_as_written_on_cuda
from .probes import train_probe


@pytest.mark.parametrize("arch", ["lstm", "transformer"])
def test_bf16_autocast_training_follows_fp32(tiny_root, tmp_path, arch):
    fp32 = train_probe(tiny_root, tmp_path, arch, precision="fp32")
    assert_follows(train_probe(tiny_root, tmp_path, arch, precision="bf16"), fp32, **BF16)


def test_fp16_trains_with_a_gradient_scaler_kept_in_the_checkpoints(tiny_root, tmp_path):
    fp32 = train_probe(tiny_root, tmp_path, "transformer", precision="fp32")
    fp16 = train_probe(tiny_root, tmp_path, "transformer", precision="fp16")
    assert_follows(fp16, fp32, **BF16)
    checkpoint = torch.load(sorted((fp16["out"] / "checkpoints").iterdir())[-1], weights_only=False)
    assert checkpoint["scaler"]["scale"] > 0
    assert "scaler" not in torch.load(sorted((fp32["out"] / "checkpoints").iterdir())[-1], weights_only=False)


def test_compiled_training_saves_the_plain_model(tiny_root, tmp_path, monkeypatch):
    # dynamo traces our model code; the eager backend skips inductor's minutes of C++ compilation
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    run = train_probe(tiny_root, tmp_path, "transformer", steps=2, extra=["train.compile=true"])
    checkpoint = torch.load(sorted((run["out"] / "checkpoints").iterdir())[-1], weights_only=False)
    assert not any(name.startswith("_orig_mod") for name in checkpoint["model"])
    assert torch.isfinite(torch.tensor(run["losses"])).all() and len(run["losses"]) == 2


def test_a_run_written_on_a_gpu_resumes_and_evaluates_on_the_cpu(tiny_root, tmp_path, capsys):
    whole = train_probe(tiny_root, tmp_path / "whole", "lstm", steps=6, extra=["train.eval_every=3"])
    half = train_probe(tiny_root, tmp_path / "half", "lstm", steps=3, extra=["train.eval_every=3"])
    assert rewrite_as_written_on_cuda(half["out"]) == 2  # best.pt and checkpoints/step_3.pt
    resumed = train_probe(tiny_root, tmp_path / "half", "lstm", steps=6, extra=["train.eval_every=3"])
    assert "resuming" in capsys.readouterr().err
    assert resumed["losses"] == whole["losses"] and resumed["eval"] == whole["eval"]
    rewrite_as_written_on_cuda(resumed["out"])
    assert evaluate.main([str(resumed["out"]), "--split", "val", "--beam", "1", "--data-root", str(tiny_root),
                          "--device", "cpu"]) == 0


def test_a_time_budget_stops_training_and_still_evaluates(tiny_root, tmp_path):
    """train.max_minutes (the GPU suite's timed runs): past the budget the run stops at the next log
    window, validates its last update and writes the results."""
    run = train_probe(tiny_root, tmp_path, "transformer", steps=50, extra=["train.max_minutes=1e-9"])
    assert len(run["losses"]) == 1  # one log window (log_every=1), then out of time
    assert run["eval"] > 0 and (run["out"] / "best.pt").is_file() and (run["out"] / "results.json").is_file()
