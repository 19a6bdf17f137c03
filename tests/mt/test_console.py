"""What ``mt.train`` prints with its output piped, a run that stops between validations, Ctrl-C."""
import json
import os
import signal

import torch

from common.utils import console, read_metrics
from mt import train, training

from .test_cli import TINY


def args(tiny_root, tmp_path, out, steps):
    return ["--preset", "lstm-cpu", "--out", str(out), "--data-root", str(tiny_root),
            f"prepared_dir={tmp_path / 'prep'}", f"train.max_steps={steps}", *TINY]


def test_a_run_stopping_between_validations_validates_its_last_update(tiny_root, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(args(tiny_root, tmp_path, out, 4)) == 0  # eval_every=3: validations at 3 and 4
    captured = capsys.readouterr()
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "val/bleu")] == [3, 4]
    assert (out / "best.pt").is_file() and (out / "checkpoints" / "step_4.pt").is_file()
    results = json.loads((out / "results.json").read_text())
    # one numbering everywhere: the bar's "epoch 1", the validation lines and results.json
    assert results["updates"] == 4 and results["epochs"] == 1 and results["complete_epochs"] == 0
    assert "update 4 epoch 1: val ppl" in captured.err
    stdout = captured.out.splitlines()
    assert stdout[0].startswith("lstm-cpu on Multi30k de-en: test_2016_flickr BLEU ")
    assert "4 updates in 1 epoch(s)" in stdout[0]
    assert stdout[1] == "files written:"
    assert {os.path.basename(line.strip().rstrip("/")) for line in stdout[2:]} == {
        "results.json", "curves.png", "best.pt", "checkpoints", "metrics.jsonl", "config.json", "val.hyp.txt",
        "test_2016_flickr.hyp.txt"}


def interrupt_at(monkeypatch, step, signals=1):
    """Send ``signals`` SIGINTs while update ``step`` logs (inside the update, so the first one is held)."""
    window_values = training.TranslationTask.window_values

    def log_and_interrupt(self, sums, updates, state):
        values = window_values(self, sums, updates, state)
        if state.step == step:
            for _ in range(signals):
                os.kill(os.getpid(), signal.SIGINT)
        return values

    monkeypatch.setattr(training.TranslationTask, "window_values", log_and_interrupt)


def history(out):
    """Every logged value but the timings, per update."""
    timings = {"tokens_per_second", "train_seconds", "val_seconds"}
    return [{k: v for k, v in m.items() if k not in timings} for m in read_metrics(out / "metrics.jsonl")]


def test_ctrl_c_checkpoints_the_current_update_and_the_rerun_equals_a_run_never_interrupted(
        tiny_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "3600")
    # 13 updates over two epochs of 10 batches, validations at 3, 6, 9, 12 and 13; dropout and BAM sampling draw
    # random numbers, so an exact match needs the generators' states too
    extra = ["train.progress=true", "model.normalizer=bam-wc", "kl.weight=0.5"]
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert train.main(args(tiny_root, tmp_path, straight, 13) + extra) == 0
    command = args(tiny_root, tmp_path, out, 13) + extra
    interrupt_at(monkeypatch, 5)
    assert train.main(command) == 130
    err = capsys.readouterr().err
    assert err.rstrip().endswith("interrupted at update 5/13; re-run the same command to resume")
    assert f"update 5 saved to {out / 'checkpoints' / 'step_5.pt'}" in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_3.pt", "step_5.pt"]
    assert not (out / "results.json").exists()
    monkeypatch.undo()
    assert train.main(command) == 0
    assert "lstm-cpu on Multi30k de-en: resuming from update 5 (epoch 1)" in capsys.readouterr().err
    assert history(out) == history(straight)
    # the Ctrl-C checkpoint went with the next one: the same checkpoints as the straight run, the same weights
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_12.pt", "step_13.pt", "step_9.pt"]
    a, b = (torch.load(run / "checkpoints/step_13.pt", weights_only=False) for run in (straight, out))
    for name in a["model"]:
        torch.testing.assert_close(a["model"][name], b["model"][name], rtol=0, atol=0)
    torch.testing.assert_close(a["optimizer"]["state"], b["optimizer"]["state"], rtol=0, atol=0)
    assert json.loads((out / "results.json").read_text())["updates"] == 13


def test_a_second_ctrl_c_stops_inside_the_update_and_the_rerun_resumes_from_the_checkpoint_before(
        tiny_root, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    command = args(tiny_root, tmp_path, out, 6)
    interrupt_at(monkeypatch, 5, signals=2)
    assert train.main(command) == 130
    assert "stopped inside update 5: the rerun resumes from update 3" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_3.pt"]
    monkeypatch.undo()
    assert train.main(command) == 0
    assert "from update 3" in capsys.readouterr().err
