"""Reproduce the BAM paper's GLUE experiment (Table 5: ALBERT-base +- BAM on MRPC, CoLA, RTE, STS-B) with a
pretrained encoder that can be had here (default: MiniLM-L6), seeds paired, then write the table.

    python scripts/reproduce_glue_table.py --tasks MRPC RTE --seeds 10 --jobs 2         # the authors' setup, 2 arms
    python scripts/reproduce_glue_table.py --tasks CoLA STS-B --seeds 5 --jobs 2
    python scripts/reproduce_glue_table.py --tasks RTE --first-seed 5 --seeds 5 --jobs 10  # seeds 5-9 elsewhere
    python scripts/reproduce_glue_table.py --tasks MRPC --rows standard-softmax standard-bam-wc \
        standard-bam-wc-kl0.001 standard-bam-wc-kl0 --seeds 5 --jobs 2                   # the KL-weight sweep
    python scripts/reproduce_glue_table.py --table-only                       # the table from the runs so far
    python scripts/reproduce_glue_table.py --table-only --merge docs/tables/glue-table.json   # and a table's seeds

Each cell is one seed of one row on one task, a ``python -m nlu.train`` run (``--threads 1``; ``--jobs`` at a
time) into ``<out>/<task>/<row>/seed<k>``; finished cells are skipped, so an interrupted grid resumes. Cells run
seed by seed, so that every row has the same seeds whenever the grid stops. Rows (:data:`ROWS`): the ``official``
preset's two arms (``nlu/configs/official.yaml``: the authors' steps, learning rate and batch per task; BAM with
k = 10 and the constant Gamma(1e-4, 1e-4) prior, the KL detached, no attention dropout on BAM, the checkpoint's on
softmax), and the ``standard`` recipe's softmax and BAM-WC (contextual prior, KL with its gradient) at three KL
weights.

Written to ``<out>``: ``table.md`` and ``table.json``: per task and row the dev metrics' mean +- std (ddof=1) and
n; per BAM row the paired difference to its softmax arm over the seeds both have, with its 95% t-interval, minimal
detectable difference, the main metric's p Holm-adjusted over the comparisons with the same softmax arm, and the
verdict; per BAM row over the tasks, how many show a gain or a loss, a sign test and a random-effects mean of the
main metrics' differences; beside them the paper's ALBERT-base numbers (another encoder).
The commit of every run is in its ``results.json``; the table lists the commits it was built from.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.utils.grid import Cell, add_grid_options, check_grid_options, run_cells, stop_seconds  # noqa: E402
from common.utils.runs import mean_std  # noqa: E402
from nlu.tasks import TASKS, get_task  # noqa: E402


class Row(NamedTuple):
    """A row of the table: the ``nlu.train`` options it trains with and the row it is paired with (its softmax arm)."""

    options: List[str]
    baseline: Optional[str] = None


_STANDARD_BAM = ["--attention", "bam-wc", "attention.options.k=10"]
#: The rows, each with its options and its softmax arm.
ROWS: Dict[str, Row] = {
    "official-softmax": Row(["--preset", "official", "--attention", "softmax"]),
    "official-bam": Row(["--preset", "official"], "official-softmax"),
    "standard-softmax": Row([]),
    "standard-bam-wc": Row([*_STANDARD_BAM, "kl.weight=0.01"], "standard-softmax"),
    "standard-bam-wc-kl0.001": Row([*_STANDARD_BAM, "kl.weight=0.001"], "standard-softmax"),
    "standard-bam-wc-kl0": Row([*_STANDARD_BAM, "kl.weight=0"], "standard-softmax"),
}
DEFAULT_ROWS = ["official-softmax", "official-bam"]
#: BAM paper, Table 5 (ALBERT-base, GLUE dev; the paper gives one number per cell, no seeds or spread).
PAPER = {"MRPC": (86.5, 88.5), "CoLA": (54.5, 55.8), "RTE": (75.8, 76.2), "STS-B": (90.3, 91.1)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["MRPC", "RTE"], help=f"of {', '.join(TASKS)}")
    parser.add_argument("--rows", nargs="+", default=DEFAULT_ROWS, choices=list(ROWS),
                        help=f"default: {' '.join(DEFAULT_ROWS)}")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per cell (default 10)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the first seed (default 0): cells take seeds first-seed .. first-seed + seeds - 1, so "
                             "that a grid can be split over machines and its tables merged (--merge)")
    add_grid_options(parser)
    parser.add_argument("--model", help="minilm-l6 (default) or a local Hugging Face checkpoint directory")
    parser.add_argument("--data-root", help="directory holding glue/ (default: $ATTN_DATA_ROOT)")
    parser.add_argument("--out", default="runs/glue-table", help="output directory (default runs/glue-table)")
    parser.add_argument("--table-only", action="store_true", help="write the table from the runs so far")
    parser.add_argument("--merge", nargs="+", default=[], metavar="TABLE_JSON",
                        help="also take the per-seed records of these table.json files (runs of the same grid made "
                             "elsewhere); a seed found twice must have the same record")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every run")
    args = parser.parse_args(argv)
    check_grid_options(parser, args)
    if args.seeds < 1 or args.first_seed < 0:
        parser.error("--seeds must be at least 1 and --first-seed at least 0")
    try:
        args.tasks = [get_task(t).name for t in args.tasks]
    except ValueError as err:
        parser.error(str(err))
    return args


def grid(args) -> List[Cell]:
    """The unfinished cells, seed by seed."""
    cells = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for task in args.tasks:
            for row in args.rows:
                out = Path(args.out) / task / row / f"seed{seed}"
                if (out / "results.json").exists():
                    continue
                cmd = [sys.executable, "-m", "nlu.train", "--task", task, "--threads", "1", "--no-progress",
                       "--out", str(out), f"first_seed={seed}", "seeds=1", *ROWS[row].options, *args.overrides]
                cmd += ["--model", args.model] if args.model else []
                cmd += ["--data-root", args.data_root] if args.data_root else []
                cells.append(Cell(f"{task} {row} seed {seed}", cmd, out))
    return cells


def load_results(out: Path) -> Dict[str, Dict[str, Dict[int, dict]]]:
    """``{task: {row: {seed: per-seed record}}}`` of every finished cell under ``out``."""
    found: Dict[str, Dict[str, Dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for path in sorted(out.glob("*/*/seed*/results.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        for seed_record in record["per_seed"]:
            found[record["task"]][path.parent.parent.name][seed_record["seed"]] = {
                **seed_record, "model": record["model"], "commit": record.get("environment", {}).get("git_commit")}
    return found


#: What the table keeps of each seed's record: enough to build the table again (:func:`found_in_table`).
RECORD_KEYS = ("dev", "train_seconds", "model", "commit")


def found_in_table(table: dict) -> Dict[str, Dict[str, Dict[int, dict]]]:
    """The per-seed records a ``table.json`` was built from, as :func:`load_results` gives them: a committed
    table can be recomputed without the runs."""
    return {task: {row: {int(seed): record for seed, record in entry["per_seed"].items()}
                   for row, entry in t["rows"].items()} for task, t in table["tasks"].items()}


def table_records(path: str) -> Dict[str, Dict[str, Dict[int, dict]]]:
    """:func:`found_in_table` of a ``table.json`` file; an unreadable or foreign file is an error naming it."""
    try:
        return found_in_table(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path}: not a table.json of this script ({type(err).__name__}: {err}); give the "
                         "table.json that reproduce_glue_table.py wrote") from err


def merge_found(founds: List[Dict[str, Dict[str, Dict[int, dict]]]], sources: List[str]
                ) -> Dict[str, Dict[str, Dict[int, dict]]]:
    """The per-seed records of several grids (:func:`load_results`, :func:`found_in_table`) in one. A cell found in
    two with different records is an error naming it and the two ``sources`` (one per grid): the same seed run twice
    is not two seeds."""
    merged: Dict[str, Dict[str, Dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    origin = {}
    for source, found in zip(sources, founds):
        for task, rows in found.items():
            for row, seeds in rows.items():
                for seed, record in seeds.items():
                    kept = {key: record.get(key) for key in RECORD_KEYS}
                    if seed in merged[task][row] and merged[task][row][seed] != kept:
                        raise ValueError(f"{task} {row} seed {seed} is in {origin[task, row, seed]} and in {source} "
                                         "with different results; remove one of them (each seed is one run)")
                    merged[task][row][seed], origin[task, row, seed] = kept, source
    return merged


#: The family-wise error rate of the verdicts.
ALPHA = 0.05


def verdict(difference: dict, p_holm: float) -> str:
    """A paired difference's verdict from its Holm-adjusted p: ``gain`` / ``loss`` (by the sign of the mean) where it
    is below :data:`ALPHA`, else ``none detected``. A verdict of ``gain`` or ``loss`` implies that the 95%
    interval excludes 0; an interval that excludes 0 alone is not enough once several comparisons are made."""
    if p_holm >= ALPHA:
        return "none detected"
    return "gain" if difference["mean"] > 0 else "loss"


def _holm_by_arm(tasks: dict) -> None:
    """Holm's correction of the main metric's p over each family, the comparisons with the same softmax arm (the
    official recipe's: one per task; the standard recipe's: each KL weight on each task); then the verdicts."""
    from common.metrics.paired import holm_adjust

    families = defaultdict(list)
    for t in tasks.values():
        for entry in t["rows"].values():
            if "paired" in entry:
                families[entry["paired"]["baseline"]].append((entry, entry["paired"][t["main_metric"]]))
    for family in families.values():
        for (entry, difference), p in zip(family, holm_adjust([d["p"] for _, d in family])):
            entry["p_holm"], entry["family_size"] = p, len(family)
            entry["verdict"] = verdict(difference, p)


def build_table(found) -> dict:
    """Per task and row: each metric's statistics; for BAM rows the paired difference to their softmax arm (with its
    two-sided p), the main metric's Holm-adjusted p over the comparisons with the same arm (:func:`_holm_by_arm`)
    and the verdict. Under ``across_tasks``, per BAM row: the main metrics' verdicts over the tasks, a sign test and
    a random-effects mean of the differences."""
    from common.metrics.paired import paired_p_value, paired_t

    table = {"tasks": {}}
    for task, rows in sorted(found.items(), key=lambda item: list(TASKS).index(item[0])):  # table.json's order:
        # the sums over tasks below come out alike however the runs were found
        spec = get_task(task)
        entries = table["tasks"][task] = {"main_metric": spec.main_metric, "paper_albert": PAPER.get(task),
                                          "rows": {}}
        for row, seeds in sorted(rows.items(), key=lambda item: list(ROWS).index(item[0])):
            entry = {m: mean_std([seeds[s]["dev"][m] for s in sorted(seeds)]) for m in spec.metrics}
            entry["seeds"] = sorted(seeds)
            entry["encoders"] = sorted({Path(r["model"]).name for r in seeds.values()})
            entry["commits"] = sorted({r["commit"] or "unknown" for r in seeds.values()})
            entry["train_seconds_mean"] = mean_std([r["train_seconds"] for r in seeds.values()])["mean"]
            entry["per_seed"] = {s: {key: seeds[s][key] for key in RECORD_KEYS} for s in sorted(seeds)}
            baseline = ROWS[row].baseline
            base = rows.get(baseline, {}) if baseline else {}
            shared = sorted(set(seeds) & set(base))
            if len(shared) >= 2:
                pairs = {m: ([base[s]["dev"][m] for s in shared], [seeds[s]["dev"][m] for s in shared])
                         for m in spec.metrics}
                entry["paired"] = {"baseline": baseline, "seeds": shared, **{
                    m: {**paired_t(a, b).as_dict(), "p": paired_p_value(a, b)} for m, (a, b) in pairs.items()}}
            entries["rows"][row] = entry
    _holm_by_arm(table["tasks"])
    table["across_tasks"] = across_tasks(table["tasks"])
    table["kl_sweep"] = kl_sweep(table["tasks"])
    return table


#: The KL-weight sweep's reference row: the standard recipe's BAM-WC at the preset's weight.
SWEEP_REFERENCE = "standard-bam-wc"


def kl_weight(row: str) -> float:
    """The ``kl.weight`` a row's options set."""
    return next(float(option.split("=", 1)[1]) for option in ROWS[row].options if option.startswith("kl.weight="))


