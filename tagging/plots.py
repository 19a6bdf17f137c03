"""Learning-curve figures: dev accuracy against updates, per seed (``curves.png``) and per variant
(the paper's Figure 2, from :mod:`scripts.reproduce_pos_table`)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from common.utils import atomic_save_figure


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: Seeds are drawn in these styles, in turn, so that a seed whose curve runs along another's still shows.
SEED_STYLES = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ((0, (5, 1, 1, 1)), "v"))


def curves_figure(per_seed: Sequence[dict], label: str, treebank: str):
    """The figure of :func:`plot_curves`. Each seed has its own line style and hollow marker
    (:data:`SEED_STYLES`); a seed drawn later is thinner, so that one drawn before it still shows around it
    where their curves coincide; a star of the seed's colour marks its best epoch."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, record in enumerate(per_seed):
        curve, (linestyle, marker), width = record["curve"], SEED_STYLES[i % len(SEED_STYLES)], max(0.8, 3 - 0.6 * i)
        line, = ax.plot([p["step"] for p in curve], [p["dev_acc"] for p in curve], linestyle=linestyle,
                        linewidth=width, marker=marker, markersize=3 + 2 * width, markerfacecolor="none",
                        markevery=max(1, len(curve) // 8), alpha=0.8, label=f"seed {record['seed']}")
        best = next(p for p in curve if p["epoch_end"] and p["epoch"] == record["best_epoch"])
        ax.plot(best["step"], best["dev_acc"], "*", markersize=6 + 3 * width, color=line.get_color(),
                markeredgecolor="black", markeredgewidth=0.5)
    ax.plot([], [], "*", markersize=10, color="grey", markeredgecolor="black", markeredgewidth=0.5,
            label="best epoch (tested)")
    ax.set_xlabel("updates")
    ax.set_ylabel("dev accuracy, all words (%)")
    ax.set_title(f"{label} on {treebank}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def plot_curves(per_seed: Sequence[dict], label: str, treebank: str, path: Path) -> Path:
    """Dev accuracy (all words) against updates for each seed on ``treebank``, the best epoch marked; saved
    to ``path``."""
    return atomic_save_figure(curves_figure(per_seed, label, treebank), path)


def mean_curve(curves: Sequence[Sequence[dict]], grid: np.ndarray) -> np.ndarray:
    """The mean over ``curves`` of dev accuracy interpolated at the updates in ``grid`` (each curve held at its
    last value after it ends)."""
    values = [np.interp(grid, [p["step"] for p in c], [p["dev_acc"] for p in c]) for c in curves]
    return np.mean(values, axis=0)


def plot_variant_curves(curves: Mapping[str, Sequence[Sequence[dict]]], path: Path, max_updates: int,
                        title: str = "") -> Path:
    """One line per variant: mean dev accuracy over its runs (seeds x treebanks) for the first ``max_updates``."""
    plt = _pyplot()
    first = max(runs[0]["step"] for runs_ in curves.values() for runs in runs_)  # no extrapolation before it
    grid = np.linspace(first, max_updates, 100)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, runs in curves.items():
        ax.plot(grid, mean_curve(runs, grid), label=f"{label} (n={len(runs)})")
    ax.set_xlabel("updates")
    ax.set_ylabel("mean dev accuracy, all words (%)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    return atomic_save_figure(fig, path)
