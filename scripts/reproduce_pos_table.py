"""Reproduce the PoS-tagging experiment of Dufter, Schmitt & Schütze (COLING 2020) on the staged UD v2.2
treebanks: train every (treebank, variant) over the seeds, then write the table and the learning curves.

    python scripts/reproduce_pos_table.py --jobs 2                       # the paper's five UD rows + BAM-WC
    python scripts/reproduce_pos_table.py --variants pe-add pe-con p r --extra --jobs 2   # the other variants
    python scripts/reproduce_pos_table.py --table-only                   # the table from the runs so far

Each cell is one ``python -m tagging.train`` run (``--threads 1``; ``--jobs`` of them at a time) into
``<out>/<treebank>/<variant>``; a re-run reuses finished seeds, so an interrupted grid resumes
(``--stop-after MINUTES`` interrupts the running cells as a Ctrl-C does and starts no more).
``--extra NAME`` adds a row: PE[add] with another normalizer (default: bam-wc, k=10, KL weight 0.01).

Written to ``<out>``: ``table.md`` and ``table.json`` (each seed's record, so that the table can be built again
from it (:func:`found_in_table`); per treebank mean +- std of the test accuracy;
per variant the macro mean over treebanks of every accuracy of :mod:`tagging.metrics` (OOV and ambiguous
in our definitions and the authors'), and against SAN+PE[add] with **the treebank as the unit** (each
treebank's seeds averaged first, then paired over the treebanks both rows have): the mean difference of
the test accuracy with its 95% t-interval and minimal detectable difference, its Holm-adjusted p over the
rows compared, Schuirmann's equivalence test within +-1 point (TOST, Holm-adjusted too) and a verdict;
and the one learning-speed measure declared before the runs, the dev accuracy after
:data:`SPEED_UPDATES` updates, paired and Holm-adjusted alike), ``table.png`` and ``curves.png`` (the
paper's Figure 2: mean dev accuracy against updates, one line per variant). Only cells with results
are reported, each with its n.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.utils.grid import Cell, add_grid_options, check_grid_options, run_cells, stop_seconds  # noqa: E402
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
#: The paper's UD rows (``COMMANDS`` of the authors' ``ud_parallel.py``; PE[con], P and R are in its unused
#: ``ADD_COMMANDS``).
PAPER_VARIANTS = ("pe-add", "pr", "conv2d", "conv1d", "temp")
#: The learning-speed measure, declared before the grid ran: dev accuracy after this many updates (the paper's
#: Figure 2 plots dev accuracy against updates). 20 is the last point of the first epoch's curve (every 10
#: updates) that all 11 treebanks have: the smallest, Hungarian-Szeged, has 29 updates per epoch at batch 32.
SPEED_UPDATES = 20
#: The equivalence margin (points of test accuracy) of the "no effect" claims.
EQUIVALENCE_MARGIN = 1.0
ALPHA = 0.05


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--treebanks", nargs="+", default=list(PAPER_TREEBANKS), metavar="NAME",
                        help="treebanks under <data-root>/ud (default: the 11 of the paper's 47 that are staged)")
    parser.add_argument("--variants", nargs="+", default=list(PAPER_VARIANTS), choices=VARIANT_NAMES,
                        help=f"variants (default: the paper's UD rows, {' '.join(PAPER_VARIANTS)})")
    parser.add_argument("--extra", nargs="*", default=["bam-wc"], choices=sorted(EXTRAS),
                        help="extra rows: PE[add] with these normalizers (default bam-wc; none: --extra)")
    parser.add_argument("--preset", default="official", choices=("standard", "official"),
                        help="tagging preset of every run (default official: the authors' initialisation and "
                             "vocabulary)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per cell (the paper: 3)")
    add_grid_options(parser)
    parser.add_argument("--data-root", help="directory holding ud/ (default: $ATTN_DATA_ROOT)")
    parser.add_argument("--out", default="runs/pos", help="output directory (default runs/pos)")
    parser.add_argument("--table-only", action="store_true", help="write the table from the runs so far")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every run")
    args = parser.parse_args(argv)
    check_grid_options(parser, args)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
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
               "--seeds", str(args.seeds), "--preset", args.preset, "--threads", "1", "--no-progress", "--out",
               str(out), *extra, *args.overrides]
        grid.append(Cell(f"{tb} {row}", cmd + (["--data-root", args.data_root] if args.data_root else []), out))
    run_cells(grid, args.jobs, cwd=ROOT, stop_after=stop_seconds(args))


def load_results(out: Path) -> Dict[str, Dict[str, dict]]:
    """``{row: {treebank: results.json}}`` for every finished cell under ``out``."""
    found: Dict[str, Dict[str, dict]] = defaultdict(dict)
    for path in sorted(out.glob("*/*/results.json")):
        found[path.parent.name][path.parent.parent.name] = json.loads(path.read_text(encoding="utf-8"))
    return found


def seed_record(record: dict, results: dict) -> dict:
    """What the table keeps of a seed's record, enough to build the table again (:func:`found_in_table`): its
    test accuracies, the learning-speed point, the first epoch's dev accuracy, epochs, seconds and the commit."""
    return {"seed": record["seed"], "test": record["test"], "curve": [point for point in record["curve"]
                                                                     if point["step"] == SPEED_UPDATES],
            "dev_acc_after_1_epoch": record["dev_acc_after_1_epoch"], "epochs": record["epochs"],
            "train_seconds": record["train_seconds"],
            "commit": record.get("commit", results.get("environment", {}).get("git_commit"))}


