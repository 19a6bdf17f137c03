"""Fine-tune LXMERT on VQA v2 with adaptive attention; resumable, results beside the checkpoints.

    python -m vqa.lxmert.train --variant span [--pretrained DIR] [--data-root DIR] [--out DIR] [key=value ...]

The command line and the config (:mod:`vqa.lxmert.config`) are checked first; torch, transformers and the
model are imported only then (:mod:`vqa.lxmert.training` does the work and documents the loss, the
variants, resumption and the files written).

``--demo`` runs it all without downloads, in well under a minute on a CPU: it writes the synthetic data of
:func:`vqa.fixtures.write_demo_data` to ``<out>/data`` and fine-tunes the tiny LXMERT of
``vqa/configs/lxmert_demo.yaml`` from RANDOM weights (default out ``runs/lxmert/demo/<variant>``)::

    python -m vqa.lxmert.train --demo [--variant span] [key=value ...]
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from common.utils import console
from common.utils.cli import overrides_from, training_parser
from common.utils.extras import needs_extra

from .config import default_out_dir, load_config


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = training_parser("python -m vqa.lxmert.train", __doc__.split("\n")[0], "vqa/configs/lxmert.yaml",
                             "optim.name=adamw train.batch_size=32", data_root_help="directory holding vqa/ and text/",
                             out_help="output directory (default runs/lxmert/<variant>)")
    parser.add_argument("--variant", help="softmax | span | entmax | layerdrop | bam (default: softmax)")
    parser.add_argument("--demo", action="store_true",
                        help="fine-tune a tiny LXMERT with random weights on synthetic data written to <out>/data, "
                             "no download (vqa/configs/lxmert_demo.yaml; out default runs/lxmert/demo/<variant>)")
    parser.add_argument("--pretrained", help="local Hugging Face LXMERT directory (default: model.pretrained "
                                             "under the data root)")
    return parser.parse_intermixed_args(argv)


@console.interruptible
@needs_extra("lxmert")
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    overrides = overrides_from(args, {"model.pretrained": args.pretrained})
    try:
        cfg = load_config(args.variant, overrides, args.config, demo=args.demo)
    except (FileNotFoundError, ValueError) as err:
        return console.fail(err)
    # the config is valid: now torch, transformers, the data and the model
    from common.utils.runtime import DeviceError, resolve_device
    from vqa.data import VQADataError
    from vqa.evaluation import format_answer_types

    from .prepare import write_demo_data
    from .training import run

    try:
        resolve_device(cfg.device)  # a missing GPU is said first, before the demo's banner and data
        if args.demo:
            write_demo_data(cfg)
            console.say(f"demo: a tiny LXMERT ({cfg.variant}) with RANDOM weights, not the pretrained checkpoint, on "
                        f"synthetic questions with random region features (written to {cfg.data_root}); it shows "
                        f"that the pipeline works, its accuracy says nothing about LXMERT")
        results = run(cfg, progress=not args.no_progress)
    except (VQADataError, DeviceError, FileNotFoundError, ValueError) as err:  # PretrainedError is a ValueError
        return console.fail(err)
    final, out_dir = results["final_eval"], default_out_dir(cfg)
    accuracy = (f"{cfg.data.eval_split} accuracy {final['overall']:.2f} "
                f"({format_answer_types(final['per_answer_type'])})" if final else "no evaluation")
    print(f"LXMERT {results['variant']}: {results['steps']} updates, {results['train_seconds']:.0f} s of training, "
          f"{accuracy}")
    console.files_written([out_dir / "results.json", *results["plots"].values(), out_dir / "checkpoints",
                           out_dir / "metrics.jsonl", out_dir / "config.json",
                           out_dir / f"{cfg.data.eval_split}_predictions.json"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
