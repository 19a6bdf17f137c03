"""scripts/reproduce_glue_table.py: the grid's cells (seed by seed, finished ones skipped) and the table from
finished runs, with paired differences over the seeds both rows have."""
import json
from pathlib import Path

import pytest
from scipy import stats

from tests.scripts import committed_table, load_script



@pytest.fixture(scope="module")
def table_script():
    return load_script("scripts/reproduce_glue_table.py")


def _run(out: Path, task: str, row: str, seed: int, accuracy: float, f1: float) -> None:
    directory = out / task / row / f"seed{seed}"
    directory.mkdir(parents=True)
    per_seed = {"seed": seed, "dev": {"accuracy": accuracy, "f1": f1}, "train_seconds": 10.0}
    (directory / "results.json").write_text(json.dumps({"task": task, "model": "/m/all-MiniLM-L6-v2",
                                                        "environment": {"git_commit": "abc123"},
                                                        "per_seed": [per_seed]}))


def test_cells_run_seed_by_seed_and_skip_finished_ones(table_script, tmp_path):
    _run(tmp_path, "MRPC", "official-softmax", 0, 80.0, 85.0)
    args = table_script.parse_args(["--tasks", "mrpc", "rte", "--seeds", "2", "--out", str(tmp_path),
                                    "optim.lr=3e-5"])
    labels = [cell.label for cell in table_script.grid(args)]
    assert labels == ["MRPC official-bam seed 0", "RTE official-softmax seed 0", "RTE official-bam seed 0",
                      "MRPC official-softmax seed 1", "MRPC official-bam seed 1", "RTE official-softmax seed 1",
                      "RTE official-bam seed 1"]
    cells = table_script.grid(args)
    assert cells[0].out == tmp_path / "MRPC" / "official-bam" / "seed0"
    assert cells[0].command[-3:] == ["--preset", "official", "optim.lr=3e-5"]
    assert ["first_seed=0", "seeds=1"] == [a for a in cells[0].command if a in ("first_seed=0", "seeds=1")]
    assert cells[1].command[-5:] == ["--preset", "official", "--attention", "softmax", "optim.lr=3e-5"]


def test_every_bam_row_is_paired_with_the_softmax_arm_of_its_recipe(table_script):
    rows = table_script.ROWS
    assert {name: row.baseline for name, row in rows.items() if row.baseline} == {
        "official-bam": "official-softmax", "standard-bam-wc": "standard-softmax",
        "standard-bam-wc-kl0.001": "standard-softmax", "standard-bam-wc-kl0": "standard-softmax"}
    assert [rows[f"standard-bam-wc{kl}"].options[-1] for kl in ("", "-kl0.001", "-kl0")] == [
        "kl.weight=0.01", "kl.weight=0.001", "kl.weight=0"]


def test_table_pairs_the_seeds_both_rows_have(table_script, tmp_path):
    softmax = {0: (80.0, 85.0), 1: (82.0, 86.0), 2: (81.0, 85.5), 3: (79.0, 84.0)}
    bam = {0: (81.0, 85.5), 1: (84.0, 87.0), 2: (81.5, 86.0)}  # seed 3 unfinished: 3 pairs
    for seed, (acc, f1) in softmax.items():
        _run(tmp_path, "MRPC", "official-softmax", seed, acc, f1)
    for seed, (acc, f1) in bam.items():
        _run(tmp_path, "MRPC", "official-bam", seed, acc, f1)
    _run(tmp_path, "MRPC", "standard-bam-wc", 0, 70.0, 70.0)  # no standard softmax arm: not paired
    table = table_script.build_table(table_script.load_results(tmp_path))
    mrpc = table["tasks"]["MRPC"]
    assert mrpc["paper_albert"] == (86.5, 88.5) and mrpc["main_metric"] == "accuracy"
    rows = mrpc["rows"]
    assert rows["official-softmax"]["accuracy"]["n"] == 4 and rows["official-bam"]["accuracy"]["n"] == 3
    assert "paired" not in rows["standard-bam-wc"] and rows["official-bam"]["commits"] == ["abc123"]
    paired = rows["official-bam"]["paired"]
    differences = [bam[s][0] - softmax[s][0] for s in (0, 1, 2)]
    low, high = stats.t.interval(0.95, 2, loc=sum(differences) / 3, scale=stats.sem(differences))
    assert paired["baseline"] == "official-softmax" and paired["seeds"] == [0, 1, 2]
    assert paired["accuracy"]["n"] == 3 and paired["accuracy"]["mean"] == pytest.approx(sum(differences) / 3)
    assert (paired["accuracy"]["low"], paired["accuracy"]["high"]) == (pytest.approx(low), pytest.approx(high))
    assert rows["official-bam"]["verdict"] == ("gain" if low > 0 else "none detected")
    markdown = table_script.markdown(table)
    assert markdown.index("| MRPC | official-softmax") < markdown.index("| MRPC | official-bam")
    assert "(all-MiniLM-L6-v2)" in markdown and "accuracy +1.17 [" in markdown and "| 88.5 |" in markdown
    assert "accuracy 80.50 +- 1.29 (n=4)" in markdown and "| accuracy 70.00 (n=1), f1 70.00 (n=1) |" in markdown
    assert table["across_tasks"] == {}  # one task: nothing to summarise over tasks


