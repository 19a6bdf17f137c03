"""``captioning.train`` with its output piped: a line per epoch, the summary and the files written."""
import json

from captioning import train, training


def test_piped_run_prints_epoch_lines_summary_and_files(coco_fixture, tiny_overrides, tmp_path, capsys):
    out = tmp_path / "run"
    overrides = [a for a in tiny_overrides(coco_fixture["root"], out) if not a.startswith(("data_root", "out_dir"))]
    argv = ["--attention", "softmax", "--data-root", str(coco_fixture["root"]), "--out", str(out), "train.epochs=2",
            "eval.every=1", "eval.metrics=[cider]", *overrides]
    assert train.main(argv) == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert [line.split(":")[0] for line in err if line.startswith("epoch ") and ": train nll" in line] == \
        ["epoch 1/2", "epoch 2/2"]
    assert "\r" not in captured.err
    stdout = captured.out.splitlines()
    assert stdout[0].startswith("softmax: best val (epoch ") and "of 2) CIDEr" in stdout[0]
    assert stdout[1:] == ["files written:", f"  {out / 'results.json'}", f"  {out / 'best.pt'}",
                          f"  {out / 'checkpoints'}/", f"  {out / 'metrics.jsonl'}", f"  {out / 'config.json'}"]
    assert json.loads((out / "results.json").read_text())["train_seconds"] > 0


def test_ctrl_c_exits_130_with_a_resume_hint_and_the_rerun_resumes(coco_fixture, tiny_overrides, tmp_path, capsys,
                                                                   monkeypatch, ctrl_c_on_call):
    from common.utils import console

    out = tmp_path / "run"
    overrides = [a for a in tiny_overrides(coco_fixture["root"], out) if not a.startswith(("data_root", "out_dir"))]
    argv = ["--attention", "softmax", "--data-root", str(coco_fixture["root"]), "--out", str(out), "train.epochs=2",
            "eval.every=0", "eval.metrics=[cider]", *overrides]
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "3600")
    # 20 images x 5 captions / batches of 5 images: 4 batches an epoch; the 6th is epoch 2's second
    restore = ctrl_c_on_call(training, "caption_nll", 6)
    assert train.main(argv) == 130
    err = capsys.readouterr().err
    assert err.rstrip().endswith("interrupted at update 6/8; re-run the same command to resume")
    assert f"softmax: update 6 saved to {out / 'checkpoints' / 'step_6.pt'}" in err.splitlines()
    assert (out / "checkpoints" / "step_4.pt").is_file() and not (out / "results.json").exists()
    restore()
    assert train.main(argv) == 0
    assert "softmax: resuming from update 6 (epoch 2)" in capsys.readouterr().err.splitlines()
    history = json.loads((out / "results.json").read_text())["history"]
    assert [row["epoch"] for row in history] == [0, 1]  # epoch 1 from the checkpoint, epoch 2 from its 3rd update
