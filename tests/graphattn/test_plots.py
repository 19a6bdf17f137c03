"""graphattn.plots: the learning curves of a run (curves.png)."""
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PolyCollection

from graphattn.plots import CURVE_PANELS, plot_seed_curves, seed_curves_figure


def history(losses, accs):
    return [{"epoch": epoch, "train/loss": loss, "val/acc": acc}
            for epoch, (loss, acc) in enumerate(zip(losses, accs), start=1)]


def test_several_seeds_are_faint_under_their_mean_and_band_with_the_chosen_epochs_explained(tmp_path):
    histories = {0: history([3, 2, 1, 1], [0.2, 0.4, 0.6, 0.7]),   # seeds stop early at different epochs
                 1: history([5, 4, 3], [0.4, 0.6, 0.8]),
                 2: history([4, 3, 2, 2, 2], [0.3, 0.5, 0.7, 0.7, 0.6])}
    fig = seed_curves_figure(histories, {0: 3, 1: 2, 2: 2})
    for ax, (key, label) in zip(fig.axes, CURVE_PANELS):
        assert ax.get_ylabel() == label and ax.get_xlabel() == "epoch"
        seeds = [line for line in ax.lines if line.get_alpha() == 0.35]
        assert [list(line.get_xdata()) for line in seeds] == [[1, 2, 3, 4], [1, 2, 3], [1, 2, 3, 4, 5]]
        mean = [line for line in ax.lines if line.get_color() == "black"]
        values = np.array([[row[key] for row in histories[seed][:3]] for seed in (0, 1, 2)])
        assert len(mean) == 1 and list(mean[0].get_xdata()) == [1, 2, 3]  # the epochs every seed ran
        np.testing.assert_allclose(mean[0].get_ydata(), values.mean(0))
        band, = [c for c in ax.collections if isinstance(c, PolyCollection)]
        low, high = band.get_paths()[0].vertices[:, 1].min(), band.get_paths()[0].vertices[:, 1].max()
        spread = values.mean(0) - values.std(0, ddof=1), values.mean(0) + values.std(0, ddof=1)
        assert (low, high) == pytest.approx((spread[0].min(), spread[1].max()))
        dots = [(line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines if line.get_marker() == "o"]
        assert dots == [(4, histories[0][3][key]), (3, histories[1][2][key]), (3, histories[2][2][key])]
    legend = [text.get_text() for text in fig.axes[-1].get_legend().get_texts()]
    assert legend == ["3 seeds, one colour each", "chosen epoch (its weights are tested)", "± 1 std over the seeds",
                      "mean (until the first seed stops)"]
    plt.close(fig)
    path = plot_seed_curves(histories, {0: 3, 1: 2, 2: 2}, tmp_path / "curves.png", "GAT softmax on Cora")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_seed_is_drawn_plainly_without_a_band():
    fig = seed_curves_figure({7: history([3, 2, 1], [0.2, 0.4, 0.5])}, {7: 1})
    for ax in fig.axes:
        assert not [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert ax.lines[0].get_alpha() == 1.0 and len(ax.lines) == 2  # the seed and its chosen epoch
    assert [t.get_text() for t in fig.axes[-1].get_legend().get_texts()] == [
        "seed 7", "chosen epoch (its weights are tested)"]
    plt.close(fig)