@pytest.mark.parametrize("gain, verdicts", [(2.0, ("gain", "gain")), (-2.0, ("loss", "loss")),
                                            (0.0, ("none detected", "none detected"))])
def test_the_summary_over_tasks_counts_verdicts_and_pools_the_differences(table_script, tmp_path, gain, verdicts):
    from common.metrics.paired import random_effects_mean

    noise = (0.3, -0.2, 0.1, -0.4, 0.2)
    for task in ("MRPC", "RTE"):
        for seed, e in enumerate(noise):
            _run(tmp_path, task, "official-softmax", seed, 80.0, 80.0)
            _run(tmp_path, task, "official-bam", seed, 80.0 + gain + e * (1 if task == "MRPC" else 2), 80.0)
    table = table_script.build_table(table_script.load_results(tmp_path))
    summary = table["across_tasks"]["official-bam"]
    assert summary["tasks"] == ["MRPC", "RTE"] and tuple(summary["verdicts"].values()) == verdicts
    assert summary["higher_mean"] == (2 if gain > 0 else 0 if gain < 0 else summary["higher_mean"])
    diffs = [table["tasks"][t]["rows"]["official-bam"]["paired"]["accuracy"] for t in ("MRPC", "RTE")]
    expected = random_effects_mean([d["mean"] for d in diffs], [d["sd"] / d["n"] ** 0.5 for d in diffs])
    assert summary["random_effects"] == pytest.approx(expected)
    assert "official-bam over 2 tasks (MRPC, RTE)" in table_script.markdown(table)


def test_verdicts_are_holm_adjusted_over_the_comparisons_with_one_softmax_arm(table_script, tmp_path):
    """Two tasks against the official softmax arm: MRPC's interval alone excludes 0 (p about 0.03), RTE shows
    nothing; Holm doubles MRPC's p (the smaller of two), so neither is a gain. The standard arm is its own family."""
    mrpc_gain = (1.0, 0.2, 1.5, 0.1, 1.2)
    for seed, g in enumerate(mrpc_gain):
        _run(tmp_path, "MRPC", "official-softmax", seed, 80.0, 80.0)
        _run(tmp_path, "MRPC", "official-bam", seed, 80.0 + g, 80.0)
        _run(tmp_path, "RTE", "official-softmax", seed, 60.0, 60.0)
        _run(tmp_path, "RTE", "official-bam", seed, 60.0 + (-1) ** seed * 2.0, 60.0)
        _run(tmp_path, "MRPC", "standard-softmax", seed, 80.0, 80.0)
        _run(tmp_path, "MRPC", "standard-bam-wc", seed, 80.0 + g, 80.0)
    table = table_script.build_table(table_script.load_results(tmp_path))
    mrpc, rte = (table["tasks"][t]["rows"]["official-bam"] for t in ("MRPC", "RTE"))
    p = stats.ttest_1samp(mrpc_gain, 0.0).pvalue
    assert mrpc["paired"]["accuracy"]["low"] > 0 and mrpc["paired"]["accuracy"]["p"] == pytest.approx(p) and p < 0.05
    assert mrpc["p_holm"] == pytest.approx(2 * p) and mrpc["family_size"] == 2 and mrpc["verdict"] == "none detected"
    assert rte["p_holm"] == pytest.approx(max(2 * p, rte["paired"]["accuracy"]["p"]))
    standard = table["tasks"]["MRPC"]["rows"]["standard-bam-wc"]
    assert standard["family_size"] == 1 and standard["p_holm"] == pytest.approx(p) and standard["verdict"] == "gain"
    assert f"| {2 * p:.3f} (2) | none detected |" in table_script.markdown(table)


