"""scripts/reproduce_pos_table.py: the table's statistics. The treebank is the unit of pairing (each treebank's
seeds averaged first), p-values are Holm-adjusted over the rows compared, "no effect" needs the +-1-point
equivalence test, and the learning-speed measure is the dev accuracy after the declared number of updates."""

import numpy as np
import pytest
from scipy import stats

from tests.scripts import committed_table, load_script

TREEBANKS = [f"UD_Toy-{i}" for i in range(6)]


@pytest.fixture(scope="module")
def table_script():
    return load_script("scripts/reproduce_pos_table.py")


def results(label: str, per_treebank_seeds: dict, speed: float = 80.0) -> dict:
    """``{treebank: results.json}`` with the test accuracies of each seed and a first-epoch curve."""
    out = {}
    for tb, accuracies in per_treebank_seeds.items():
        per_seed = [{"seed": seed, "test": {"all": acc, "oov": acc - 20, "ambiguous": acc - 5},
                     "curve": [{"step": 10, "dev_acc": speed - 10}, {"step": 20, "dev_acc": speed + seed}],
                     "dev_acc_after_1_epoch": speed + 5, "epochs": 10, "train_seconds": 100.0}
                    for seed, acc in enumerate(accuracies)]
        out[tb] = {"label": label, "per_seed": per_seed}
    return out


def test_seeds_within_a_treebank_are_averaged_before_pairing(table_script):
    rng = np.random.default_rng(0)
    base = {tb: list(90 + i + rng.normal(0, 0.5, 3)) for i, tb in enumerate(TREEBANKS)}
    row = {tb: list(np.asarray(base[tb]) + 0.3 + rng.normal(0, 0.5, 3)) for tb in TREEBANKS}
    table = table_script.build_table({"pe-add": results("SAN+PE[add]", base), "pr": results("SAN+P+R", row)})
    d = table["pr"]["vs_pe_add"]
    unit = [np.mean(row[tb]) - np.mean(base[tb]) for tb in TREEBANKS]   # one difference per treebank
    low, high = stats.t.interval(0.95, len(unit) - 1, loc=np.mean(unit), scale=stats.sem(unit))
    assert d["n"] == 6 and d["treebanks"] == TREEBANKS  # not 18 (treebank, seed) pairs
    assert (d["mean"], d["low"], d["high"]) == (pytest.approx(np.mean(unit)), pytest.approx(low), pytest.approx(high))
    assert d["p"] == pytest.approx(stats.ttest_1samp(unit, 0).pvalue)
    assert d["p_holm"] == pytest.approx(d["p"])           # one row compared: nothing to adjust
    assert table["pr"]["macro_all"]["n"] == 6


def test_p_values_are_holm_adjusted_and_the_verdicts_follow(table_script):
    base = {tb: [90.0 + i, 90.5 + i, 89.5 + i] for i, tb in enumerate(TREEBANKS)}
    jitter = [0.05, -0.05, 0.1, -0.1, 0.02, -0.02]
    shifted = lambda shift: {tb: [a + shift + jitter[i] for a in base[tb]] for i, tb in enumerate(TREEBANKS)}  # noqa
    found = {"pe-add": results("SAN+PE[add]", base), "pr": results("SAN+P+R", shifted(2.0)),
             "temp": results("SAN+PE[add]+Temp", shifted(0.0)), "conv2d": results("SAN+PE[add]+Conv2d", shifted(0.3)),
             "conv1d": results("SAN+PE[add]+Conv1d", shifted(-1.5), speed=75.0)}
    table = table_script.build_table(found)
    from common.metrics.paired import holm_adjust

    compared = ("pr", "temp", "conv2d", "conv1d")
    raw = [table[r]["vs_pe_add"]["p"] for r in compared]
    assert [table[r]["vs_pe_add"]["p_holm"] for r in compared] == pytest.approx(holm_adjust(raw))
    assert table["pr"]["verdict"] == "higher" and table["conv1d"]["verdict"] == "lower"
    assert table["temp"]["verdict"] == "equivalent within +-1"   # +0.0: no difference, and within the margin
    assert table["conv2d"]["verdict"] == "higher, within +-1"    # +0.3 with little spread: real, and small
    tost = table["temp"]["vs_pe_add"]["tost"]
    assert tost["p_holm"] < 0.05 and -1 < tost["low"] < tost["high"] < 1
    speed = table["conv1d"]["vs_pe_add_speed"]            # dev accuracy after 20 updates, seeds averaged
    assert speed["mean"] == pytest.approx(-5.0) and speed["n"] == 6
    assert table["conv1d"]["dev_acc_after_20_updates"]["mean"] == pytest.approx(76.0)   # 75 + mean seed 0..2
    assert "pe-add" not in [r for r in table if table[r].get("vs_pe_add")]
    markdown = table_script.markdown(table, TREEBANKS)
    assert "| SAN+P+R | 6 | 18 |" in markdown and "| higher |" in markdown and "equivalent within +-1" in markdown


