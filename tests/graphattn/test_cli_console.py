"""``graphattn.train`` with its output piped: per-seed lines, the summary, Ctrl-C and the resume."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def train_command(data_root, out, *extra):
    return [sys.executable, "-m", "graphattn.train", "--dataset", "Cora", "--seeds", "2", "--data-root",
            str(data_root), "--out", str(out), "train.num_threads=1", *extra]


def environment():
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ATTN_PROGRESS_SECONDS": "0"}


@pytest.mark.realdata
def test_sigint_stops_with_a_resume_hint_and_the_same_command_resumes(attn_data_root, tmp_path):
    out = tmp_path / "run"
    command = train_command(attn_data_root, out, "train.max_epochs=30", "train.patience=100")
    proc = subprocess.Popen(command, cwd=tmp_path, env=environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    err = []
    for line in proc.stderr:  # piped: plain progress lines, one per epoch here
        err.append(line)
        if line.startswith("seed 1 update 2 of at most 30 "):
            proc.send_signal(signal.SIGINT)
            break
    rest_out, rest_err = proc.communicate(timeout=120)
    err = "".join(err) + rest_err
    assert proc.returncode == 130, err
    assert "\r" not in err and "Traceback" not in err
    assert "seed 0 update 30 of at most 30 | " in err  # an update per epoch on the whole graph
    assert "interrupted at Cora softmax seeds 1/2, seed 1 update" in err
    assert err.rstrip().endswith("re-run the same command to resume")
    saved = re.search(r"seed 1: update (\d+) saved to ", err)
    assert saved and (out / "seed0.pt").is_file() and not (out / "seed1.pt").exists()

    done = subprocess.run(command, cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "seed 0: done before (test acc" in done.stderr  # reused
    assert f"seed 1: resuming from update {saved[1]} " in done.stderr and "seed 1: done (test acc" in done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Cora softmax: test accuracy") and "over 2 seeds" in lines[0]
    assert lines[1] == "files written:"
    assert {Path(line.strip()).name for line in lines[2:]} == {
        "results.json", "curves.png", "accuracy.png", "config.json", "seed0.pt", "seed1.pt", "seed0.json",
        "seed1.json", "seed0", "seed1"}
    assert {path.name for path in out.iterdir()} == {Path(line.strip()).name for line in lines[2:]}  # all of them
    results = json.loads((out / "results.json").read_text())
    first = results["train_seconds"]["per_seed"][0]
    assert first > 0 and results["train_seconds"]["total"] >= first  # seed 0 keeps its original time


@pytest.mark.realdata
def test_evaluate_writes_its_report_and_reliability_diagram_into_the_run_and_explains_them(
        attn_data_root, tmp_path, capsys):
    from graphattn import evaluate, train

    out = tmp_path / "run"
    assert train.main(["--dataset", "Cora", "--seeds", "2", "--data-root", str(attn_data_root), "--out", str(out),
                       "train.max_epochs=5", "train.num_threads=1"]) == 0
    capsys.readouterr()
    assert evaluate.main([str(out), "--mc-samples", "3", "--threads", "1"]) == 0
    printed = capsys.readouterr().out.splitlines()
    report, figure = out / "evaluation_mc3.json", out / "evaluation_mc3_reliability.png"
    assert printed[-3:] == ["files written:", f"  {report}", f"  {figure}"]
    assert printed[0].startswith("mean +- std over checkpoints: test_acc ")
    assert printed[1].startswith("ECE ") and "mean confidence of the MC-mean (3 samples) predictions" in printed[1]
    assert "above 0.973 nats" in printed[2] and "PAvPU(entropy) is the error rate" in printed[2]
    assert "MC dropout keeps the training dropout on (p = 0.6 here)" in printed[3]
    evaluated = json.loads(report.read_text())
    assert evaluated["reliability"]["figure"] == str(figure) and figure.read_bytes()[:4] == b"\x89PNG"
    assert sum(evaluated["reliability"]["bins"]["count"]) == 2 * 1000  # Cora's 1000 test nodes, per seed
    for entry in evaluated["checkpoints"]:
        assert entry["mc"]["entropy_threshold"] == pytest.approx(0.5 * __import__("math").log(7))
        assert 0 <= entry["mc"]["uncertain_entropy"] <= 1

    # one checkpoint, eval mode: its own report name
    assert evaluate.main([str(out / "seed1.pt"), "--threads", "1"]) == 0
    assert (out / "evaluation_seed1.json").is_file() and (out / "evaluation_seed1_reliability.png").is_file()
    capsys.readouterr()
    # the run's results.json is not a checkpoint: a one-line error pointing at the run directory
    assert evaluate.main([str(out / "results.json")]) == 2
    assert capsys.readouterr().err == (f"error: {out / 'results.json'} is not a checkpoint: pass a seed<k>.pt "
                                       f"checkpoint or the python -m graphattn.train output directory ({out})\n")


@pytest.mark.realdata
def test_early_stopping_progress_counts_epochs_to_a_bound_with_the_patience_left(attn_data_root, tmp_path, capsys,
                                                                                  monkeypatch):
    from graphattn import train

    monkeypatch.setenv("ATTN_PROGRESS_SECONDS", "0")
    args = ["--dataset", "Cora", "--data-root", str(attn_data_root), "--out", str(tmp_path / "run"),
            "train.max_epochs=60", "train.patience=3", "train.num_threads=1"]
    assert train.main([*args, "--seeds", "1"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("seed 0 update ")]
    pattern = re.compile(r"seed 0 update (\d+) of at most (\d+) \| \d\d:\d\d elapsed \| [\d.]+ (s/update|update/s)"
                         r"( \| val_acc ([\d.]+), best_val_acc ([\d.]+), patience_left (\d)/3)?$")
    matches = [pattern.match(line) for line in lines]
    assert lines and all(matches), lines  # no percentage, no ETA: the end is not known
    assert [int(m[1]) for m in matches] == list(range(1, len(lines) + 1))  # an update per epoch
    # each line shows the evaluations of the epochs before it: none on the first
    assert matches[0][4] is None and int(matches[0][2]) == 3 and all(m[4] for m in matches[1:])
    assert all(float(m[6]) >= float(m[5]) and 1 <= int(m[7]) <= 3 for m in matches[1:])  # best is of the same metric
    assert all(int(m[2]) == min(60, int(m[1]) - 1 + int(m[7])) for m in matches[1:])  # where patience runs out

    assert train.main([*args, "--seeds", "2"]) == 0  # seed 0 reused: it gives the seeds bar no ETA
    seeds = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Cora softmax seeds")]
    assert seeds[0].startswith("Cora softmax seeds 1/2 | 50% | ") and "ETA" not in seeds[0]
    assert seeds[1].startswith("Cora softmax seeds 2/2 | 100% | ") and seeds[1].endswith("ETA 00:00")