def found_in_table(rows: dict) -> Dict[str, Dict[str, dict]]:
    """The per-seed records a ``table.json`` was built from, as :func:`load_results` gives what the table reads of
    them: a committed table can be recomputed without the runs."""
    return {row: {tb: {"label": entry["label"], "per_seed": seeds} for tb, seeds in entry["per_seed"].items()}
            for row, entry in rows.items()}


def dev_acc_after(curve: List[dict], updates: int) -> Optional[float]:
    """The dev accuracy measured after exactly ``updates`` updates, if the curve has that point."""
    return next((point["dev_acc"] for point in curve if point["step"] == updates), None)


def treebank_means(by_tb: Dict[str, dict], value) -> Dict[str, float]:
    """``{treebank: mean over its seeds of value(seed record)}``: the pairing unit (seeds are not independent
    replicates of the treebank effect); treebanks where a seed lacks the value are left out."""
    means = {}
    for tb, res in by_tb.items():
        values = [value(r) for r in res["per_seed"]]
        if values and all(v is not None for v in values):
            means[tb] = sum(values) / len(values)
    return means


def compare(base: Dict[str, float], row: Dict[str, float]) -> Optional[dict]:
    """``row - base`` paired over the treebanks both have: the t-interval (and MDD), its two-sided p and the TOST."""
    from common.metrics.paired import equivalence_tost, paired_p_value, paired_t

    shared = sorted(set(base) & set(row))
    if len(shared) < 2:
        return None
    a, b = [base[tb] for tb in shared], [row[tb] for tb in shared]
    return {"treebanks": shared, **paired_t(a, b).as_dict(), "p": paired_p_value(a, b),
            "tost": equivalence_tost(a, b, EQUIVALENCE_MARGIN, ALPHA)}


def verdict(d: dict) -> str:
    """From the Holm-adjusted tests: ``higher`` / ``lower`` than PE[add] (``..., within +-1`` when the equivalence
    test also holds: a real but small difference), ``equivalent within +-1``, or ``inconclusive``."""
    equivalent = d["tost"]["p_holm"] < ALPHA
    margin = f"within +-{EQUIVALENCE_MARGIN:g}"
    if d["p_holm"] < ALPHA:
        return ("higher" if d["mean"] > 0 else "lower") + (f", {margin}" if equivalent else "")
    return f"equivalent {margin}" if equivalent else "inconclusive"


def build_table(found: Dict[str, Dict[str, dict]]) -> dict:
    """Per-row statistics; against ``pe-add``, differences paired over treebanks (seeds averaged first), with
    Holm's correction over the rows compared (test accuracy and the learning-speed measure, each its family)."""
    from tagging.metrics import GROUPS

    def speed_of(record: dict) -> Optional[float]:
        return dev_acc_after(record["curve"], SPEED_UPDATES)

    base = found.get("pe-add", {})
    base_accuracy, base_speed = treebank_means(base, lambda r: r["test"]["all"]), treebank_means(base, speed_of)
    rows = {}
    for row, by_tb in found.items():
        runs = [r for res in by_tb.values() for r in res["per_seed"]]
        entry = {"label": next(iter(by_tb.values()))["label"], "treebanks": len(by_tb), "runs": len(runs),
                 "per_treebank": {tb: mean_std([r["test"]["all"] for r in res["per_seed"]])
                                  for tb, res in sorted(by_tb.items())},
                 "per_seed": {tb: [seed_record(r, res) for r in res["per_seed"]] for tb, res in sorted(by_tb.items())}}
        means = {metric: treebank_means(by_tb, lambda r, m=metric: r["test"].get(m)) for metric in GROUPS}
        for metric, per_treebank in means.items():
            if per_treebank:
                entry[f"macro_{metric}"] = mean_std(list(per_treebank.values()))
        speed = treebank_means(by_tb, speed_of)
        entry[f"dev_acc_after_{SPEED_UPDATES}_updates"] = mean_std(list(speed.values())) if speed else None
        for key in ("dev_acc_after_1_epoch", "epochs", "train_seconds"):
            entry[key] = mean_std([r[key] for r in runs])
        if row != "pe-add":
            entry["vs_pe_add"] = compare(base_accuracy, means["all"])
            entry["vs_pe_add_speed"] = compare(base_speed, speed)
        rows[row] = entry
    _holm(rows, "vs_pe_add", tost=True)
    _holm(rows, "vs_pe_add_speed", tost=False)
    for entry in rows.values():
        if entry.get("vs_pe_add"):
            entry["verdict"] = verdict(entry["vs_pe_add"])
    return rows


