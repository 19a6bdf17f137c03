"""Train PoS taggers on a UD treebank over several seeds; write checkpoints, curves and a results JSON.

    python -m tagging.train --treebank UD_English-GUM --variant conv2d --seeds 3 [key=value ...]
    python -m tagging.train --treebank UD_English-GUM --preset official   # as the authors trained it
    python -m tagging.train --demo          # no data needed: a toy treebank written to <out>/data (a minute)

The command line and the config are checked first; torch and the model are imported only then
(:mod:`tagging.training` does the work and documents the protocol and the files written).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from common.utils import console
from common.utils.cli import overrides_from, training_parser
from common.utils.config import place_demo
from common.utils.extras import needs_extra

from .config import PRESETS, VARIANT_NAMES, load_config


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = training_parser("python -m tagging.train", __doc__.split("\n")[0], "tagging/configs/tagging.yaml",
                             "train.batch_size=64 attention.name=bam-wc", data_root_help="directory holding ud/",
                             out_help="output directory (default runs/tagging/<treebank>/<variant>)")
    parser.add_argument("--treebank", help="UD treebank: a directory name under <data-root>/ud (e.g. UD_English-GUM) "
                                           "or the path of a treebank directory")
    parser.add_argument("--variant", choices=VARIANT_NAMES,
                        help="pe-add (SAN+PE[add], default), pe-con, p, r, pr (direct position interactions), temp "
                             "(learnable temperature), conv1d, conv2d (convoluted attention)")
    parser.add_argument("--attention", help="normalizer in every layer (default softmax): bam-wc, entmax, ...")
    parser.add_argument("--preset", choices=PRESETS,
                        help="standard (default) or official: the authors' Keras initialisation and a word index "
                             "counted over all three splits")
    parser.add_argument("--seeds", type=int, help="number of seeds (default 3)")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), help="autocast precision (default fp32)")
    parser.add_argument("--demo", action="store_true",
                        help="train on a toy treebank written to <out>/data (default out runs/tagging/demo/<variant>): "
                             "the whole pipeline without any data")
    args = parser.parse_intermixed_args(argv)
    if args.demo and args.treebank:
        parser.error("--demo writes and trains on its own toy treebank; drop --treebank")
    return args


@console.interruptible
@needs_extra("tagging")
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    overrides = overrides_from(args, {"treebank": args.treebank, "variant": args.variant,
                                      "attention.name": args.attention, "seeds": args.seeds,
                                      "train.precision": args.precision})
    try:
        cfg = load_config(overrides, args.config, args.preset)
        if args.demo:
            place_demo(cfg, Path("runs") / "tagging" / "demo" / cfg.variant)
    except ValueError as err:
        return console.fail(err)
    from common.training import seed_run_files
    from common.utils.runtime import resolve_device

    from .config import default_out_dir
    from .training import RUN_ERRORS, run

    try:
        resolve_device(cfg.device)  # a missing GPU is said first, before the demo's treebank
        if args.demo:
            from .fixtures import DEMO_TREEBANK, write_demo_treebank

            write_demo_treebank(Path(cfg.data_root))
            cfg.treebank = DEMO_TREEBANK
        results = run(cfg, progress=not args.no_progress)
    except RUN_ERRORS as err:
        return console.fail(err)
    test, out_dir = results["test"], default_out_dir(cfg)
    print(f"{results['treebank']} {results['label']}: test accuracy {test['all']['mean']:.2f} +- "
          f"{test['all']['std']:.2f} (OOV {test['oov']['mean']:.2f}, ambiguous {test['ambiguous']['mean']:.2f}) "
          f"over {len(results['seeds'])} seeds, {results['train_seconds']['total']:.0f} s of training")
    console.files_written([out_dir / "results.json", *results["plots"], *seed_run_files(out_dir, results["seeds"])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
