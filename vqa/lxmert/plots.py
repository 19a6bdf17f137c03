"""Per-head spans and alphas over training (the paper's Figures 1 and 3), from ``metrics.jsonl``.

The training loop logs ``span/<group>.<layer>/h<i>`` (the span ``zS``) and
``alpha/<group>.<layer>/h<i>`` (entmax alpha) with :class:`common.utils.MetricsLogger`.
:func:`plot_head_values` draws one panel per attention module, a row per group (language
encoder, vision encoder, the cross-modality encoder's cross-attention, language and vision
self-attention) and a column per layer, one line per head.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from common.utils import read_metrics

YLABELS = {"span": "span zS", "alpha": "alpha"}


def head_series(records: List[dict], kind: str) -> Dict[str, Dict[int, Tuple[List[int], List[float]]]]:
    """``{module label: {head: (steps, values)}}`` of every ``<kind>/...`` scalar in ``records``."""
    series: Dict[str, Dict[int, Tuple[List[int], List[float]]]] = defaultdict(dict)
    prefix = f"{kind}/"
    for record in records:
        for key, value in record.items():
            if not key.startswith(prefix):
                continue
            label, head = key[len(prefix):].rsplit("/h", 1)
            steps, values = series[label].setdefault(int(head), ([], []))
            steps.append(record["step"])
            values.append(float(value))
    return dict(series)


def plot_head_values(metrics: Union[str, Path], kind: str, out: Union[str, Path],
                     title: Optional[str] = None) -> Optional[Path]:
    """PNG of the per-head ``kind`` (``span`` or ``alpha``) curves; None when nothing was logged."""
    if kind not in YLABELS:
        raise ValueError(f"kind must be one of {sorted(YLABELS)}, got {kind!r}")
    series = head_series(read_metrics(metrics), kind)
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .adapt import GROUP_TITLES

    groups = [g for g in GROUP_TITLES if any(label.startswith(g + ".") for label in series)]
    layers = {g: sorted(int(label.rsplit(".", 1)[1]) for label in series if label.rsplit(".", 1)[0] == g)
              for g in groups}
    cols = max(len(v) for v in layers.values())
    fig, axes = plt.subplots(len(groups), cols, figsize=(2.6 * cols, 2.2 * len(groups)), squeeze=False,
                             sharex=True, sharey="row")
    for r, group in enumerate(groups):
        for c in range(cols):
            ax = axes[r][c]
            if c >= len(layers[group]):
                ax.axis("off")
                continue
            layer = layers[group][c]
            for head, (steps, values) in sorted(series[f"{group}.{layer}"].items()):
                ax.plot(steps, values, linewidth=1, label=f"h{head}")
            ax.set_title(f"{group} {layer}", fontsize=8)
            ax.tick_params(labelsize=7)
            if c == 0:
                ax.set_ylabel(f"{GROUP_TITLES[group]}\n{YLABELS[kind]}", fontsize=7)
            if r == len(groups) - 1:
                ax.set_xlabel("step", fontsize=7)
    axes[0][0].legend(fontsize=6, ncol=2)  # head colours are the same in every panel
    fig.suptitle(title or f"{YLABELS[kind]} per head over training", fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)
    return out
