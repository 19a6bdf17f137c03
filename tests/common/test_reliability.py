"""Reliability bins and the PNG diagram."""
import torch

from common.metrics.reliability import plot_reliability, reliability_bins
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
