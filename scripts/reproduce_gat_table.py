"""Reproduce Table 1 of the BAM paper (Fan et al., NeurIPS 2020): GAT node classification.

    python scripts/reproduce_gat_table.py [--datasets Cora CiteSeer PubMed] [--seeds 10]
                                          [--variants softmax bam-lf bam-lc bam-wf bam-wc]
                                          [--out results/gat_table] [--threads 1] [key=value ...]

Trains every (variant, dataset) pair with ``graphattn.train`` (the settings of
``graphattn/configs/<dataset>.yaml``; ``key=value`` overrides apply to all runs), reusing
finished seeds, and writes ``<out>/table.md`` and ``<out>/table.json``: our test accuracy
(mean +- sample std over the seeds) beside the paper's (mean of 5 runs). A dataset whose raw
files are missing gets a "data missing" cell naming the file instead of stopping the grid.
``--table-only`` rebuilds the table from the ``results.json`` files already in ``--out``
(e.g. after running datasets in separate processes).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.utils import atomic_write_json, atomic_write_text, default_data_root, environment  # noqa: E402
from graphattn import train  # noqa: E402
from graphattn.config import load_config  # noqa: E402
from graphattn.data import PlanetoidDataError, check_raw_files  # noqa: E402

DATASETS = ("Cora", "CiteSeer", "PubMed")
VARIANTS = ("softmax", "bam-lf", "bam-lc", "bam-wf", "bam-wc")
LABELS = {"softmax": "GAT (softmax)", "bam-lf": "BAM-LF", "bam-lc": "BAM-LC", "bam-wf": "BAM-WF", "bam-wc": "BAM-WC"}
#: BAM paper, Table 1 (test accuracy, mean of 5 runs; the std is given for BAM-WC only).
PAPER = {
    "softmax": {"Cora": 83.00, "CiteSeer": 72.50, "PubMed": 77.26},
    "bam-lf": {"Cora": 83.24, "CiteSeer": 72.86, "PubMed": 78.30},
    "bam-lc": {"Cora": 83.34, "CiteSeer": 73.04, "PubMed": 78.76},
    "bam-wf": {"Cora": 83.48, "CiteSeer": 73.18, "PubMed": 78.50},
    "bam-wc": {"Cora": 83.81, "CiteSeer": 73.52, "PubMed": 78.82},
}
PAPER_STD = {"bam-wc": {"Cora": 0.3, "CiteSeer": 0.4, "PubMed": 0.3}}


def cell(result: Optional[Dict]) -> str:
    if result is None:
        return "not run"
    if "error" in result:
        return result["error"]
    acc = result["test_acc"]
    return f"{acc['mean']:.2f} ± {acc['std']:.2f}"


def paper_cell(variant: str, dataset: str) -> str:
    std = PAPER_STD.get(variant, {}).get(dataset)
    return f"{PAPER[variant][dataset]:.2f}" + (f" ± {std:.1f}" if std is not None else "")


def markdown(results: Dict[str, Dict[str, Dict]], datasets, variants) -> str:
    header = "| Attention | " + " | ".join(f"{d} (ours) | {d} (paper)" for d in datasets) + " |"
    lines = [header, "|" + "---|" * (1 + 2 * len(datasets))]
    for variant in variants:
        cells = []
        for dataset in datasets:
            cells += [cell(results.get(dataset, {}).get(variant)), paper_cell(variant, dataset)]
        lines.append(f"| {LABELS.get(variant, variant)} | " + " | ".join(cells) + " |")
    seeds = sorted({len(r["seeds"]) for per in results.values() for r in per.values() if "seeds" in r})
    note = (f"\nOurs: test accuracy (%), mean ± sample std over {'/'.join(map(str, seeds)) or '?'} seeds, "
            "early stopping on validation (graphattn.train). Paper: BAM Table 1, mean of 5 runs.\n")
    return "\n".join(lines) + "\n" + note


def collect(out: Path, datasets, variants) -> Dict[str, Dict[str, Dict]]:
    """The results.json of every (dataset, variant) already under ``out``."""
    found: Dict[str, Dict[str, Dict]] = {}
    for dataset in datasets:
        for variant in variants:
            path = out / dataset / variant / "results.json"
            if path.exists():
                found.setdefault(dataset, {})[variant] = json.loads(path.read_text())
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS[:2]), choices=DATASETS,
                        help="default: Cora CiteSeer (add PubMed where ind.pubmed.allx is available)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--data-root", help="directory holding planetoid/ (default: $ATTN_DATA_ROOT)")
    parser.add_argument("--out", type=Path, default=Path("results/gat_table"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--table-only", action="store_true", help="only rebuild the table from --out")
    parser.add_argument("--table-datasets", nargs="+", choices=DATASETS,
                        help="columns of the table (default: --datasets)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)

    missing: Dict[str, str] = {}
    if not args.table_only:
        for dataset in args.datasets:
            for variant in args.variants:
                overrides = [*args.overrides, f"seeds={args.seeds}", f"out_dir={args.out / dataset / variant}",
                             f"train.num_threads={args.threads}"]
                if args.data_root:
                    overrides.append(f"data_root={args.data_root}")
                try:
                    result = train.run(load_config(dataset, variant, overrides))
                except PlanetoidDataError as err:
                    missing[dataset] = str(err).splitlines()[1].strip()
                    print(f"{dataset}: skipped, {missing[dataset]}", file=sys.stderr)
                    break
                except ValueError as err:  # e.g. checkpoints of another config in --out
                    print(f"error: {dataset} {variant}: {err}", file=sys.stderr)
                    return 2
                acc = result["test_acc"]
                print(f"{dataset} {variant}: {acc['mean']:.2f} ± {acc['std']:.2f} "
                      f"({result['wall_seconds_this_run']:.0f} s)", flush=True)

    columns = args.table_datasets or args.datasets
    results = collect(args.out, columns, args.variants)
    for dataset in columns:
        if dataset not in results and dataset not in missing:
            try:
                check_raw_files(default_data_root(args.data_root) / "planetoid" / dataset / "raw", dataset)
            except PlanetoidDataError as err:
                missing[dataset] = str(err).splitlines()[1].strip()
    for dataset, reason in missing.items():
        file = reason.split()[1].rstrip(":") if reason.startswith("missing") else "raw files"
        for variant in args.variants:
            results.setdefault(dataset, {})[variant] = {"error": f"data missing ({file})"}
    table = markdown(results, columns, args.variants)
    atomic_write_text(args.out / "table.md", table)
    atomic_write_json(args.out / "table.json", {
        "ours": {d: {v: (r["test_acc"] if "test_acc" in r else r) for v, r in per.items()} for d, per in results.items()},
        "wall_seconds": {d: {v: r["wall_seconds_this_run"] for v, r in per.items() if "wall_seconds_this_run" in r}
                         for d, per in results.items()},
        "paper": PAPER, "environment": environment()})
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
