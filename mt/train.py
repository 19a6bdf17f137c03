"""Train a translation model; resume, validate, select, average and test it.

    python -m mt.train --preset lstm-cpu [--out runs/mt/x] [key=value ...]
    python -m mt.train --preset demo             # no data needed: a toy corpus, under a minute on a CPU
    python -m mt.train --preset transformer-cpu model.encoder_attention.cross_layer='{kind: predictive, alpha: 0.1}'
    torchrun --nproc_per_node 4 -m mt.train --preset transformer-base      # several GPUs

The command line and the config are checked first; torch and the models are imported only then
(:mod:`mt.training` does the work and documents the loss, the schedules, validation, checkpoints,
resumption, data parallelism and the files written).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

from common.utils import console, default_data_root
from common.utils.cli import overrides_from, training_parser
from common.utils.extras import needs_extra

from .config import load_config
from .data import DataError


@console.interruptible
@needs_extra("mt")
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = training_parser("python -m mt.train", __doc__.split("\n\n")[0], "mt/configs/defaults.yaml",
                             "optim.lr=1e-3 batching.max_tokens=4000", data_root_help="directory holding mt/",
                             out_help="run directory (default: out_dir or runs/mt/<dataset>/<preset>)")
    parser.add_argument("--preset", default="lstm-cpu",
                        help="mt/configs/<preset>.yaml: lstm, lstm-cpu, transformer-lite, transformer-base, "
                             "transformer-cpu, or demo (a toy corpus written on the fly, a minute on a CPU)")
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = load_config(args.preset, overrides_from(args, {"train.progress": False if args.no_progress else None},
                                                      threads_key="train.threads"),
                          args.config)
    except (FileNotFoundError, ValueError) as err:
        return console.fail(err)
    # the config is valid: now torch, the data pipeline and the models
    from common.utils.distributed import cleanup
    from common.utils.runtime import DeviceError, Runtime

    from .results import summarize
    from .training import train

    try:
        out_dir = Path(cfg.out_dir or Path("runs") / "mt" / cfg.dataset / args.preset)
        runtime = Runtime.create(cfg.device, cfg.train.precision, cfg.train.compile, threads=cfg.train.threads,
                                 distributed=True)
        data_root = default_data_root(cfg.data_root)
    except (DataError, DeviceError, FileNotFoundError, ValueError) as err:
        return console.fail(err)
    try:
        record = train(cfg, out_dir, data_root, runtime)
    except (DataError, FileNotFoundError, ValueError) as err:
        return console.fail(err)
    finally:
        cleanup(runtime.env)
    if record is not None:
        summarize(record, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
