"""tagging.plots: the learning-curve figure names the treebank and shows every seed."""
from matplotlib.colors import to_rgba

from tagging.plots import curves_figure, plot_curves


def seed_record(seed: int, accuracies) -> dict:
    """A per-seed record as tagging.training writes it: one point per epoch end, the best epoch the highest."""
    curve = [{"step": 10 * (i + 1), "epoch": i + 1, "epoch_end": True, "dev_acc": a} for i, a in enumerate(accuracies)]
    return {"seed": seed, "curve": curve, "best_epoch": 1 + accuracies.index(max(accuracies))}


def test_the_title_names_the_variant_and_the_treebank():
    fig = curves_figure([seed_record(0, [80.0, 85.0])], "BAM-WC", "UD_English-GUM")
    assert fig.axes[0].get_title() == "BAM-WC on UD_English-GUM"


def test_seeds_with_the_same_curve_stay_distinguishable():
    same = [90.0, 92.0, 91.0]
    ax = curves_figure([seed_record(seed, same) for seed in range(3)], "softmax", "UD_Toy").axes[0]
    seeds = [line for line in ax.get_lines() if line.get_label().startswith("seed")]
    assert [line.get_label() for line in seeds] == ["seed 0", "seed 1", "seed 2"]
    assert len({(line.get_linestyle(), line.get_marker()) for line in seeds}) == 3
    widths = [line.get_linewidth() for line in seeds]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == 3  # each drawn over a wider one
    assert all(line.get_markerfacecolor() == "none" for line in seeds)
    _, labels = ax.get_legend_handles_labels()
    assert labels == ["seed 0", "seed 1", "seed 2", "best epoch (tested)"]
    legend = ax.get_legend()
    assert [h.get_linestyle() for h in legend.legend_handles[:3]] == [line.get_linestyle() for line in seeds]
    stars = [line for line in ax.get_lines() if line.get_marker() == "*" and line.get_xdata().size]
    assert [to_rgba(s.get_color()) for s in stars] == [to_rgba(line.get_color()) for line in seeds]


def test_plot_curves_writes_a_png(tmp_path):
    path = plot_curves([seed_record(0, [80.0, 85.0]), seed_record(1, [81.0, 84.0])], "BAM", "UD_Toy",
                       tmp_path / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
