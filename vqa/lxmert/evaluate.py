"""Evaluate a fine-tuned LXMERT run on a split; write predictions (official format) and accuracy.

    python -m vqa.lxmert.evaluate runs/lxmert/layerdrop [--split val|test] [--no-prune] [--data-root DIR]

Reads the run's ``config.json``, ``lxmert_config.json``, ``answers.json`` and newest checkpoint.
Writes ``<run>/<split>_predictions.json`` (``[{"question_id", "answer"}]``, the format the VQA
evaluation server takes for test-dev/test-std) and ``<run>/eval_<split>.json`` (official accuracy
when the split has annotations, FLOPs per question, which layers ran, config and versions). The
span/alpha plots are redrawn from ``metrics.jsonl``. It names the checkpoint scored and, where training has not
finished (no ``results.json`` in the run), says so and marks ``eval_<split>.json`` (``finished``,
``unfinished_seeds``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Sequence

from omegaconf import OmegaConf

from common.utils import atomic_write_json, console
from common.utils.cli import add_runtime_options, runtime_from
from common.utils.extras import needs_extra
from vqa.answers import AnswerVocab, answers_of
from vqa.evaluation import format_answer_types, vqa_accuracy, write_submission

if TYPE_CHECKING:  # torch, transformers and the model are imported once the command line has been checked
    from common.utils.runtime import Runtime


def load_run(run_dir: Path, data_root: Optional[str] = None):
    """The run's config (``data_root`` replaced when given), answers and model with its newest weights."""
    from transformers import LxmertConfig

    from common.utils import Checkpointer

    from .model import build_vqa_model
    from .prepare import adaptation_of

    for name in ("config.json", "lxmert_config.json", "answers.json"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir / name} does not exist; the run directory must be an output directory "
                                    f"of python -m vqa.lxmert.train")
    cfg = OmegaConf.create(json.loads((run_dir / "config.json").read_text()))
    if data_root is not None:
        cfg.data_root = data_root
    answers = AnswerVocab.load(run_dir / "answers.json")
    config = LxmertConfig.from_dict(json.loads((run_dir / "lxmert_config.json").read_text()))
    model = build_vqa_model(config, len(answers), adaptation_of(cfg))
    checkpointer = Checkpointer(run_dir)
    state = checkpointer.load_latest(model)
    if state is None:
        raise FileNotFoundError(f"{run_dir / 'checkpoints'} holds no checkpoint; train first")
    return cfg, answers, model, checkpointer.paths()[-1]


def evaluate_run(run_dir: Path, split: Optional[str] = None, data_root: Optional[str] = None, prune: bool = True,
                 batch_size: Optional[int] = None, progress: bool = True, runtime: Optional[Runtime] = None) -> Dict:
    """Predict and score ``split`` with the run's newest weights on ``runtime``'s device (default: the CPU)."""
    import torch
    from torch.utils.data import DataLoader

    from common.utils import results_record
    from common.utils.runs import ScoredSeed, unfinished_seeds
    from common.utils.runtime import Runtime
    from vqa.data import VQADataset, data_path, load_split

    from .data import bert_encoder
    from .flops import measure_flops
    from .model import predict
    from .plots import plot_head_values
    from .prepare import adaptation_of

    runtime = runtime or Runtime(torch.device("cpu"))
    run_dir = Path(run_dir)
    cfg, answers, model, checkpoint = load_run(run_dir, data_root)
    scored = ScoredSeed.of(cfg.seed, checkpoint, run_dir / "results.json")
    split = split or cfg.data.eval_split
    if not split:
        raise ValueError("the run has no data.eval_split; pass --split")
    device = runtime.device
    model.to(device)
    adaptation = adaptation_of(cfg)
    questions, annotations, store = load_split(cfg, split)
    encode = bert_encoder(data_path(cfg, cfg.data.vocab), cfg.data.max_words)
    dataset = VQADataset(questions, annotations, store, answers, encode, 0, cfg.data.max_regions)
    loader = DataLoader(dataset, batch_size or cfg.train.eval_batch_size, collate_fn=dataset.collate,
                        num_workers=cfg.train.num_workers, pin_memory=runtime.pin_memory)
    prune = prune and cfg.model.prune_at_eval
    ids, logits = predict(model, loader, runtime, prune, adaptation, progress)
    predictions = answers_of(ids, logits, answers)
    predictions_path = write_submission(run_dir / f"{split}_predictions.json", predictions)
    kept = {stack: getattr(adaptation.layerdrop, stack) for stack in ("language", "vision", "cross")}
    for kind in ("span", "alpha"):
        if (run_dir / "metrics.jsonl").is_file():
            plot_head_values(run_dir / "metrics.jsonl", kind, run_dir / f"{kind}s.png")
    record = results_record(
        OmegaConf.to_container(cfg), split=split, **scored.record(), unfinished_seeds=unfinished_seeds([scored]),
        questions=len(dataset),
        accuracy=vqa_accuracy(annotations, predictions).summary() if annotations is not None else None,
        pruned=prune and adaptation.layerdrop.active,
        layers_pruned_per_stack=kept if prune and adaptation.layerdrop.active else None,
        flops_per_question=measure_flops(model, cfg, adaptation, device), predictions=str(predictions_path),
        runtime=runtime.describe())
    atomic_write_json(run_dir / f"eval_{split}.json", record)
    return record


@needs_extra("lxmert")
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vqa.lxmert.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("run", nargs="?", type=Path, help="output directory of python -m vqa.lxmert.train")
    parser.add_argument("--run", dest="run_option", type=Path, help=argparse.SUPPRESS)  # deprecated spelling
    parser.add_argument("--split", help="a split of data.splits (default: the run's data.eval_split)")
    parser.add_argument("--data-root", help="data root (default: the run's, else $ATTN_DATA_ROOT)")
    parser.add_argument("--no-prune", action="store_true",
                        help="run every layer even when the run prunes at evaluation (model.prune_at_eval)")
    parser.add_argument("--batch-size", type=int, help="evaluation batch size (default: the run's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_runtime_options(parser)
    args = parser.parse_args(argv)
    if args.run_option is not None:
        if args.run is not None:
            parser.error("give the run directory once (the positional argument; --run is its deprecated spelling)")
        print("warning: --run DIR is deprecated; pass the run directory as the first argument, as every other "
              "evaluate CLI takes it", file=sys.stderr)
        args.run = args.run_option
    if args.run is None:
        parser.error("the run directory (an output directory of python -m vqa.lxmert.train) is required")
    from common.utils.runs import ScoredSeed, print_unfinished
    from common.utils.runtime import DeviceError
    from vqa.data import VQADataError

    try:
        record = evaluate_run(args.run, args.split, args.data_root, not args.no_prune, args.batch_size,
                              not args.no_progress, runtime_from(args))
    except (VQADataError, DeviceError, FileNotFoundError, ValueError) as err:
        return console.fail(err)
    scored = ScoredSeed.from_record(record)
    console.say(scored.line())
    accuracy = record["accuracy"]
    summary = (f"accuracy {accuracy['overall']:.2f} ({format_answer_types(accuracy['per_answer_type'])})" if accuracy
               else "no annotations (predictions only)")
    print(f"{record['split']}: {record['questions']} questions, {summary}")
    print_unfinished([scored], [], "python -m vqa.lxmert.train")
    console.files_written([args.run / f"eval_{record['split']}.json", args.run / f"{record['split']}_predictions.json"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
