"""Equal-step comparisons of attention variants on Multi30k (CPU-sized), with learning curves.

    python scripts/reproduce_mt_compare.py lstm          # softmax vs BAM-WC LSTM seq2seq
    python scripts/reproduce_mt_compare.py transformer   # Transformer vs predictive vs evolving
    python scripts/reproduce_mt_compare.py transformer --steps 600 --out results/mt/compare

Each variant is one ``python -m mt.train`` run (resumable: rerun the command after an
interruption) with the same preset, seed and batches, stopped after ``--steps`` updates.
The script then writes ``<out>/<group>/comparison.json`` (validation perplexity and greedy
BLEU of every run at the last update they all reached, each run's test BLEU and training time,
and for every variant its paired-bootstrap difference in test BLEU to the group's first variant
over the test sentences, 1000 resamples, 95% interval: :func:`common.metrics.paired_bootstrap`)
and ``comparison.png`` (the runs' learning curves overlaid). Each variant is one run (one
seed): the bootstrap measures the test-set sampling noise of that pair of models, not the
seed-to-seed variation of training.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from common.utils import atomic_write_json, default_data_root

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


def paired_test_bleu(out: Path, names, data_root=None) -> dict:
    """``{split: {variant: bootstrap difference of tokenised test BLEU to names[0]}}`` from the
    hypotheses each finished run wrote (``<split>.hyp.txt``) and the split's references."""
    from common.metrics import bleu_item_stats, paired_bootstrap  # scipy
    from mt.bpe import remove_bpe
    from mt.run import RunFiles  # the models
    from mt.text import read_lines

    baseline = out / names[0]
    if not (baseline / "results.json").is_file():
        return {}
    files = RunFiles(baseline)
    prepared = files.prepared(default_data_root(data_root))
    found: dict = {}
    for split in files.config()["data"]["test_splits"]:
        hyps = {n: [remove_bpe(h) for h in read_lines(out / n / f"{split}.hyp.txt")]
                for n in names if (out / n / f"{split}.hyp.txt").is_file()}
        if names[0] not in hyps:
            continue
        refs = prepared.lines(split, "tok", "tgt")[: len(hyps[names[0]])]
        base, score = bleu_item_stats(hyps[names[0]], refs, tokenize="none", force=True)
        found[split] = {n: paired_bootstrap(base, bleu_item_stats(h, refs, tokenize="none", force=True)[0],
                                            score).as_dict()
                        for n, h in hyps.items() if n != names[0]}
    return found


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
    from common.utils import read_metrics  # common.utils.logger imports torch: only once the line is parsed

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
    names = [n for n in variants if n in runs]
    bootstrap = paired_test_bleu(out, names)
    atomic_write_json(out / "comparison.json", {"preset": preset, "compared_at_update": last, "runs": table,
                                                "test_bleu_vs_" + names[0]: bootstrap, "seeds_per_variant": 1,
                                                "overrides": {n: variants[n] for n in runs}, "common": common})
    from mt.plots import plot_runs  # matplotlib

    plot_runs(runs, out / "comparison.png", title=f"{args.group} variants on Multi30k ({preset})")
    for name, row in table.items():
        print(f"{name:12s} update {row.get('step')}: val ppl {row.get('val_ppl', float('nan')):.2f} "
              f"greedy BLEU {row.get('val_bleu_greedy', float('nan')):.2f} | test {row['test']} | "
              f"{row['train_seconds'] or 0:.0f}s")
    for split, per_variant in bootstrap.items():
        for name, d in per_variant.items():
            print(f"{split}: {name} - {names[0]} test BLEU {d['delta']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] "
                  f"(paired bootstrap over sentences, one seed each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