def _holm(rows: dict, key: str, tost: bool) -> None:
    """Holm-adjust the ``key`` comparisons' p (and TOST p) over the rows that have one."""
    from common.metrics.paired import holm_adjust

    compared = [e[key] for e in rows.values() if e.get(key)]
    for d, p in zip(compared, holm_adjust([d["p"] for d in compared])):
        d["p_holm"] = p
    if tost:
        for d, p in zip(compared, holm_adjust([d["tost"]["p"] for d in compared])):
            d["tost"]["p_holm"] = p


def treebanks_of(rows: dict) -> List[str]:
    """Every treebank of the table's rows, sorted."""
    return sorted({tb for entry in rows.values() for tb in entry["per_treebank"]})


def markdown(rows: dict, treebanks: List[str]) -> str:
    from common.metrics.paired import format_p

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
    lines += ["", "Per variant: macro mean over treebanks (± std over treebanks) of the test accuracies: all words, "
              "OOV and ambiguous words as the paper's text defines them (unseen in training; more than one "
              "training tag) and as the authors' code counts them (outside the word index; ambiguous inside it). "
              "Against SAN+PE[add], paired over treebanks (each treebank's seeds averaged first): the mean "
              "difference with its 95% t-interval and MDD (80% power), Holm-adjusted p over the rows compared, "
              f"the ±{EQUIVALENCE_MARGIN:g}-point equivalence test (TOST, Holm-adjusted p, 90% interval), and the "
              f"learning-speed measure declared before the runs: dev accuracy after {SPEED_UPDATES} updates.", "",
              "| variant | treebanks | runs | all | OOV | ambiguous | OOV (authors') | ambiguous (authors') "
              "| Δ all vs PE[add] [95% CI] (MDD, n) | Holm p | TOST ±1: Holm p [90% CI] | verdict "
              f"| dev acc after {SPEED_UPDATES} updates | Δ [95% CI], Holm p | dev acc after 1 epoch | epochs |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|---:|---|---:|---:|"]

    def ms(e, key):
        return f"{e[key]['mean']:.2f} ± {e[key]['std']:.2f}" if e.get(key) else "—"

    for r in order:
        e = rows[r]
        d, speed = e.get("vs_pe_add"), e.get("vs_pe_add_speed")
        diff = f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] ({d['mdd']:.2f}, {d['n']})" if d else "—"
        holm = format_p(d["p_holm"]) if d else "—"
        tost = f"{format_p(d['tost']['p_holm'])} [{d['tost']['low']:+.2f}, {d['tost']['high']:+.2f}]" if d else "—"
        fast = (f"{speed['mean']:+.2f} [{speed['low']:+.2f}, {speed['high']:+.2f}], {format_p(speed['p_holm'])}"
                if speed else "—")
        lines.append(f"| {e['label']} | {e['treebanks']} | {e['runs']} | {ms(e, 'macro_all')} | {ms(e, 'macro_oov')} | "
                     f"{ms(e, 'macro_ambiguous')} | {ms(e, 'macro_oov_index')} | {ms(e, 'macro_ambiguous_index')} | "
                     f"{diff} | {holm} | {tost} | {e.get('verdict', '—')} | "
                     f"{ms(e, f'dev_acc_after_{SPEED_UPDATES}_updates')} | {fast} | {ms(e, 'dev_acc_after_1_epoch')} | "
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
    ax.set_title("UD v2.2, paired over treebanks (each treebank's seeds averaged)")
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
    text = markdown(rows, treebanks_of(rows))
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
