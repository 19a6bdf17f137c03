"""scripts/reproduce_gat_table.py builds its table from finished seeds, with paired differences."""
import json
from pathlib import Path

import pytest
import torch

from tests.scripts import load_script



@pytest.fixture(scope="module")
def table_script():
    return load_script("scripts/reproduce_gat_table.py")


def _seeds(run_dir: Path, accuracies: dict):
    run_dir.mkdir(parents=True)
    for seed, acc in accuracies.items():
        torch.save({"metrics": {"test": {"acc": acc}}}, run_dir / f"seed{seed}.pt")


def test_table_from_finished_seeds_with_paired_differences(tmp_path, table_script):
    _seeds(tmp_path / "Cora" / "softmax", {0: 0.80, 1: 0.82, 2: 0.84, 3: 0.83})
    _seeds(tmp_path / "Cora" / "bam-wc", {0: 0.81, 1: 0.84, 2: 0.84})  # seed 3 unfinished: 3 pairs
    _seeds(tmp_path / "Cora" / "official" / "softmax", {0: 0.82, 1: 0.83})
    _seeds(tmp_path / "Cora" / "official" / "bam-wc", {0: 0.82, 1: 0.81})
    assert table_script.main(["--table-only", "--out", str(tmp_path), "--datasets", "Cora",
                              "--variants", "softmax", "bam-wc", "bam-lc", "--presets", "official"]) == 0
    cora = json.loads((tmp_path / "table.json").read_text())["ours"]["Cora"]
    assert cora["softmax"]["n"] == 4 and "vs_softmax" not in cora["softmax"]
    diff = cora["bam-wc"]["vs_softmax"]  # differences 1, 2, 0 points: mean 1, sd 1, t(0.975, 2) = 4.303
    assert diff["seeds"] == [0, 1, 2] and diff["mean"] == pytest.approx(1.0) and diff["sd"] == pytest.approx(1.0)
    assert diff["high"] == pytest.approx(1 + 4.302653 / 3**0.5)
    assert cora["official/bam-wc"]["vs_softmax"]["mean"] == pytest.approx(-1.0)
    table = (tmp_path / "table.md").read_text()
    assert "| BAM-WC | 83.00 ± 1.73 (3) | +1.00 [-1.48, +3.48] (" in table
    assert "| BAM-WC, `official` preset | 81.50 ± 0.71 (2) | -1.00 [" in table
    assert "another codebase" in table
    assert "BAM-LC" not in table  # never run: no row


def test_table_png_shows_every_seed_and_the_mean_and_std_per_variant(tmp_path, table_script, capsys):
    _seeds(tmp_path / "Cora" / "softmax", {0: 0.80, 1: 0.82, 2: 0.84})
    _seeds(tmp_path / "Cora" / "bam-wc", {0: 0.81, 1: 0.84})
    _seeds(tmp_path / "CiteSeer" / "bam-wc", {0: 0.72})  # no CiteSeer softmax: one variant there
    assert table_script.main(["--table-only", "--out", str(tmp_path), "--datasets", "Cora", "CiteSeer",
                              "--variants", "softmax", "bam-wc"]) == 0
    figure = tmp_path / "table.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.splitlines()[-4:] == [
        "files written:", *(f"  {tmp_path / name}" for name in ("table.md", "table.json", "table.png"))]

    results = json.loads((tmp_path / "table.json").read_text())["ours"]
    spread = table_script.seed_spread(results, ["Cora", "CiteSeer"], ["softmax", "bam-wc"])
    assert spread == {"Cora": {"softmax": pytest.approx([80, 82, 84]), "bam-wc": pytest.approx([81, 84])},
                      "CiteSeer": {"bam-wc": pytest.approx([72])}}
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection

    from graphattn.plots import variant_accuracy_figure

    fig = variant_accuracy_figure(spread)
    cora, citeseer = fig.axes
    assert [ax.get_title() for ax in fig.axes] == ["Cora", "CiteSeer"]
    dots = [sorted(c.get_offsets()[:, 1]) for c in cora.collections if isinstance(c, PathCollection)]
    assert dots == [pytest.approx([80, 82, 84]), pytest.approx([81, 84])]  # one dot per seed
    assert [t.get_text() for t in cora.texts] == ["82.00 ± 2.00", "82.50 ± 2.12"]
    assert [t.get_text() for t in citeseer.texts] == ["72.00 ± 0.00"]
    assert [t.get_text() for t in cora.get_xticklabels()] == ["softmax\n(3 seeds)", "bam-wc\n(2 seeds)"]
    plt.close(fig)
