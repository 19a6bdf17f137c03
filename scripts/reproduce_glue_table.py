"""Reproduce the BAM paper's GLUE experiment (Table 5: ALBERT-base +- BAM-WC on MRPC, CoLA, RTE, STS-B) with a
pretrained encoder that can be had here (default: MiniLM-L6), seeds paired, then write the table.

    python scripts/reproduce_glue_table.py --tasks MRPC RTE --seeds 10 --jobs 2        # softmax, bam-wc, official
    python scripts/reproduce_glue_table.py --tasks CoLA STS-B --rows softmax bam-wc --seeds 5 --jobs 2
    python scripts/reproduce_glue_table.py --table-only                                 # the table from the runs so far

Each cell is one seed of one row on one task, a ``python -m nlu.train`` run (``--threads 1``; ``--jobs`` at a
time) into ``<out>/<task>/<row>/seed<k>``; finished cells are skipped, so an interrupted grid resumes. Cells run
seed by seed, so that every row has the same seeds whenever the grid stops. Rows: ``softmax`` (the pretrained
attention), ``bam-wc`` (k = 10, contextual prior, KL weight 0.01 with its gradient) and ``official`` (BAM-WC with
the KL detached, as the authors' ALBERT code; ``nlu/configs/official.yaml``).

Written to ``<out>``: ``table.md`` and ``table.json``: per task and row the dev metrics' mean +- std (ddof=1)
and n; per BAM row the paired difference to ``softmax`` over the seeds both have, with its 95% t-interval and
minimal detectable difference; beside them the paper's ALBERT-base numbers (a different encoder).
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
from nlu.tasks import TASKS, get_task  # noqa: E402

#: The rows and the options each trains with.
ROWS = {"softmax": [], "bam-wc": ["--attention", "bam-wc", "attention.options.k=10", "kl.weight=0.01"],
        "official": ["--preset", "official"]}
#: BAM paper, Table 5 (ALBERT-base, GLUE dev; the paper gives one number per cell, no seeds or spread).
PAPER = {"MRPC": (86.5, 88.5), "CoLA": (54.5, 55.8), "RTE": (75.8, 76.2), "STS-B": (90.3, 91.1)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["MRPC", "RTE"], help=f"of {', '.join(TASKS)}")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--seeds", type=int, default=10, help="seeds per cell (default 10)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, each on one thread (default 1)")
    parser.add_argument("--model", help="minilm-l6 (default) or a local Hugging Face checkpoint directory")
    parser.add_argument("--data-root", help="directory holding glue/ (default: $ATTN_DATA_ROOT)")
    parser.add_argument("--out", default="runs/glue-table", help="output directory (default runs/glue-table)")
    parser.add_argument("--table-only", action="store_true", help="write the table from the runs so far")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every run")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.seeds < 1:
        parser.error("--jobs and --seeds must be at least 1")
    try:
        args.tasks = [get_task(t).name for t in args.tasks]
    except ValueError as err:
        parser.error(str(err))
    return args


def grid(args) -> List[Cell]:
    """The unfinished cells, seed by seed."""
    cells = []
    for seed in range(args.seeds):
        for task in args.tasks:
            for row in args.rows:
                out = Path(args.out) / task / row / f"seed{seed}"
                if (out / "results.json").exists():
                    continue
                cmd = [sys.executable, "-m", "nlu.train", "--task", task, "--threads", "1", "--no-progress",
                       "--out", str(out), f"first_seed={seed}", "seeds=1", *ROWS[row], *args.overrides]
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
            found[record["task"]][path.parent.parent.name][seed_record["seed"]] = {**seed_record,
                                                                                  "model": record["model"]}
    return found


def build_table(found) -> dict:
    """Per task and row: each metric's statistics; for BAM rows the paired difference to softmax."""
    from common.metrics.paired import paired_t

    table = {}
    for task, rows in found.items():
        spec = get_task(task)
        table[task] = {"main_metric": spec.main_metric, "paper_albert": PAPER.get(task), "rows": {}}
        for row, seeds in sorted(rows.items(), key=lambda item: list(ROWS).index(item[0])):
            entry = {m: mean_std([seeds[s]["dev"][m] for s in sorted(seeds)]) for m in spec.metrics}
            entry["seeds"] = sorted(seeds)
            entry["encoders"] = sorted({Path(r["model"]).name for r in seeds.values()})
            entry["train_seconds_mean"] = mean_std([r["train_seconds"] for r in seeds.values()])["mean"]
            base = rows.get("softmax", {})
            shared = sorted(set(seeds) & set(base))
            if row != "softmax" and len(shared) >= 2:
                entry["paired_vs_softmax"] = {
                    m: paired_t([base[s]["dev"][m] for s in shared], [seeds[s]["dev"][m] for s in shared]).as_dict()
                    for m in spec.metrics}
            table[task]["rows"][row] = entry
    return table


def markdown(table: dict) -> str:
    lines = ["| task | row | " + "dev metrics, mean +- std (n) | BAM - softmax, 95% CI (MDD) | paper, ALBERT-base |",
             "|---|---|---|---|---|"]
    for task, t in table.items():
        for row, entry in t["rows"].items():
            metrics = ", ".join(f"{m} {entry[m]['mean']:.2f} +- {entry[m]['std']:.2f} (n={entry[m]['n']})"
                                for m in get_task(task).metrics)
            paired = entry.get("paired_vs_softmax", {})
            diff = "; ".join(f"{m} {d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] ({d['mdd']:.2f}, n={d['n']})"
                             for m, d in paired.items()) or "-"
            paper = t["paper_albert"]
            cited = "-" if paper is None else f"{paper[0] if row == 'softmax' else paper[1]:.1f}"
            lines.append(f"| {task} | {row} ({', '.join(entry['encoders'])}) | {metrics} | {diff} | {cited} |")
    lines += ["", "Dev set, last epoch of 3 (no selection on dev). Paired: the same seeds (data order and head "
                  "initialisation) in both rows; MDD = the smallest true difference detected with power 0.8. The "
                  "paper's column is ALBERT-base, one run per cell (its Table 5); ours is the encoder named in "
                  "the row."]
    return "\n".join(lines) + "\n"


def write_table(args) -> None:
    from common.utils.io import atomic_write_json, atomic_write_text

    found = load_results(Path(args.out))
    if not found:
        print(f"no finished runs under {args.out}", file=sys.stderr)
        return
    table = build_table(found)
    atomic_write_json(Path(args.out) / "table.json", table)
    atomic_write_text(Path(args.out) / "table.md", markdown(table))
    print(markdown(table))


def main(argv=None) -> int:
    args = parse_args(argv)
    failed = [] if args.table_only else run_cells(grid(args), args.jobs, cwd=ROOT)
    write_table(args)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
