"""Score the fine-tuned models of an ``nlu.train`` run on the dev set, or write GLUE test predictions.

    python -m nlu.evaluate RUN_DIR [--split dev] [--mc-samples 20]      # the official dev metrics per seed
    python -m nlu.evaluate RUN_DIR --split test                          # <RUN_DIR>/predictions/seed<k>/<TASK>.tsv

RUN_DIR is an ``nlu.train`` output directory: each ``seed<k>`` is scored with the weights of its newest
checkpoint (the end of training once it finished). The task, the checkpoint the run started from and the
attention come from the run's ``config.json``; ``--model`` points at that checkpoint elsewhere. Test labels are
private, so ``--split test`` writes the files the GLUE server takes (``index<TAB>prediction``: label names,
STS-B scores clipped to [0, 5]). Writes ``<RUN_DIR>/evaluation-<split>.json``. A seed whose training has not
finished (no ``seed<k>.json``) is scored at its newest checkpoint and named as unfinished, on the terminal and in
the JSON (``finished`` per seed, ``unfinished_seeds``), with the seeds of the run that have no checkpoint.
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
    parser = argparse.ArgumentParser(prog="python -m nlu.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("run", help="an nlu.train output directory")
    parser.add_argument("--split", choices=("dev", "test"), default="dev", help="default dev")
    parser.add_argument("--model", help="the checkpoint the run fine-tuned (default: the run's config)")
    parser.add_argument("--data-root", help="directory holding glue/ (default: the run's, else $ATTN_DATA_ROOT)")
    parser.add_argument("--mc-samples", type=int, default=0,
                        help="average this many sampled passes (stochastic normalizers such as bam-wc; default 0: "
                             "the deterministic eval-mode forward)")
    parser.add_argument("--batch-size", type=int, default=128)
    add_runtime_options(parser)
    args = parser.parse_args(argv)
    if args.mc_samples < 0 or args.batch_size < 1:
        parser.error("--mc-samples must be 0 or more and --batch-size at least 1")
    return args


def seed_checkpoints(run: Path) -> list[tuple[int, Path]]:
    """``(seed, newest checkpoint)`` of every seed directory of ``run``."""
    from common.utils.checkpoint import Checkpointer

    found = []
    for directory in run.glob("seed*"):
        steps = Checkpointer(directory).paths()  # oldest first
        if steps and directory.name[4:].isdigit():
            found.append((int(directory.name[4:]), steps[-1]))
    if not found:
        raise FileNotFoundError(f"{run}: no seed<k>/checkpoints/step_<n>.pt; pass an nlu.train output directory")
    return sorted(found)


def _write_predictions(path: Path, spec, predictions) -> Path:
    from common.utils.io import atomic_write_text

    if spec.regression:
        values = [f"{min(max(float(p), 0.0), 5.0):.3f}" for p in predictions]
    else:
        values = [spec.labels[int(p)] for p in predictions]
    return atomic_write_text(path, "index\tprediction\n" + "".join(f"{i}\t{v}\n" for i, v in enumerate(values)))


@console.interruptible
@needs_extra("nlu")
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    run = Path(args.run)
    config = run / "config.json"
    try:
        if not config.is_file():
            raise FileNotFoundError(f"{run}: no config.json; pass an nlu.train output directory")
        checkpoints = seed_checkpoints(run)
    except FileNotFoundError as err:
        return console.fail(err)
    import torch
    from omegaconf import OmegaConf

    from common.utils import atomic_write_json, default_data_root, results_record
    from common.utils.cli import runtime_from
    from common.utils.runs import ScoredSeed, mean_std, planned_seeds, print_unfinished, unfinished_seeds

    from .data import read_split
    from .metrics import compute_metrics
    from .model import encode, load_classifier, load_tokenizer
    from .pretrained import resolve_model
    from .tasks import get_task
    from .predict import predict
    from .training import RUN_ERRORS

    try:
        cfg = OmegaConf.create(json.loads(config.read_text(encoding="utf-8")))
        runtime = runtime_from(args)
        spec, model_dir = get_task(cfg.task), resolve_model(args.model or str(cfg.model))
        tokenizer = load_tokenizer(model_dir)
        split = read_split(spec, args.split, default_data_root(args.data_root or cfg.data_root))
        encoded = encode(tokenizer, split, cfg.data.max_length)
        options = {"normalizer": cfg.attention.name, "normalizer_options": dict(cfg.attention.options)}
        per_seed, scored, written = [], [], []
        for seed, path in checkpoints:
            scored.append(ScoredSeed.of(seed, path, run / f"seed{seed}.json"))
            console.say(scored[-1].line())
            model, _ = load_classifier(model_dir, spec, options)
            model.load_state_dict(torch.load(path, map_location="cpu", weights_only=False)["model"])
            predictions = predict(model.to(runtime.device), tokenizer, spec, encoded, runtime, args.batch_size,
                                  args.mc_samples)
            record = scored[-1].record()
            if args.split == "dev":
                record.update({k: 100 * v for k, v in compute_metrics(spec, predictions, split.labels).items()})
                print(f"seed {seed}: {spec.name} dev " + ", ".join(f"{k} {record[k]:.2f}" for k in spec.metrics))
            else:
                written.append(_write_predictions(run / "predictions" / f"seed{seed}" / f"{spec.name}.tsv", spec,
                                                  predictions))
            per_seed.append(record)
    except RUN_ERRORS as err:
        return console.fail(err)
    planned = planned_seeds(cfg)
    summary = {} if args.split == "test" else {m: mean_std([r[m] for r in per_seed]) for m in spec.metrics}
    out = atomic_write_json(run / f"evaluation-{args.split}.json",
                            results_record({"split": args.split, "mc_samples": args.mc_samples}, task=spec.name,
                                           per_seed=per_seed, runtime=runtime.describe(),
                                           unfinished_seeds=unfinished_seeds(scored, planned), **summary))
    if summary:
        print(f"{spec.name} dev: " + ", ".join(f"{m} {s['mean']:.2f} +- {s['std']:.2f}" for m, s in summary.items())
              + f" over {len(per_seed)} seed(s)")
    print_unfinished(scored, planned, "python -m nlu.train")
    console.files_written([out, *written])
    return 0


if __name__ == "__main__":
    sys.exit(main())
