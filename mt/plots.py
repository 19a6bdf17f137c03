"""Learning curves (PNG) from ``metrics.jsonl`` records: one run, or several runs compared."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common.utils import atomic_save_figure  # noqa: E402


PANELS = (("train/ce", "training cross-entropy"), ("val/ppl", "validation perplexity"),
          ("val/bleu", "validation BLEU (greedy)"))


def _series(records: Sequence[dict], key: str) -> tuple[List[int], List[float]]:
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [s for s, _ in points], [v for _, v in points]


def plot_runs(runs: Dict[str, Sequence[dict]], path: Path, title: str = "") -> Path:
    """One panel per metric of :data:`PANELS`, one line per run; written to ``path`` (PNG)."""
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.6))
    for ax, (key, label) in zip(axes, PANELS):
        for name, records in runs.items():
            steps, values = _series(records, key)
            if steps:
                # a marker where there are too few points for a line (one logged value draws nothing)
                ax.plot(steps, values, marker="o" if key.startswith("val") or len(steps) == 1 else None,
                        markersize=3, label=name)
        ax.set_xlabel("update")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    if len(runs) > 1:
        axes[-1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return atomic_save_figure(fig, path)


def plot_curves(records: Sequence[dict], path: Path, title: str = "") -> Path:
    return plot_runs({title or "run": records}, path, title)
