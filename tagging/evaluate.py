"""Score the taggers of a ``tagging.train`` run on a treebank split: accuracy over all, OOV and ambiguous words.

    python -m tagging.evaluate RUN_DIR [--split test] [--treebank DIR] [--mc-samples 20]

RUN_DIR is a run directory (its ``seed<k>/best.pt`` files are scored) or one ``best.pt``. The treebank
is the one the run trained on, under ``--data-root`` (default: the run's, else $ATTN_DATA_ROOT), unless
``--treebank`` names another (any UD treebank directory: the words are looked up in the run's
vocabularies, so OOV and ambiguous stay relative to the training data). Writes
``<RUN_DIR>/evaluation-<treebank>-<split>.json``. A seed whose training has not finished (no ``seed<k>.json``
beside its directory) is scored at its best weights so far and named as unfinished, on the terminal and in the
JSON (``finished`` per seed, ``unfinished_seeds``), with the seeds of the run that have no checkpoint.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from common.utils import console
from common.utils.cli import add_runtime_options
from common.utils.extras import needs_extra


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tagging.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a tagging.train output directory, or one best.pt")
    parser.add_argument("--split", choices=("train", "dev", "test"), default="test", help="default test")
    parser.add_argument("--treebank", help="another treebank (name under <data-root>/ud, or a directory)")
    parser.add_argument("--data-root", help="directory holding ud/ (default: the run's, else $ATTN_DATA_ROOT)")
    parser.add_argument("--mc-samples", type=int, default=0,
                        help="average this many sampled passes (stochastic normalizers such as bam-wc; default 0: "
                             "the deterministic eval-mode forward)")
    add_runtime_options(parser)
    args = parser.parse_args(argv)
    if args.mc_samples < 0:
        parser.error("--mc-samples must be 0 or more")
    return args


def checkpoints(run: Path) -> list[Path]:
    if run.is_file():
        return [run]
    found = sorted(run.glob("seed*/best.pt"), key=lambda p: (len(p.parent.name), p.parent.name))  # seed2 < seed10
    if not found:
        raise FileNotFoundError(f"{run}: no seed<k>/best.pt; pass a tagging.train output directory or a best.pt")
    return found


@console.interruptible
@needs_extra("tagging")
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    run = Path(args.run)
    try:
        paths = checkpoints(run)
    except FileNotFoundError as err:
        return console.fail(err)
    import numpy as np
    import torch
    from omegaconf import OmegaConf

    from common.utils import atomic_write_json, default_data_root, results_record
    from common.utils.cli import runtime_from
    from common.utils.runs import ScoredSeed, planned_seeds, print_unfinished, unfinished_seeds

    from .data import Vocabulary, encode, read_conllu, split_files, treebank_dir
    from .metrics import GROUPS
    from .predict import build_model, evaluate
    from .training import RUN_ERRORS

    try:
        runtime = runtime_from(args)
        per_seed, scored, cache = [], [], {}
        for path in paths:
            saved = torch.load(path, map_location="cpu", weights_only=False)
            scored.append(ScoredSeed.of(saved["seed"], path, path.parent.parent / f"seed{saved['seed']}.json"))
            console.say(scored[-1].line())
            cfg = OmegaConf.create(saved["config"])
            vocab = Vocabulary.from_state(saved["vocab"])
            root = default_data_root(args.data_root or cfg.data_root)
            directory = treebank_dir(root, args.treebank or cfg.treebank)
            if directory not in cache:
                cache[directory] = read_conllu(split_files(directory)[args.split])
            model = build_model(cfg, vocab).to(runtime.device)
            model.load_state_dict(saved["model"])
            chunks = encode(cache[directory], vocab, cfg.data.max_len, cfg.data.max_word_chars)
            scores = evaluate(model, chunks, runtime, args.mc_samples)
            per_seed.append({**scored[-1].record(), **scores})
            print(f"seed {saved['seed']}: {directory.name} {args.split} accuracy {scores['all']:.2f} "
                  f"(OOV {scores['oov']:.2f} of {scores['oov_words']} words, ambiguous {scores['ambiguous']:.2f})")
    except RUN_ERRORS as err:  # TreebankError among them
        return console.fail(err)
    summary = {metric: {"mean": float(np.nanmean([r[metric] for r in per_seed])),
                        "std": float(np.std([r[metric] for r in per_seed], ddof=1)) if len(per_seed) > 1 else 0.0}
               for metric in GROUPS}
    out = (run if run.is_dir() else run.parent) / f"evaluation-{directory.name}-{args.split}.json"
    config = out.parent / "config.json"
    planned = planned_seeds(json.loads(config.read_text(encoding="utf-8"))) if run.is_dir() and config.is_file() \
        else []
    atomic_write_json(out, results_record({"split": args.split, "mc_samples": args.mc_samples},
                                          treebank=directory.name, per_seed=per_seed, runtime=runtime.describe(),
                                          unfinished_seeds=unfinished_seeds(scored, planned), **summary))
    print(f"{directory.name} {args.split}: accuracy {summary['all']['mean']:.2f} +- {summary['all']['std']:.2f} over "
          f"{len(per_seed)} seed(s) (OOV {summary['oov']['mean']:.2f}, ambiguous {summary['ambiguous']['mean']:.2f})")
    print_unfinished(scored, planned, "python -m tagging.train")
    console.files_written([out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