def test_the_kl_sweep_pairs_each_weight_with_the_presets_weight_holm_adjusted(table_script, tmp_path):
    """Weight 0 is above weight 0.01 on every seed, weight 0.001 is not; each is paired with the 0.01 row (not with
    softmax) over the seeds both have, and Holm's correction runs over the two comparisons."""
    lift = {"standard-bam-wc-kl0": (1.0, 1.5, 0.5, 1.2), "standard-bam-wc-kl0.001": (0.5, -0.5, 0.3, -0.4)}
    for seed in range(4):
        _run(tmp_path, "MRPC", "standard-softmax", seed, 79.0, 80.0)
        _run(tmp_path, "MRPC", "standard-bam-wc", seed, 78.0 + seed, 80.0)
        for row, gains in lift.items():
            if row.endswith("kl0") or seed < 3:  # 0.001 has three seeds
                _run(tmp_path, "MRPC", row, seed, 78.0 + seed + gains[seed], 80.0)
    sweep = table_script.build_table(table_script.load_results(tmp_path))["kl_sweep"]["MRPC"]
    assert sweep["reference_kl_weight"] == 0.01 and sweep["metric"] == "accuracy"
    zero, small = sweep["rows"]["standard-bam-wc-kl0"], sweep["rows"]["standard-bam-wc-kl0.001"]
    assert (zero["kl_weight"], zero["n"], small["n"]) == (0.0, 4, 3)
    assert zero["mean"] == pytest.approx(1.05) and small["mean"] == pytest.approx(0.1)
    p_zero = stats.ttest_1samp(lift["standard-bam-wc-kl0"], 0.0).pvalue
    p_small = stats.ttest_1samp(lift["standard-bam-wc-kl0.001"][:3], 0.0).pvalue
    assert zero["p"] == pytest.approx(p_zero) and zero["p_holm"] == pytest.approx(2 * p_zero)
    assert small["p_holm"] == pytest.approx(max(2 * p_zero, p_small))
    line = table_script.markdown(table_script.build_table(table_script.load_results(tmp_path))).splitlines()[-1]
    assert line.startswith("KL-weight sweep on MRPC (standard recipe, BAM-WC), each weight minus weight 0.01")
    assert f"0: +1.05 [{zero['low']:+.2f}, {zero['high']:+.2f}] ({zero['mdd']:.2f}, n=4, {2 * p_zero:.3f})" in line


def test_a_table_json_builds_the_same_table_again(table_script, tmp_path):
    import json as json_module

    for seed, (acc, f1) in {0: (80.0, 85.0), 1: (82.0, 86.0), 2: (81.0, 85.5)}.items():
        _run(tmp_path, "RTE", "official-softmax", seed, acc, f1)
        _run(tmp_path, "RTE", "official-bam", seed, acc + 0.5 * seed, f1)
    table = table_script.build_table(table_script.load_results(tmp_path))
    saved = json_module.loads(json_module.dumps(table))  # as written to and read from table.json
    again = table_script.build_table(table_script.found_in_table(saved))
    assert json_module.loads(json_module.dumps(again)) == saved


def test_the_docs_table_is_the_committed_table_json(table_script):
    """docs/nlu.md's official-grid table is rebuilt from docs/tables/glue-table.json, line for line."""
    saved, in_docs = committed_table("glue-table.json", "nlu.md", "official-grid")
    again = table_script.build_table(table_script.found_in_table(saved))
    assert json.loads(json.dumps(again)) == saved
    assert in_docs == table_script.markdown(again)


def test_first_seed_moves_the_grids_seeds(table_script, tmp_path):
    args = table_script.parse_args(["--tasks", "rte", "--first-seed", "5", "--seeds", "2", "--out", str(tmp_path)])
    assert [cell.label for cell in table_script.grid(args)] == [
        "RTE official-softmax seed 5", "RTE official-bam seed 5", "RTE official-softmax seed 6",
        "RTE official-bam seed 6"]
    assert "first_seed=6" in table_script.grid(args)[-1].command


