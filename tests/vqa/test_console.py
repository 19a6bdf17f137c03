"""``vqa.train`` with its output piped: a line per epoch, the summary and the files written; Ctrl-C."""
import json
import re

from vqa import train as vqa_train
from vqa import training as vqa_training

from .test_cli import SMALL


def test_piped_run_prints_epoch_lines_summary_and_files(vqa_fixture, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--data-root", str(vqa_fixture.root), "--out", str(out), "--attention", "softmax", *SMALL]
    assert vqa_train.main([*args, "--epochs", "1"]) == 0
    assert vqa_train.main([*args, "--epochs", "2"]) == 0  # resumes after epoch 1
    captured = capsys.readouterr()
    assert "epoch 1/1: train BCE/question" in captured.err and "epoch 2/2: train BCE/question" in captured.err
    assert "\r" not in captured.err
    last = captured.out.splitlines()[-9:]
    assert last[0].startswith("MCAN softmax: 2 epochs, ")
    assert re.search(r", val accuracy [\d.]+ \(yes/no [\d.]+, number [\d.]+, other [\d.]+\)$", last[0]), last[0]
    assert last[1] == "files written:" and last[2] == f"  {out / 'results.json'}"
    assert last[-1] == f"  {out / 'val_predictions.json'}"
    results = json.loads((out / "results.json").read_text())
    assert results["train_seconds"] == sum(epoch["seconds"] for epoch in results["epochs"]) > 0


def test_ctrl_c_exits_130_with_a_resume_hint_and_the_rerun_resumes(vqa_fixture, tmp_path, capsys, monkeypatch,
                                                                   ctrl_c_on_call):
    from common.utils import console

    out = tmp_path / "run"
    argv = ["--data-root", str(vqa_fixture.root), "--out", str(out), "--attention", "softmax", "--epochs", "2", *SMALL]
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "3600")
    # 50 questions / batches of 10: 5 updates an epoch; a Ctrl-C in update 7 lets it end, saves it and stops
    restore = ctrl_c_on_call(vqa_training.MCANTask, "train_step", 7)
    assert vqa_train.main(argv) == 130
    err = capsys.readouterr().err
    assert err.rstrip().endswith("interrupted at MCAN update 7/10; re-run the same command to resume")
    assert f"MCAN: update 7 saved to {out / 'checkpoints' / 'step_7.pt'}" in err.splitlines()
    assert "epoch 1/2: train BCE/question" in err and "epoch 2/2: train BCE/question" not in err
    assert {p.name for p in (out / "checkpoints").glob("*.pt")} == {"step_5.pt", "step_7.pt"}
    assert not (out / "results.json").exists()
    restore()
    assert vqa_train.main(argv) == 0
    err = capsys.readouterr().err
    assert "MCAN: resuming from update 7 (epoch 2)" in err.splitlines()
    assert "epoch 2/2: train BCE/question" in err and "epoch 1/2:" not in err  # epoch 1 from its checkpoint
    assert [row["epoch"] for row in json.loads((out / "results.json").read_text())["epochs"]] == [0, 1]
    # the Ctrl-C checkpoint goes once the next is written: those of a run that never stopped are left
    assert {p.name for p in (out / "checkpoints").glob("*.pt")} == {"step_5.pt", "step_10.pt"}
