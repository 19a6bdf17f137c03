"""Equal-step comparisons of attention variants on Multi30k (CPU-sized), with learning curves.

    python scripts/reproduce_mt_compare.py lstm          # softmax vs BAM-WC LSTM seq2seq
    python scripts/reproduce_mt_compare.py transformer   # Transformer vs predictive vs evolving
    python scripts/reproduce_mt_compare.py transformer --steps 600 --out results/mt/compare

Each variant is one ``python -m mt.train`` run (resumable: rerun the command after an
interruption) with the same preset, seed and batches, stopped after ``--steps`` updates.
The script then writes ``<out>/<group>/comparison.json`` (validation perplexity and greedy
BLEU of every run at the last update they all reached, and each run's test BLEU and training
time) and ``comparison.png`` (the runs' learning curves overlaid).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from common.utils import atomic_write_json, read_metrics
from mt.plots import plot_runs

GROUPS = {
    "lstm": ("lstm-cpu", {
        "softmax": [],
        "bam-wc": ["model.normalizer=bam-wc", "model.normalizer_options={k: 10, beta: 1.0}",
                   "kl.weight=1.0", "kl.schedule=linear", "kl.warmup=500"],
    }),
    "transformer": ("transformer-cpu", {
        "transformer": [],
        "predictive": ["model.encoder_attention.cross_layer={kind: predictive, alpha: 0.1}"],
        "evolving": ["model.encoder_attention.cross_layer={kind: evolving, alpha: 0.1, beta: 0.1}",
                     "model.decoder_attention.cross_layer={kind: evolving, alpha: 0.1, beta: 0.1}",
                     "model.cross_attention.cross_layer={kind: evolving, alpha: 0.1, beta: 0.1}"],
    }),
}


def at_step(records: list, step: int) -> dict:
    """The validation record logged nearest to ``step`` (runs that validate per epoch may have
    epochs of slightly different lengths); its own update count is reported with it."""
    found = [r for r in records if "val/bleu" in r]
    if not found:
        return {}
    best = min(found, key=lambda r: (abs(r["step"] - step), r["step"]))
    return {"step": best["step"], "epoch": best.get("epoch"), "val_ppl": best["val/ppl"],
            "val_bleu_greedy": best["val/bleu"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("group", choices=sorted(GROUPS))
    parser.add_argument("--steps", type=int, default=None, help="updates per run (default: the preset's)")
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("results/mt/compare"))
    parser.add_argument("--only", action="append", default=None, help="run only this variant (repeatable)")
    parser.add_argument("--summary-only", action="store_true", help="train nothing; summarise the existing runs")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = parser.parse_intermixed_args(argv)
    preset, variants = GROUPS[args.group]
    common = list(args.overrides) + ["train.progress=false"]
    if args.steps:
        common += [f"train.max_steps={args.steps}", "train.max_epochs=1000", "train.patience=0"]
    if args.eval_every:
        common.append(f"train.eval_every={args.eval_every}")
    out = args.out / args.group
    for name, extra in variants.items():
        if args.summary_only or (args.only and name not in args.only):
            continue
        cmd = [sys.executable, "-m", "mt.train", "--preset", preset, "--out", str(out / name), *common, *extra]
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            print(f"{name} failed", file=sys.stderr)
            return 1
    runs = {name: read_metrics(out / name / "metrics.jsonl") for name in variants if (out / name).is_dir()}
    finished = {name: json.loads((out / name / "results.json").read_text()) for name in runs
                if (out / name / "results.json").is_file()}
    last = min(max(r["step"] for r in recs if "val/bleu" in r) for recs in runs.values())
    table = {name: {**at_step(runs[name], last),
                    "train_seconds": finished.get(name, {}).get("train_seconds"),
                    "test": {s: {"bleu": v["bleu"], "sacrebleu": v["sacrebleu"]}
                             for s, v in finished.get(name, {}).get("splits", {}).items()}}
             for name in runs}
    atomic_write_json(out / "comparison.json", {"preset": preset, "compared_at_update": last, "runs": table,
                                                "overrides": {n: variants[n] for n in runs}, "common": common})
    plot_runs(runs, out / "comparison.png", title=f"{args.group} variants on Multi30k ({preset})")
    for name, row in table.items():
        print(f"{name:12s} update {row.get('step')}: val ppl {row.get('val_ppl', float('nan')):.2f} "
              f"greedy BLEU {row.get('val_bleu_greedy', float('nan')):.2f} | test {row['test']} | "
              f"{row['train_seconds'] or 0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
