"""Figures of ``graphattn.train`` runs: learning curves per seed, and accuracy over the seeds.

``curves.png``: training loss and validation accuracy per epoch, each seed a faint line, their
mean +- one std, and a dot at each seed's chosen (snapshot) epoch, explained in a legend.
``accuracy.png``: the test and validation accuracy of every seed with the mean and +- one sample
standard deviation, the numbers of ``results.json``.
:func:`plot_variant_accuracy`: the same spread for several variants and datasets side by side
(``scripts/reproduce_gat_table.py`` writes it as ``table.png``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from common.utils import atomic_save_figure, read_metrics  # noqa: E402

CURVE_PANELS = (("train/loss", "training loss (CE + weighted KL)"), ("val/acc", "validation accuracy"))


def _series(rows: Sequence[dict], key: str) -> Dict[int, float]:
    """``{epoch (1-based): value}`` of ``key`` in the rows of ``metrics.jsonl``."""
    return {int(r["epoch"]): r[key] for r in rows if isinstance(r.get(key), (int, float))}


def seed_curves_figure(histories: Mapping[int, Sequence[dict]], best_epochs: Mapping[int, int], title: str = ""):
    """One panel per :data:`CURVE_PANELS` entry (``histories[seed]``: the per-epoch rows of
    ``metrics.jsonl``): every seed as a faint line, their mean +- one sample std over the epochs that
    every seed ran (seeds stop early at different epochs), and a dot at each seed's chosen epoch, the
    snapshot that is tested (``best_epochs``, 0-based)."""
    fig, axes = plt.subplots(1, len(CURVE_PANELS), figsize=(5.5 * len(CURVE_PANELS), 3.8))
    several = len(histories) > 1
    seeds_label = f"{len(histories)} seeds, one colour each" if several else f"seed {next(iter(histories), '')}"
    for ax, (key, label) in zip(axes, CURVE_PANELS):
        curves = {seed: curve for seed, rows in histories.items() if (curve := _series(rows, key))}
        dots = []
        for i, (seed, curve) in enumerate(curves.items()):
            color = f"C{i % 10}"
            ax.plot(list(curve), list(curve.values()), color=color, linewidth=0.8 if several else 1.2,
                    alpha=0.35 if several else 1.0, marker="o" if len(curve) == 1 else None, markersize=3,
                    label=seeds_label if i == 0 else None)
            best = best_epochs.get(seed)
            if best is not None and best + 1 in curve:
                dots.append(ax.plot([best + 1], [curve[best + 1]], "o", color=color, markeredgecolor="black",
                                    markersize=5, zorder=3)[0])
        if dots:
            dots[0].set_label("chosen epoch (its weights are tested)")
        if len(curves) > 1:
            shared = sorted(set.intersection(*(set(curve) for curve in curves.values())))
            values = np.array([[curve[epoch] for epoch in shared] for curve in curves.values()])
            mean, std = values.mean(0), values.std(0, ddof=1)
            ax.fill_between(shared, mean - std, mean + std, color="black", alpha=0.15, linewidth=0,
                            label="± 1 std over the seeds")
            ax.plot(shared, mean, color="black", linewidth=1.6, label="mean (until the first seed stops)")
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_seed_curves(histories: Mapping[int, Sequence[dict]], best_epochs: Mapping[int, int], path: Path,
                     title: str = "") -> Path:
    """:func:`seed_curves_figure` written to ``path``."""
    return atomic_save_figure(seed_curves_figure(histories, best_epochs, title), path)


def _seed_spread(ax, groups: Mapping[str, Sequence[float]]) -> None:
    """Each group's values (percent) as dots at its own x, with the mean and +- one sample std
    (ddof=1) as a bar beside them and written out."""
    rng = np.random.default_rng(0)  # horizontal jitter only, so that equal accuracies stay visible
    for i, values in enumerate(groups.values()):
        values = np.asarray(values, dtype=float)
        mean = values.mean()
        std = values.std(ddof=1) if values.size > 1 else 0.0
        ax.scatter(i + rng.uniform(-0.12, 0.12, values.size), values, s=14, alpha=0.7, zorder=3)
        ax.errorbar([i + 0.3], [mean], yerr=[std], fmt="s", color="black", capsize=4, zorder=4)
        ax.annotate(f"{mean:.2f} ± {std:.2f}", (i + 0.38, mean), fontsize=8, va="center")
    ax.set_xticks(range(len(groups)), [f"{name}\n({len(v)} seeds)" for name, v in groups.items()])
    ax.set_xlim(-0.5, len(groups) - 0.5 + 0.6)
    ax.grid(axis="y", alpha=0.3)


def plot_seed_accuracy(accuracies: Mapping[str, Sequence[float]], path: Path, title: str = "") -> Path:
    """Per-seed accuracies (percent) of each split in ``accuracies`` (e.g. ``{"test": [...], "val":
    [...]}``) as dots, with the mean and +- one sample std (ddof=1) as a bar; written to ``path``."""
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(accuracies), 3.6))
    _seed_spread(ax, accuracies)
    ax.set_ylabel("accuracy (%)")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return atomic_save_figure(fig, path)


def variant_accuracy_figure(by_dataset: Mapping[str, Mapping[str, Sequence[float]]]):
    """One panel per dataset of ``by_dataset`` (``{dataset: {variant: per-seed test accuracies}}``),
    each variant's seeds as dots with their mean and +- one sample std."""
    widest = max(len(variants) for variants in by_dataset.values())
    fig, axes = plt.subplots(1, len(by_dataset), figsize=((1.6 + 1.4 * widest) * len(by_dataset), 4), squeeze=False)
    for ax, (dataset, variants) in zip(axes[0], by_dataset.items()):
        _seed_spread(ax, variants)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_title(dataset)
    axes[0][0].set_ylabel("test accuracy (%)")
    fig.tight_layout()
    return fig


def plot_variant_accuracy(by_dataset: Mapping[str, Mapping[str, Sequence[float]]], path: Path) -> Path:
    """:func:`variant_accuracy_figure` written to ``path``."""
    return atomic_save_figure(variant_accuracy_figure(by_dataset), path)


def plot_run(out_dir: Path, results: Dict, per_seed: List[dict]) -> List[Path]:
    """``curves.png`` (from each seed's ``seed<k>/metrics.jsonl``, where it has one) and ``accuracy.png`` of a run
    in ``out_dir`` (``per_seed``: the seeds' metrics)."""
    title, out_dir = f"GAT {results['attention']} on {results['dataset']}", Path(out_dir)
    curves = {m["seed"]: out_dir / f"seed{m['seed']}" / "metrics.jsonl" for m in per_seed}
    histories = {seed: read_metrics(path) for seed, path in curves.items() if path.is_file()}
    best_epochs = {m["seed"]: m["best_epoch"] for m in per_seed}
    return [plot_seed_curves(histories, best_epochs, out_dir / "curves.png", title),
            plot_seed_accuracy({"test": results["test_acc"]["per_seed"], "val": results["val_acc"]["per_seed"]},
                               Path(out_dir) / "accuracy.png", title)]