def test_an_inconclusive_difference_is_neither_an_effect_nor_equivalence(table_script):
    base = {tb: [90.0, 90.0, 90.0] for tb in TREEBANKS}
    noisy = {tb: [90.0 + d] * 3 for tb, d in zip(TREEBANKS, [3.0, -2.5, 2.0, -3.0, 2.5, -1.0])}
    table = table_script.build_table({"pe-add": results("SAN+PE[add]", base), "pr": results("SAN+P+R", noisy)})
    assert table["pr"]["verdict"] == "inconclusive"


def test_the_default_rows_are_the_papers_five_and_bam(table_script):
    args = table_script.parse_args([])
    assert args.variants == ["pe-add", "pr", "conv2d", "conv1d", "temp"] and args.extra == ["bam-wc"]
    rows = [row for tb, row, _ in table_script.cells(args) if tb == "UD_English-GUM"]
    assert rows == ["pe-add", "pr", "conv2d", "conv1d", "temp", "pe-add-bam-wc"]


def test_every_run_of_the_grid_takes_the_preset(table_script, tmp_path, monkeypatch):
    commands = []
    monkeypatch.setattr(table_script, "run_cells", lambda cells, jobs, cwd, stop_after: commands.extend(c.command for c in cells))
    table_script.run_grid(table_script.parse_args(["--out", str(tmp_path), "--treebanks", "UD_English-GUM"]))
    assert len(commands) == 6 and all(c[c.index("--preset") + 1] == "official" for c in commands)


def test_a_table_json_builds_the_same_table_again(table_script):
    """table.json keeps each seed's record (its test accuracies, the speed point, the commit), so a committed
    table can be recomputed without the runs."""
    import json

    rng = np.random.default_rng(1)
    base = {tb: list(90 + i + rng.normal(0, 0.5, 3)) for i, tb in enumerate(TREEBANKS)}
    found = {"pe-add": results("SAN+PE[add]", base),
             "conv1d": results("SAN+PE[add]+Conv1d", {tb: [a + 1 for a in accs] for tb, accs in base.items()}, 84.0),
             "temp": results("SAN+PE[add]+Temp", {tb: accs[:2] for tb, accs in base.items()})}
    for res in found["pe-add"].values():
        res["environment"] = {"git_commit": "abc1234"}
    rows = table_script.build_table(found)
    saved = json.loads(json.dumps(rows))  # as written to and read from table.json
    assert saved["pe-add"]["per_seed"][TREEBANKS[0]][0]["commit"] == "abc1234"
    assert [p["step"] for p in saved["conv1d"]["per_seed"][TREEBANKS[0]][0]["curve"]] == [20]
    again = table_script.build_table(table_script.found_in_table(saved))
    assert json.loads(json.dumps(again)) == saved
    assert table_script.markdown(again, table_script.treebanks_of(again)) == table_script.markdown(
        rows, sorted(TREEBANKS))


def test_the_docs_table_is_the_committed_table_json(table_script):
    """docs/tagging.md's grid table is rebuilt from docs/tables/pos-table.json (the grid's per-seed records), line
    for line, and the committed statistics are what the current script computes from those records."""
    import json

    saved, in_docs = committed_table("pos-table.json", "tagging.md", "pos-grid")
    again = table_script.build_table(table_script.found_in_table(saved))
    assert json.loads(json.dumps(again)) == saved
    assert in_docs == table_script.markdown(again, table_script.treebanks_of(again))
    assert all(len(seeds) == row["per_treebank"][tb]["n"]  # each cell's n is its seeds' records
               for row in saved.values() for tb, seeds in row["per_seed"].items())
