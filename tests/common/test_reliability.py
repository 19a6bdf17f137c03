"""Reliability bins and the PNG diagram."""
import numpy as np
import torch

from common.metrics.reliability import ReliabilityBins, plot_reliability, reliability_bins, reliability_figure
from common.metrics.uncertainty import expected_calibration_error


def test_bins_on_a_hand_worked_example():
    # confidences 0.9 (right), 0.8 (wrong), 0.6 (right), 0.55 (wrong) in 2 bins: (0, .5], (.5, 1]
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.45, 0.55]])
    targets = torch.tensor([0, 0, 0, 0])
    bins = reliability_bins(probs, targets, num_bins=2)
    assert bins.count.tolist() == [0.0, 4.0]
    assert torch.allclose(bins.confidence[1], torch.tensor(0.7125, dtype=torch.double))
    assert bins.accuracy[1] == 0.5
    assert abs(bins.ece - 0.2125) < 1e-7  # float32 inputs
    assert abs(bins.ece - expected_calibration_error(probs, targets, num_bins=2)) < 1e-12


def test_plot_writes_a_png(tmp_path):
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(200, 5) * 2, -1)
    targets = torch.randint(0, 5, (200,))
    path = tmp_path / "plots" / "reliability.png"
    bins = plot_reliability(probs, targets, path, num_bins=10)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert int(bins.count.sum()) == 200


def dominant_colour(image: np.ndarray, extent) -> tuple:
    """The most frequent RGBA value of ``image`` inside a display-space ``extent``, a few pixels in from its edges."""
    height = image.shape[0]
    rows = slice(int(height - extent.y1) + 3, int(height - extent.y0) - 3)
    pixels = image[rows, int(extent.x0) + 3:int(extent.x1) - 3].reshape(-1, 4)
    values, counts = np.unique(pixels, axis=0, return_counts=True)
    return tuple(values[counts.argmax()])


def test_the_legend_shows_each_gap_in_the_colour_it_is_drawn():
    # bin 2 is underconfident (accuracy 0.8 over confidence 0.5), bin 3 overconfident (0.6 under 0.9)
    bins = ReliabilityBins(torch.tensor([0.0, 5, 5], dtype=torch.double),
                           torch.tensor([0.0, 0.5, 0.9], dtype=torch.double),
                           torch.tensor([0.0, 0.8, 0.6], dtype=torch.double))
    fig = reliability_figure(bins)
    ax = fig.axes[0]
    legend = ax.get_legend()
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == ["perfect calibration", "accuracy", "gap to mean confidence (overconfident)",
                      "gap to mean confidence (underconfident)"]
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())
    accuracy, over, under = ax.containers  # the bars, then the gaps above and over the bars
    drawn = [dominant_colour(image, bar.get_window_extent()) for bar in (accuracy[0], over[0], under[0])]
    shown = [dominant_colour(image, handle.get_window_extent()) for handle in legend.legend_handles[1:]]
    assert shown == drawn and len(set(drawn)) == 3
    import matplotlib.pyplot as plt  # imported by reliability_figure, with the Agg backend

    plt.close(fig)