def kl_sweep(tasks: dict) -> dict:
    """Per task where the sweep ran: each other KL weight's row minus :data:`SWEEP_REFERENCE` on the main metric, paired
    over the seeds both have, its p Holm-adjusted over the task's sweep comparisons. This tests directly whether the KL
    term at the preset's weight holds fine-tuning back (each row against softmax does not)."""
    from common.metrics.paired import holm_adjust, paired_p_value, paired_t

    sweep = {}
    for task, t in tasks.items():
        rows, metric = t["rows"], t["main_metric"]
        if SWEEP_REFERENCE not in rows:
            continue
        reference = rows[SWEEP_REFERENCE]["per_seed"]
        comparisons = {}
        for row in ROWS:
            shared = sorted(set(rows.get(row, {}).get("per_seed", {})) & set(reference))
            if row.startswith(SWEEP_REFERENCE + "-kl") and len(shared) >= 2:
                a = [reference[s]["dev"][metric] for s in shared]
                b = [rows[row]["per_seed"][s]["dev"][metric] for s in shared]
                comparisons[row] = {"kl_weight": kl_weight(row), **paired_t(a, b).as_dict(), "p": paired_p_value(a, b)}
        for entry, p in zip(comparisons.values(), holm_adjust([c["p"] for c in comparisons.values()])):
            entry["p_holm"] = p
        if comparisons:
            sweep[task] = {"reference_kl_weight": kl_weight(SWEEP_REFERENCE), "metric": metric, "rows": comparisons}
    return sweep


