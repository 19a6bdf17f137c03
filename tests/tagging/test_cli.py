"""The command lines: one-line errors with exit status 2, and train then evaluate on a tiny written treebank."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tagging import train

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.word_dim=16", "model.char_dim=8", "model.layers=2", "model.heads=2", "data.max_len=12",
        "train.batch_size=4", "train.max_epochs=2", "train.curve_every=4"]


def cli(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("ATTN_DATA_ROOT", None)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_an_unknown_variant_exits_2_with_one_error_line():
    done = cli("tagging.train", "--variant", "nope")
    assert done.returncode == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors == ["python -m tagging.train: error: argument --variant: invalid choice: 'nope' (choose from "
                      "'pe-add', 'pe-con', 'p', 'r', 'pr', 'temp', 'conv1d', 'conv2d')"]
    assert done.stderr.splitlines()[-1] == errors[0]


def test_an_unknown_treebank_exits_2_naming_it_and_writes_nothing(tmp_path, capsys):
    """In this process (``main`` is what ``python -m tagging.train`` runs; torch is already imported here)."""
    (tmp_path / "ud" / "UD_Toy-Tiny").mkdir(parents=True)
    code = train.main(["--treebank", "NoSuch", "--data-root", str(tmp_path), "--out", str(tmp_path / "run"),
                       "--threads", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"error: treebank 'NoSuch' not found under {tmp_path / 'ud'} or {tmp_path}; "
                          f"treebanks there: UD_Toy-Tiny. ")
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()


def test_evaluate_without_checkpoints_exits_2(tmp_path):
    done = cli("tagging.evaluate", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr == (f"error: {tmp_path}: no seed<k>/best.pt; pass a tagging.train output directory or a "
                           f"best.pt\n")


def test_train_then_evaluate_reproduces_the_test_accuracy(tiny_treebank, tmp_path):
    out = tmp_path / "run"
    done = cli("tagging.train", "--treebank", str(tiny_treebank), "--data-root", str(tmp_path), "--out", str(out),
               "--seeds", "1", "--variant", "pr", "--threads", "1", "--no-progress", *TINY)
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    (seed,) = results["per_seed"]
    assert results["treebank"] == "UD_Toy-Tiny" and results["label"] == "SAN+P+R" and seed["epochs"] == 2
    assert done.stdout.startswith(f"UD_Toy-Tiny SAN+P+R: test accuracy {seed['test']['all']:.2f} +- 0.00 (OOV ")
    listed = done.stdout.split("files written:\n", 1)[1].split()
    assert sorted(Path(name).name for name in listed) == sorted(path.name for path in out.iterdir())  # every file

    done = cli("tagging.evaluate", str(out), "--threads", "1")
    assert done.returncode == 0, done.stderr
    evaluation = json.loads((out / "evaluation-UD_Toy-Tiny-test.json").read_text())
    (scored,) = evaluation["per_seed"]
    assert scored["seed"] == 0 and scored["checkpoint"] == str(out / "seed0" / "best.pt")
    for key in ("all", "oov", "ambiguous", "words", "oov_words", "ambiguous_words"):
        assert scored[key] == seed["test"][key], key
    assert evaluation["all"]["mean"] == seed["test"]["all"] and evaluation["treebank"] == "UD_Toy-Tiny"
    assert evaluation["config"] == {"split": "test", "mc_samples": 0}
    assert f"seed 0: UD_Toy-Tiny test accuracy {seed['test']['all']:.2f}" in done.stdout


def test_demo_trains_on_its_own_toy_treebank_without_any_data(tmp_path):
    out = tmp_path / "demo"
    done = cli("tagging.train", "--demo", "--seeds", "1", "--out", str(out), "--threads", "1", "--no-progress", *TINY)
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in (out / "data" / "ud" / "UD_Demo-Toy").iterdir())
    assert files == ["xx_tiny-ud-dev.conllu.gz", "xx_tiny-ud-test.conllu.gz", "xx_tiny-ud-train.conllu.gz"]
    record = json.loads((out / "results.json").read_text())
    assert record["treebank"] == "UD_Demo-Toy" and record["counts"]["train"]["sentences"] == 300
    assert record["test"]["all"]["mean"] > 80  # the toy grammar is learnt within two epochs
    refused = cli("tagging.train", "--demo", "--data-root", str(tmp_path), "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "--demo writes its synthetic data to <out>/data" in refused.stderr
