"""Train MCAN on VQA v2 with any attention normalizer; resumable, multi-GPU with torchrun.

    python -m vqa.train --attention bam-wc kl.weight=0.01 [--data-root DIR] [--out DIR] [key=value ...]
    torchrun --nproc_per_node 4 -m vqa.train --attention softmax train.batch_size=16

The command line and the config (:mod:`vqa.config`) are checked first; torch and the model are imported
only then (:mod:`vqa.training` does the work and documents the protocol and the files written).

``--demo`` runs it all without VQA v2, in well under a minute on a CPU: it writes the synthetic data of
:func:`vqa.fixtures.write_demo_data` to ``<out>/data`` and trains the small MCAN of
``vqa/configs/mcan_demo.yaml`` (default out ``runs/vqa/mcan/demo/<attention>``), evaluating every epoch::

    python -m vqa.train --demo [--attention bam-wc] [key=value ...]
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from common import attention
from common.utils import console
from common.utils.cli import overrides_from, training_parser

from .config import CONFIG_NAME, default_out_dir, load_config


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = training_parser("python -m vqa.train", __doc__.split("\n")[0], f"vqa/configs/{CONFIG_NAME}",
                             "kl.weight=0.01 train.batch_size=32", data_root_help="directory holding vqa/",
                             out_help="output directory (default runs/vqa/mcan/<attention>)")
    parser.add_argument("--attention", help="attention variant: " + ", ".join(attention.available()))
    parser.add_argument("--epochs", type=int, help="number of epochs (default 13)")
    parser.add_argument("--demo", action="store_true",
                        help="train a small MCAN on synthetic data written to <out>/data, no download "
                             "(vqa/configs/mcan_demo.yaml; out default runs/vqa/mcan/demo/<attention>)")
    return parser.parse_intermixed_args(argv)


@console.interruptible
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    overrides = overrides_from(args, {"attention.name": args.attention, "train.epochs": args.epochs})
    try:
        cfg = load_config(overrides, args.config, demo=args.demo)
    except (ValueError, FileNotFoundError) as err:
        return console.fail(err)
    # the config is valid: now torch, the data and the model
    from common.utils.runtime import DeviceError, resolve_device

    from .data import VQADataError
    from .evaluation import format_answer_types
    from .training import run

    try:
        resolve_device(cfg.device)  # a missing GPU is said first, before the demo's banner and data
        if args.demo:
            from .fixtures import write_demo_data

            write_demo_data(cfg.data_root, cfg.model.feature_dim)
            console.say(f"demo: MCAN {cfg.attention.name} on synthetic questions with random region features "
                        f"(written to {cfg.data_root}); its accuracy shows the pipeline works, not what MCAN can do")
        results = run(cfg, progress=not args.no_progress)
    except (VQADataError, DeviceError, ValueError, FileNotFoundError) as err:
        return console.fail(err)
    final, out_dir = results["final_eval"], default_out_dir(cfg)
    print(f"MCAN {results['attention']}: {len(results['epochs'])} epochs, {results['train_seconds']:.0f} s of training"
          + (f", {cfg.data.eval_split} accuracy {final['overall']:.2f} "
             f"({format_answer_types(final['per_answer_type'])})" if final else ""))
    console.files_written([out_dir / name for name in ("results.json", "checkpoints", "metrics.jsonl", "config.json",
                                                        "question_vocab.json", "answers.json",
                                                        f"{cfg.data.eval_split}_predictions.json")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