def test_merge_takes_another_tables_seeds_and_refuses_a_seed_run_twice(table_script, tmp_path, capsys):
    here, there = tmp_path / "here", tmp_path / "there"
    for seed in (0, 1):
        _run(here, "RTE", "official-softmax", seed, 80.0 + seed, 85.0)
        _run(here, "RTE", "official-bam", seed, 81.0 + 2 * seed, 85.0)
    for seed in (2, 3):
        _run(there, "RTE", "official-softmax", seed, 79.0, 84.0)
        _run(there, "RTE", "official-bam", seed, 80.5 - seed, 84.0)
    table_script.main(["--table-only", "--out", str(there)])
    table_script.main(["--table-only", "--out", str(here), "--merge", str(there / "table.json")])
    merged = json.loads((here / "table.json").read_text())["tasks"]["RTE"]["rows"]["official-bam"]
    assert merged["seeds"] == [0, 1, 2, 3] and merged["paired"]["accuracy"]["n"] == 4
    assert merged["paired"]["accuracy"]["mean"] == pytest.approx((1 + 2 - 0.5 - 1.5) / 4)

    _run(there, "RTE", "official-bam", 0, 60.0, 70.0)  # seed 0 again, another result
    table_script.main(["--table-only", "--out", str(there)])
    with pytest.raises(SystemExit, match=r"RTE official-bam seed 0 is in .*table.json and in .*here"):
        table_script.main(["--table-only", "--out", str(here), "--merge", str(there / "table.json")])
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(SystemExit, match=r"bad.json: not a table.json of this script"):
        table_script.main(["--table-only", "--out", str(here), "--merge", str(tmp_path / "bad.json")])


def test_the_table_does_not_depend_on_the_order_the_runs_are_found(table_script, tmp_path):
    """table.json is written with sorted keys; a table rebuilt from it must sum over the tasks in the same order."""
    from nlu.tasks import get_task

    for task, shift in (("STS-B", 0.3), ("MRPC", 0.1), ("RTE", -0.7), ("CoLA", 1.1)):
        for row, seed in [(row, seed) for row in ("official-softmax", "official-bam") for seed in range(3)]:
            value = 70.0 + seed + (seed * shift + shift if row == "official-bam" else 0)
            directory = tmp_path / task / row / f"seed{seed}"
            directory.mkdir(parents=True)
            per_seed = {"seed": seed, "dev": dict.fromkeys(get_task(task).metrics, value), "train_seconds": 1.0}
            (directory / "results.json").write_text(json.dumps({"task": task, "model": "m", "per_seed": [per_seed]}))
    found = table_script.load_results(tmp_path)
    backwards = {task: found[task] for task in reversed(list(found))}
    assert json.dumps(table_script.build_table(found)) == json.dumps(table_script.build_table(backwards))
    assert list(table_script.build_table(backwards)["tasks"]) == ["CoLA", "MRPC", "RTE", "STS-B"]


def test_the_docs_verdict_table_states_the_committed_numbers(table_script):
    """docs/nlu.md's table of the four official comparisons, cell by cell, from docs/tables/glue-table.json."""
    saved, _ = committed_table("glue-table.json", "nlu.md", "official-grid")
    text = (Path(__file__).resolve().parents[2] / "docs" / "nlu.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith(tuple(f"| {t} | " for t in saved["tasks"]))
            and "BAM" not in line and line.count("|") == 9]
    assert [row.split(" | ")[0][2:] for row in rows] == ["MRPC", "RTE", "CoLA", "STS-B"]
    for row in rows:
        task, _, interval, mdd, n, p, verdict, _ = [cell.strip(" *|") for cell in row.split(" | ")]
        entry = saved["tasks"][task]["rows"]["official-bam"]
        d = entry["paired"][saved["tasks"][task]["main_metric"]]
        expected = f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]".replace("-", "−")
        assert (interval, mdd, n, p, verdict) == (expected, f"{d['mdd']:.2f}", str(d["n"]), f"{entry['p_holm']:.3f}",
                                                  entry["verdict"]), task
