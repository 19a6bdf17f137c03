"""scripts/reproduce_glue_table.py: the grid's cells (seed by seed, finished ones skipped) and the table from
finished runs, with paired differences over the seeds both rows have."""
import importlib.util
import json
from pathlib import Path

import pytest
from scipy import stats

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reproduce_glue_table.py"


@pytest.fixture(scope="module")
def table_script():
    spec = importlib.util.spec_from_file_location("reproduce_glue_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(out: Path, task: str, row: str, seed: int, accuracy: float, f1: float) -> None:
    directory = out / task / row / f"seed{seed}"
    directory.mkdir(parents=True)
    per_seed = {"seed": seed, "dev": {"accuracy": accuracy, "f1": f1}, "train_seconds": 10.0}
    (directory / "results.json").write_text(json.dumps({"task": task, "model": "/m/all-MiniLM-L6-v2",
                                                        "per_seed": [per_seed]}))


def test_cells_run_seed_by_seed_and_skip_finished_ones(table_script, tmp_path):
    _run(tmp_path, "MRPC", "softmax", 0, 80.0, 85.0)
    args = table_script.parse_args(["--tasks", "mrpc", "rte", "--rows", "softmax", "bam-wc", "--seeds", "2",
                                    "--out", str(tmp_path), "optim.lr=3e-5"])
    labels = [cell.label for cell in table_script.grid(args)]
    assert labels == ["MRPC bam-wc seed 0", "RTE softmax seed 0", "RTE bam-wc seed 0", "MRPC softmax seed 1",
                      "MRPC bam-wc seed 1", "RTE softmax seed 1", "RTE bam-wc seed 1"]
    cell = table_script.grid(args)[0]
    assert cell.out == tmp_path / "MRPC" / "bam-wc" / "seed0"
    assert ["first_seed=0", "seeds=1", "--attention", "bam-wc"] == [a for a in cell.command if a in (
        "first_seed=0", "seeds=1", "--attention", "bam-wc")] and cell.command[-1] == "optim.lr=3e-5"


def test_table_pairs_the_seeds_both_rows_have(table_script, tmp_path):
    softmax = {0: (80.0, 85.0), 1: (82.0, 86.0), 2: (81.0, 85.5), 3: (79.0, 84.0)}
    bam = {0: (81.0, 85.5), 1: (84.0, 87.0), 2: (81.5, 86.0)}  # seed 3 unfinished: 3 pairs
    for seed, (acc, f1) in softmax.items():
        _run(tmp_path, "MRPC", "softmax", seed, acc, f1)
    for seed, (acc, f1) in bam.items():
        _run(tmp_path, "MRPC", "bam-wc", seed, acc, f1)
    table = table_script.build_table(table_script.load_results(tmp_path))["MRPC"]
    assert table["paper_albert"] == (86.5, 88.5) and table["main_metric"] == "accuracy"
    assert table["rows"]["softmax"]["accuracy"]["n"] == 4 and table["rows"]["bam-wc"]["accuracy"]["n"] == 3
    paired = table["rows"]["bam-wc"]["paired_vs_softmax"]["accuracy"]
    differences = [bam[s][0] - softmax[s][0] for s in (0, 1, 2)]
    low, high = stats.t.interval(0.95, 2, loc=sum(differences) / 3, scale=stats.sem(differences))
    assert paired["n"] == 3 and paired["mean"] == pytest.approx(sum(differences) / 3)
    assert (paired["low"], paired["high"]) == (pytest.approx(low), pytest.approx(high))
    markdown = table_script.markdown({"MRPC": table})
    assert markdown.index("| MRPC | softmax") < markdown.index("| MRPC | bam-wc")
    assert "(all-MiniLM-L6-v2)" in markdown and "accuracy +1.17 [" in markdown and "| 88.5 |" in markdown
