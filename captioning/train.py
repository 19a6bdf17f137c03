"""Train Att2in with cross-entropy and scheduled sampling; keep the checkpoint with the best val CIDEr.

    python -m captioning.train --attention bam-wc [--data-root DIR] [key=value ...]
    torchrun --nproc_per_node 4 -m captioning.train --attention bam-wc      # several GPUs

The command line and the config are checked first; torch and the model are imported only then
(:mod:`captioning.training` does the work and documents the recipe, data parallelism and the files
written).

``--demo`` runs the whole pipeline without COCO, in well under a minute on a CPU: it writes the
synthetic dataset of :mod:`captioning.fixtures` and its region features to ``<out>/data``, prepares
the captions, trains the small model of ``captioning/configs/demo.yaml`` (default out
``runs/captioning/demo/<attention>``) and evaluates it on the test split (beam 5)::

    python -m captioning.train --demo [--attention bam-wc] [key=value ...]
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

from common import attention
from common.utils import console
from common.utils.cli import overrides_from, training_parser
from common.utils.extras import needs_extra

from .config import load_config, run_dir
from .metrics import format_scores
from .prepare import CaptionDataError


@console.interruptible
@needs_extra("captioning")
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = training_parser("python -m captioning.train", __doc__.split("\n")[0], "captioning/configs/att2in.yaml",
                             "optim.lr=2e-4 train.epochs=10",
                             out_help="output directory (default runs/captioning/<attention>)")
    parser.add_argument("--attention", help="attention variant: " + ", ".join(attention.available()))
    parser.add_argument("--demo", action="store_true",
                        help="no download: write a small synthetic COCO to <out>/data, prepare it, train a tiny model "
                             "(captioning/configs/demo.yaml; out default runs/captioning/demo/<attention>) and "
                             "evaluate it on the test split, in well under a minute on a CPU")
    args = parser.parse_intermixed_args(argv)
    overrides = overrides_from(args)
    try:
        cfg = load_config(args.attention, overrides, args.config, demo=args.demo)
    except ValueError as err:
        return console.fail(err)
    # the config is valid: now torch, the features and the model
    from common.features import RegionFeatureError
    from common.utils.runtime import DeviceError, resolve_device

    from .evaluate import evaluate_checkpoint
    from .run_inputs import write_demo_data
    from .training import run

    try:
        resolve_device(cfg.device)  # a missing GPU is said first, before the demo's data
        if args.demo:
            write_demo_data(cfg)
        results = run(cfg, progress=not args.no_progress)
        test = evaluate_checkpoint(run_dir(cfg), "test", metrics=cfg.eval.metrics, progress=not args.no_progress) \
            if args.demo and results else None
    except (CaptionDataError, RegionFeatureError, DeviceError, ValueError) as err:
        return console.fail(err)
    if not results:  # not the first of several processes
        return 0
    out_dir = run_dir(cfg)
    print(f"{results['attention']}: best val (epoch {results['best_epoch'] + 1} of {results['epochs']}) "
          f"{format_scores(results['val'])}")
    written = [out_dir / name for name in ("results.json", "best.pt", "checkpoints", "metrics.jsonl", "config.json")]
    if test is not None:
        print(f"test ({test['images']} images, beam {test['beam_size']}): {format_scores(test['scores'])}")
        written += [out_dir / "captions_test.json", out_dir / "results_test.json", Path(cfg.data_root)]
    console.files_written(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
