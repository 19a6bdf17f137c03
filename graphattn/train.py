"""Train GATs on a Planetoid split (or the demo graph) over several seeds; write checkpoints and a results JSON.

    python -m graphattn.train --dataset Cora --attention bam-wc --seeds 10 [key=value ...]

The command line and the config are checked first; torch, PyG and the model are imported only then
(:mod:`graphattn.training` does the work and documents the protocol and the files written).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from common import attention
from common.utils import console
from common.utils.cli import overrides_from, training_parser

from .config import load_config


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = training_parser("python -m graphattn.train", __doc__.split("\n")[0], "graphattn/configs/gat.yaml",
                             "kl.weight=0.01 attention.options.k=20", data_root_help="directory holding planetoid/",
                             out_help="output directory (default runs/gat/<dataset>/<attention>)")
    parser.add_argument("--dataset", help="Cora, CiteSeer or PubMed (default: the config's)")
    parser.add_argument("--attention", help="attention variant: " + ", ".join(attention.available()))
    parser.add_argument("--seeds", type=int, help="number of seeds (default 10)")
    parser.add_argument("--loader", choices=("full", "neighbor"),
                        help="full: the whole graph every step (default); neighbor: NeighborLoader mini-batches")
    parser.add_argument("--num-neighbors", type=int, nargs="+", metavar="K",
                        help="with --loader neighbor: neighbours sampled per layer, -1 = all (default 10 10)")
    parser.add_argument("--batch-size", type=int, help="with --loader neighbor: seed nodes per step (default 512)")
    return parser.parse_intermixed_args(argv)


@console.interruptible
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    fanouts = args.num_neighbors and "[" + ",".join(map(str, args.num_neighbors)) + "]"
    overrides = overrides_from(args, {"seeds": args.seeds, "loader.kind": args.loader,
                                      "loader.num_neighbors": fanouts, "loader.batch_size": args.batch_size})
    try:
        cfg = load_config(args.dataset, args.attention, overrides, args.config)
    except ValueError as err:
        return console.fail(err)
    from common.training import seed_run_files

    from .config import default_out_dir
    from .training import RUN_ERRORS, run

    try:
        results = run(cfg, progress=not args.no_progress)
    except RUN_ERRORS as err:
        return console.fail(err)
    if results is None:  # a torchrun process other than the main one
        return 0
    acc, out_dir = results["test_acc"], default_out_dir(cfg)
    print(f"{results['dataset']} {results['attention']}: test accuracy {acc['mean']:.2f} +- {acc['std']:.2f} "
          f"over {len(results['seeds'])} seeds, {results['train_seconds']['total']:.1f} s of training")
    console.files_written([out_dir / "results.json", *results["plots"], *results["checkpoints"],
                           *seed_run_files(out_dir, results["seeds"])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
