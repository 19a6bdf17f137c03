"""What ``mt.train`` prints with its output piped, a run that stops between validations, Ctrl-C."""
import json
import os
import signal

from common.utils import console, read_metrics
from mt import train

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
    assert stdout[0].startswith("lstm-cpu on multi30k: test_2016_flickr BLEU ")
    assert "4 updates in 1 epoch(s)" in stdout[0]
    assert stdout[1] == "files written:"
    assert {os.path.basename(line.strip().rstrip("/")) for line in stdout[2:]} == {
        "results.json", "curves.png", "best.pt", "checkpoints", "metrics.jsonl", "config.json", "val.hyp.txt",
        "test_2016_flickr.hyp.txt"}


def test_ctrl_c_exits_130_with_a_resume_hint_and_the_rerun_resumes(tiny_root, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "3600")
    log_window = train.Trainer._log_window

    def interrupt_at_update_5(self, *a, **k):
        log_window(self, *a, **k)
        if self.progress["step"] == 5:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(train.Trainer, "_log_window", interrupt_at_update_5)
    command = args(tiny_root, tmp_path, out, 6) + ["train.progress=true"]
    assert train.main(command) == 130
    err = capsys.readouterr().err
    assert err.rstrip().endswith("interrupted at epoch 1 update 5/6; re-run the same command to resume")
    assert not (out / "results.json").exists()
    monkeypatch.undo()
    assert train.main(command) == 0
    captured = capsys.readouterr()
    assert "resuming" in captured.err and "from update 3" in captured.err
    assert json.loads((out / "results.json").read_text())["updates"] == 6