def across_tasks(tasks: dict) -> dict:
    """Per BAM row run on two or more tasks: the verdicts of the tasks' main metrics, a two-sided sign test of their
    mean differences and a DerSimonian-Laird random-effects mean of them (points of each task's main metric)."""
    from scipy import stats

    from common.metrics.paired import random_effects_mean

    summary = {}
    for row, spec in ROWS.items():
        paired = {task: t["rows"][row] for task, t in tasks.items() if "paired" in t["rows"].get(row, {})}
        if spec.baseline is None or len(paired) < 2:
            continue
        diffs = {task: e["paired"][tasks[task]["main_metric"]] for task, e in paired.items()}
        gains = sum(d["mean"] > 0 for d in diffs.values())
        summary[row] = {
            "tasks": sorted(diffs), "verdicts": {task: e["verdict"] for task, e in paired.items()},
            "higher_mean": gains, "sign_test_p": float(stats.binomtest(gains, len(diffs)).pvalue),
            "random_effects": random_effects_mean([d["mean"] for d in diffs.values()],
                                                  [d["sd"] / d["n"] ** 0.5 for d in diffs.values()])}
    return summary


def spread(stats: dict) -> str:
    """``mean +- std (n=k)``; one seed has no spread: ``mean (n=1)``."""
    return f"{stats['mean']:.2f}" + (f" +- {stats['std']:.2f}" if stats["n"] > 1 else "") + f" (n={stats['n']})"


