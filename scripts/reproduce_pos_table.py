"""Reproduce the PoS-tagging experiment of Dufter, Schmitt & Schütze (COLING 2020) on the staged UD v2.2
treebanks: train every (treebank, variant) over the seeds, then write the table and the learning curves.

    python scripts/reproduce_pos_table.py --jobs 2                       # the whole grid
    python scripts/reproduce_pos_table.py --variants pe-add pr conv1d conv2d --jobs 2   # the first priority
    python scripts/reproduce_pos_table.py --table-only                   # the table from the runs so far

Each cell is one ``python -m tagging.train`` run (``--threads 1``; ``--jobs`` of them at a time) into
``<out>/<treebank>/<variant>``; a re-run reuses finished seeds, so an interrupted grid resumes.
``--extra NAME`` adds a row: PE[add] with another normalizer (default: bam-wc, k=10, KL weight 0.01).

Written to ``<out>``: ``table.md`` and ``table.json`` (per treebank mean +- std of the test accuracy;
per variant the macro mean over treebanks of all / OOV / ambiguous accuracy, the paired difference to
SAN+PE[add] over treebanks x seeds with its 95% t-interval and minimal detectable difference, the dev
accuracy after one epoch and the updates needed to reach 99% of the best dev accuracy), ``table.png``
and ``curves.png`` (the paper's Figure 2: mean dev accuracy against updates, one line per variant).
Only cells with results are reported, each with its n.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.utils.grid import Cell, run_cells  # noqa: E402
from common.utils.runs import mean_std  # noqa: E402
from tagging.config import PAPER_TREEBANKS, VARIANT_NAMES  # noqa: E402

#: A published reference of the same kind beside ours: UPOS accuracy (%) of UDPipe 1.2 with gold tokenisation on the
#: test sets, from the "Model Performance" table of the README of the Universal Dependencies 2.3 models for UDPipe
#: (udpipe-ud-2.3-181115, http://hdl.handle.net/11234/1-2898). Trained on UD 2.3, not 2.2: a close reference, not
#: the same data. The paper itself compares with Smith et al. (2018), whose per-treebank numbers are not staged here.
UDPIPE_UD23_GOLD_TOK_UPOS = {
    "UD_Afrikaans-AfriBooms": 95.3, "UD_English-GUM": 93.5, "UD_English-LinES": 94.7, "UD_French-Sequoia": 97.0,
    "UD_French-Spoken": 93.3, "UD_Gothic-PROIEL": 94.9, "UD_Greek-GDT": 96.0, "UD_Hungarian-Szeged": 90.7,
    "UD_Old_Church_Slavonic-PROIEL": 94.0, "UD_Swedish-LinES": 94.6, "UD_Vietnamese-VTB": 87.6,
}
#: The extra rows: PE[add] with another normalizer, and the overrides it trains with.
EXTRAS = {"bam-wc": ["attention.name=bam-wc", "attention.options.k=10", "kl.weight=0.01"]}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--treebanks", nargs="+", default=list(PAPER_TREEBANKS), metavar="NAME",
                        help="treebanks under <data-root>/ud (default: the 11 of the paper's 47 that are staged)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANT_NAMES), choices=VARIANT_NAMES,
                        help="variants (default: all 8 of the paper)")
    parser.add_argument("--extra", nargs="*", default=["bam-wc"], choices=sorted(EXTRAS),
                        help="extra rows: PE[add] with these normalizers (default bam-wc; none: --extra)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per cell (the paper: 3)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, each on one thread (default 1)")
    parser.add_argument("--data-root", help="directory holding ud/ (default: $ATTN_DATA_ROOT)")
    parser.add_argument("--out", default="runs/pos", help="output directory (default runs/pos)")
    parser.add_argument("--table-only", action="store_true", help="write the table from the runs so far")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every run")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.seeds < 1:
        parser.error("--jobs and --seeds must be at least 1")
    return args


def cells(args) -> List[tuple]:
    """``(treebank, row name, extra overrides)`` in priority order: the first variants first, over all treebanks."""
    rows = [(v, []) for v in args.variants] + [(f"pe-add-{name}", EXTRAS[name]) for name in args.extra]
    return [(tb, row, extra) for row, extra in rows for tb in args.treebanks]


def run_grid(args) -> None:
    grid = []
    for tb, row, extra in cells(args):
        out = Path(args.out) / tb / row
        if (out / "results.json").exists() and json.loads((out / "results.json").read_text())["seeds"] == \
                list(range(args.seeds)):
            continue
        cmd = [sys.executable, "-m", "tagging.train", "--treebank", tb, "--variant", row if not extra else "pe-add",
               "--seeds", str(args.seeds), "--threads", "1", "--no-progress", "--out", str(out), *extra,
               *args.overrides]
        grid.append(Cell(f"{tb} {row}", cmd + (["--data-root", args.data_root] if args.data_root else []), out))
    run_cells(grid, args.jobs, cwd=ROOT)


def load_results(out: Path) -> Dict[str, Dict[str, dict]]:
    """``{row: {treebank: results.json}}`` for every finished cell under ``out``."""
    found: Dict[str, Dict[str, dict]] = defaultdict(dict)
    for path in sorted(out.glob("*/*/results.json")):
        found[path.parent.name][path.parent.parent.name] = json.loads(path.read_text(encoding="utf-8"))
    return found


def build_table(found: Dict[str, Dict[str, dict]]) -> dict:
    """Per-row statistics; paired differences to ``pe-add`` over the (treebank, seed) pairs both have."""
    from common.metrics.paired import paired_t

    base = found.get("pe-add", {})
    rows = {}
    for row, by_tb in found.items():
        runs = [r for res in by_tb.values() for r in res["per_seed"]]
        entry = {"label": next(iter(by_tb.values()))["label"], "treebanks": len(by_tb), "runs": len(runs),
                 "per_treebank": {tb: mean_std([r["test"]["all"] for r in res["per_seed"]])
                                  for tb, res in sorted(by_tb.items())}}
        for metric in ("all", "oov", "ambiguous"):
            entry[f"macro_{metric}"] = mean_std([mean_std([r["test"][metric] for r in res["per_seed"]])["mean"]
                                               for res in by_tb.values()])
        for key in ("dev_acc_after_1_epoch", "updates_to_99pct", "epochs", "train_seconds"):
            entry[key] = mean_std([r[key] for r in runs])
        if row != "pe-add":
            pairs = [(b, r) for tb, res in by_tb.items() if tb in base
                     for r in res["per_seed"] for b in base[tb]["per_seed"] if b["seed"] == r["seed"]]
            if len(pairs) >= 2:
                for key, get in (("vs_pe_add", lambda x: x["test"]["all"]),
                                 ("vs_pe_add_dev_after_1_epoch", lambda x: x["dev_acc_after_1_epoch"]),
                                 ("vs_pe_add_updates_to_99pct", lambda x: x["updates_to_99pct"])):
                    entry[key] = paired_t([get(b) for b, _ in pairs], [get(r) for _, r in pairs]).as_dict()
        rows[row] = entry
    return rows


def markdown(rows: dict, treebanks: List[str]) -> str:
    order = [r for r in list(VARIANT_NAMES) + sorted(rows) if r in rows]
    order = list(dict.fromkeys(order))
    short = [tb.replace("UD_", "") for tb in treebanks]
    lines = ["Test accuracy over all words (%), mean ± std over seeds (n seeds; one seed: no std); last column: "
             "UDPipe 1.2, gold tokenisation, UD 2.3 models (a published reference of the same kind, see "
             "UDPIPE_UD23_GOLD_TOK_UPOS).", "",
             "| treebank | " + " | ".join(rows[r]["label"] for r in order) + " | UDPipe 1.2 (UD 2.3) |",
             "|---|" + "---:|" * (len(order) + 1)]
    for tb, name in zip(treebanks, short):
        cells_ = []
        for r in order:
            cell = rows[r]["per_treebank"].get(tb)
            spread = f" ± {cell['std']:.2f}" if cell and cell["n"] > 1 else ""  # no spread from one seed
            cells_.append(f"{cell['mean']:.2f}{spread} ({cell['n']})" if cell else "not run")
        udpipe = UDPIPE_UD23_GOLD_TOK_UPOS.get(tb)
        lines.append(f"| {name} | " + " | ".join(cells_) + f" | {udpipe if udpipe else '—'} |")
    lines += ["", "Per variant: macro mean over treebanks (± std over treebanks); paired difference to SAN+PE[add] "
              "over treebanks × seeds (95% t-interval, minimal detectable difference at 80% power); learning speed "
              "over all runs (mean ± std).", "",
              "| variant | treebanks | runs | all | OOV | ambiguous | Δ all vs PE[add] [95% CI] (MDD) "
              "| dev acc after 1 epoch | Δ dev after 1 epoch [95% CI] | updates to 99% of best dev "
              "| Δ updates [95% CI] | epochs |",
              "|---|---:|---:|---:|---:|---:|---|---:|---|---:|---|---:|"]

    def diff(entry, key):
        d = entry.get(key)
        return f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] ({d['mdd']:.2f})" if d else "—"

    for r in order:
        e = rows[r]
        ms = lambda k: f"{e[k]['mean']:.2f} ± {e[k]['std']:.2f}"  # noqa: E731
        lines.append(f"| {e['label']} | {e['treebanks']} | {e['runs']} | {ms('macro_all')} | {ms('macro_oov')} | "
                     f"{ms('macro_ambiguous')} | {diff(e, 'vs_pe_add')} | {ms('dev_acc_after_1_epoch')} | "
                     f"{diff(e, 'vs_pe_add_dev_after_1_epoch')} | {e['updates_to_99pct']['mean']:.0f} ± "
                     f"{e['updates_to_99pct']['std']:.0f} | {diff(e, 'vs_pe_add_updates_to_99pct')} | "
                     f"{e['epochs']['mean']:.1f} |")
    return "\n".join(lines) + "\n"


def figures(rows: dict, found: Dict[str, Dict[str, dict]], out: Path) -> List[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common.utils import atomic_save_figure
    from tagging.plots import plot_variant_curves

    order = [r for r in dict.fromkeys(list(VARIANT_NAMES) + sorted(rows)) if r in rows]
    curves = {rows[r]["label"]: [run["curve"] for res in found[r].values() for run in res["per_seed"]] for r in order}
    first_epoch = min(run["updates_per_epoch"] for res in found[order[0]].values() for run in res["per_seed"])
    paths = [plot_variant_curves(curves, out / "curves.png", max_updates=3 * first_epoch,
                                 title="UD dev accuracy, first updates (mean over treebanks x seeds)")]
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(order) + 1.5))
    for i, r in enumerate(order):
        d = rows[r].get("vs_pe_add")
        if d:
            ax.errorbar(d["mean"], i, xerr=[[d["mean"] - d["low"]], [d["high"] - d["mean"]]], fmt="o", capsize=3)
        elif r == "pe-add":
            ax.plot(0, i, "D", color="grey")
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(order)), [f"{rows[r]['label']} (n={rows[r]['runs']})" for r in order])
    ax.set_xlabel("Δ test accuracy vs SAN+PE[add] (points): paired mean, 95% CI")
    ax.set_title("UD v2.2, paired over treebanks x seeds")
    fig.tight_layout()
    paths.append(atomic_save_figure(fig, out / "table.png"))
    return paths


def write_table(args) -> None:
    from common.utils import atomic_write_json, atomic_write_text

    out = Path(args.out)
    found = load_results(out)
    if "pe-add" not in found:
        sys.exit(f"error: no finished SAN+PE[add] cell under {out}; run the grid first")
    rows = build_table(found)
    treebanks = sorted({tb for by_tb in found.values() for tb in by_tb})
    text = markdown(rows, treebanks)
    paths = [atomic_write_text(out / "table.md", text), atomic_write_json(out / "table.json", rows),
             *figures(rows, found, out)]
    print(text)
    print("files written:\n" + "\n".join(f"  {p}" for p in paths))


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.table_only:
        run_grid(args)
    write_table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
