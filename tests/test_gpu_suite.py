"""benchmarks/gpu_suite.py's runner: parts in order, each time-boxed; after every part the JSON and the
Markdown summary hold everything so far (a failed, a timed-out and a skipped part included)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import gpu_suite  # noqa: E402

PY = sys.executable


def test_parts_run_in_order_within_their_time_boxes(tmp_path):
    write = ("import json, os, pathlib; pathlib.Path(os.environ['OUT_FILE']).write_text("
             "json.dumps({'train': {'wall_time_vs_softmax_fp32': 0.42, 'note': 'x'}}))")
    parts = [
        gpu_suite.Part("quick", "writes a result", 30, [[PY, "-c", write]], ["quick.json"],
                       env={"OUT_FILE": str(tmp_path / "quick.json")}),
        gpu_suite.Part("broken", "fails", 30, [[PY, "-c", "print('boom'); raise SystemExit(3)"]]),
        gpu_suite.Part("pair", "two side by side", 30, [[PY, "-c", "pass"], [PY, "-c", "pass"]]),
        gpu_suite.Part("slow", "outlives its box", 3, [[PY, "-c", "import time; time.sleep(60)"]]),
        gpu_suite.Part("late", "no time left", 30, [[PY, "-c", "pass"]]),
    ]
    seen = []

    def on_record(name, record):
        seen.append(name)
        on_disk = json.loads((tmp_path / "suite.json").read_text())
        assert set(on_disk["parts"]) == set(seen)  # written after every part

    # 12.5 s in all: after the 3 s box of "slow" fewer than 10 s are left, too few to start "late"
    suite = gpu_suite.run_suite(parts, tmp_path, budget_s=12.5, on_record=on_record)
    status = {name: record["status"] for name, record in suite["parts"].items()}
    assert status == {"quick": "ok", "broken": "failed", "pair": "ok", "slow": "timed out", "late": "skipped"}
    assert suite["parts"]["slow"]["seconds"] < 8 and suite["parts"]["broken"]["exit_codes"] == [3]
    assert suite["parts"]["pair"]["exit_codes"] == [0, 0]
    assert suite["parts"]["quick"]["results"]["quick.json"]["train"]["wall_time_vs_softmax_fp32"] == 0.42
    summary = (tmp_path / "summary.md").read_text()
    assert "| slow | timed out |" in summary and "boom" in summary
    assert "train.wall_time_vs_softmax_fp32: 0.42" in summary and "note" not in summary
    assert suite["environment"]["python"]


def test_the_suite_names_every_part_and_needs_the_data_root(monkeypatch, capsys):
    names = [p.name for p in gpu_suite.parts(Path("/tmp/out"), "/data", 2.0)]
    assert names == ["dense-bam", "mcan", "gat", "lxmert", "gpu-tests", "mcan-compiled", "gat-large", "mt-throughput",
                     "mt-convergence"]
    monkeypatch.delenv("ATTN_DATA_ROOT", raising=False)
    with pytest.raises(SystemExit):
        gpu_suite.main(["--out", "/tmp/out"])
    assert "--data-root" in capsys.readouterr().err


def test_the_default_budget_runs_the_headline_parts_in_full_and_block_takes_its_arguments():
    parts = gpu_suite.parts(Path("/tmp/out"), "/data", 2.0)
    headline = parts[:4]  # dense BAM, MCAN, GAT on Cora, LXMERT
    assert sum(p.seconds for p in headline) + 60 <= 60 * gpu_suite.BUDGET_MINUTES  # a minute left for the tests
    from benchmarks import block

    command = parts[0].commands[0]
    assert command[1].endswith("block.py")
    args = block.build_parser().parse_args(command[2:])
    assert args.only == "bam" and args.padding == ["none", "random"] and args.dtypes[0] == "bf16"
    assert args.lengths[:2] == [4096, 16384] and args.head_dims == [64, 128]


def test_the_summary_gives_a_line_per_dense_bam_row():
    rows = {"bam_vs_baseline": [{"summary": f"row {i}", "time_ratio": 1.5, "methods": {"x": {"ms": 1.0}}}
                                for i in range(30)], "tf32_matmul": False, "peak_mb": 3.0}
    assert gpu_suite.headline_numbers(rows) == [f"row {i}" for i in range(30)] + ["peak_mb: 3"]