def markdown(table: dict) -> str:
    from common.metrics.paired import format_p

    lines = ["| task | row | dev metrics, mean +- std (n) | BAM - softmax arm, 95% CI (MDD, n) | Holm p (m) | verdict "
             "| paper, ALBERT-base |", "|---|---|---|---|---|---|---|"]
    for task, t in table["tasks"].items():
        for row, entry in t["rows"].items():
            metrics = ", ".join(f"{m} {spread(entry[m])}" for m in get_task(task).metrics)
            paired = entry.get("paired", {})
            diff = "; ".join(f"{m} {paired[m]['mean']:+.2f} [{paired[m]['low']:+.2f}, {paired[m]['high']:+.2f}] "
                             f"({paired[m]['mdd']:.2f}, n={paired[m]['n']})" for m in get_task(task).metrics
                             if m in paired) or "-"
            paper = t["paper_albert"]
            cited = "-" if paper is None else f"{paper[0] if ROWS[row].baseline is None else paper[1]:.1f}"
            holm = f"{format_p(entry['p_holm'])} ({entry['family_size']})" if "p_holm" in entry else "-"
            lines.append(f"| {task} | {row} ({', '.join(entry['encoders'])}) | {metrics} | {diff} | {holm} | "
                         f"{entry.get('verdict', '-')} | {cited} |")
    lines += ["", "Dev set at the last update (no selection on dev). Paired: the same seeds (data order and head "
                  "initialisation) in both arms; MDD = the smallest true difference detected with power 0.8. Holm p: "
                  "the main metric's paired t-test, Holm-adjusted over the m comparisons with the same softmax arm "
                  "(official: one per task; standard: each KL weight on each task); the verdict is gain or loss where "
                  "it is below 0.05, else none detected. The paper's column is ALBERT-base, one run per cell (its "
                  "Table 5); ours is the encoder named in the row."]
    for row, summary in table["across_tasks"].items():
        effects = summary["random_effects"]
        lines += ["", f"{row} over {len(summary['tasks'])} tasks ({', '.join(summary['tasks'])}): "
                      f"{summary['higher_mean']} with a higher mean than softmax "
                      f"(sign test p = {summary['sign_test_p']:.2f}); verdicts "
                      + ", ".join(f"{task} {v}" for task, v in summary["verdicts"].items())
                      + f"; random-effects mean {effects['mean']:+.2f} [{effects['low']:+.2f}, {effects['high']:+.2f}]"
                      f" points (tau {effects['tau']:.2f})."]
    for task, sweep in table.get("kl_sweep", {}).items():
        lines += ["", f"KL-weight sweep on {task} (standard recipe, BAM-WC), each weight minus weight "
                      f"{sweep['reference_kl_weight']:g}, {sweep['metric']} paired by seed, 95% CI (MDD, n, "
                      f"Holm p over {len(sweep['rows'])}): " + "; ".join(
                          f"{c['kl_weight']:g}: {c['mean']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] ({c['mdd']:.2f}, "
                          f"n={c['n']}, {format_p(c['p_holm'])})" for c in sweep["rows"].values()) + "."]
    return "\n".join(lines) + "\n"


def write_table(args) -> None:
    from common.utils.io import atomic_write_json, atomic_write_text

    try:
        found = merge_found([*map(table_records, args.merge), load_results(Path(args.out))], [*args.merge, args.out])
    except ValueError as err:
        raise SystemExit(f"--merge: {err}") from err
    if not found:
        print(f"no finished runs under {args.out}", file=sys.stderr)
        return
    table = build_table(found)
    atomic_write_json(Path(args.out) / "table.json", table)
    atomic_write_text(Path(args.out) / "table.md", markdown(table))
    print(markdown(table))


def main(argv=None) -> int:
    args = parse_args(argv)
    failed = [] if args.table_only else run_cells(grid(args), args.jobs, cwd=ROOT, stop_after=stop_seconds(args))
    write_table(args)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
