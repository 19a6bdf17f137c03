"""benchmarks/idle_cost.py (no timing here): its variants name checkouts, arguments and environments, and a run's
training seconds come from the results file the CLIs write."""
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/idle_cost.py")


def test_a_variant_is_a_checkout_its_arguments_and_environment(bench):
    variant = bench.parse_variant(f"{ROOT}::--threads 2 train.lr=0.1::OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=300000")
    assert variant["checkout"] == str(ROOT) and variant["args"] == ["--threads", "2", "train.lr=0.1"]
    assert variant["env"] == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert variant["commit"] == (head.strip() or None)
    assert bench.parse_variant(str(ROOT)) | {"commit": None} == {"spec": str(ROOT), "checkout": str(ROOT),
                                                                 "commit": None, "args": [], "env": {}}


def test_a_directory_that_is_not_a_checkout_is_refused_with_the_fix(bench, tmp_path):
    with pytest.raises(SystemExit, match=r"not a checkout of this project.*git worktree add"):
        bench.parse_variant(str(tmp_path))


def test_a_run_reports_its_wall_time_and_the_training_seconds_of_its_results(tmp_path):
    busy = load_script("benchmarks/busy_cpu.py")
    (tmp_path / "fake_cli.py").write_text(textwrap.dedent("""
        import json, os, sys
        out = sys.argv[sys.argv.index("--out") + 1]
        os.makedirs(out)
        json.dump({"train_seconds": {"per_seed": [1.5, 2.0], "total": 3.5}, "env": os.environ.get("X")},
                  open(os.path.join(out, "results.json"), "w"))
    """))
    wall, train = busy.run_once(["fake_cli", "--out", "{out}"], {"X": "1"}, "", cwd=str(tmp_path))
    assert train == 3.5 and 0 < wall < 60
    (tmp_path / "fake_cli.py").write_text("import sys\n")  # no results file: no training seconds
    assert busy.run_once(["fake_cli", "--out", "{out}"], {}, "", cwd=str(tmp_path))[1] is None
    (tmp_path / "fake_cli.py").write_text("raise SystemExit(3)\n")
    with pytest.raises(subprocess.CalledProcessError):
        busy.run_once(["fake_cli"], {}, "", cwd=str(tmp_path))
