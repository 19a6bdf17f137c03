"""Evaluate a trained run: BLEU on any split, with beam or greedy search, optionally averaging checkpoints.

    python -m mt.evaluate runs/mt/multi30k/lstm-cpu --split test_2016_flickr [--beam 5] [--average 5]

Writes ``<run>/eval_<split>[_avg<N> | _step_<S>]_beam<K>.json`` (BLEU both ways, the SacreBLEU
signature, sentences/s, config and versions) and the hypotheses beside it (``.hyp.txt``). It names the
checkpoint(s) scored and, where training has not finished (no ``results.json``), says so and marks the JSON
(``finished``, ``unfinished_seeds``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from common.utils import atomic_write_json, console, default_data_root
from common.utils.cli import add_runtime_options, runtime_from
from common.utils.extras import needs_extra
from common.utils.paths import DATA_ROOT_ENV

from .data import DataError
from .text import write_lines


@needs_extra("mt")
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mt.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a directory written by mt.train")
    parser.add_argument("--split", action="append", help="split(s) to score (default: the config's test splits)")
    parser.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy; default: config eval.beam)")
    parser.add_argument("--length-penalty", type=float, default=None)
    parser.add_argument("--average", type=int, default=None,
                        help="average the last N checkpoints instead of using best.pt")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="score the weights of this checkpoint file (e.g. <run>/checkpoints/step_346.pt)")
    parser.add_argument("--data-root", default=None, help=f"data root (default: ${DATA_ROOT_ENV})")
    add_runtime_options(parser)
    args = parser.parse_args(argv)
    # the command line is valid: now torch and the model
    from common.utils import results_record
    from common.utils.runtime import DeviceError

    from common.utils.runs import ScoredSeed, print_unfinished, unfinished_seeds

    from .run import RunFiles, load_model, weights_of
    from .translation import bleu_on_split

    try:
        runtime = runtime_from(args)
        files = RunFiles(args.run_dir)
        cfg = files.config()
        model = load_model(files, average_last=args.average, checkpoint=args.checkpoint).to(runtime.device)
        weights = weights_of(files, args.average, args.checkpoint)
        scored = ScoredSeed.of(cfg["seed"], weights, files.dir / "results.json")
        prepared = files.prepared(default_data_root(args.data_root))
    except (DataError, DeviceError, FileNotFoundError, ValueError) as err:
        return console.fail(err)
    beam = args.beam or cfg["eval"]["beam"]
    lp = cfg["eval"]["length_penalty"] if args.length_penalty is None else args.length_penalty
    console.say(scored.line())
    written = []
    for split in args.split or cfg["data"]["test_splits"]:
        try:
            result = bleu_on_split(model, prepared, split, beam, lp, cfg["eval"]["max_len_a"],
                                   cfg["eval"]["max_len_b"], cfg["eval"]["batch_sentences"], progress=True,
                                   runtime=runtime)
        except DataError as err:
            return console.fail(err)
        weights = f"_{args.checkpoint.stem}" if args.checkpoint else (f"_avg{args.average}" if args.average else "")
        name = f"eval_{split}{weights}_beam{beam}"
        write_lines(files.dir / f"{name}.hyp.txt", result.pop("hypotheses"))
        atomic_write_json(files.dir / f"{name}.json", results_record(
            cfg, **result, beam=beam, length_penalty=lp, average_last=args.average, runtime=runtime.describe(),
            **scored.record(), unfinished_seeds=unfinished_seeds([scored])))
        print(f"{split}: BLEU {result['bleu']:.2f} (tokenised, lowercased) | SacreBLEU {result['sacrebleu']:.2f} "
              f"{result['sacrebleu_signature']} | {result['sentences_per_second']:.1f} sentences/s")
        written += [files.dir / f"{name}.json", files.dir / f"{name}.hyp.txt"]
    print_unfinished([scored], [], "python -m mt.train")
    console.files_written(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
