"""Evaluate a trained run: BLEU on any split, with beam or greedy search, optionally averaging checkpoints.

    python -m mt.evaluate runs/mt/multi30k/lstm-cpu --split test_2016_flickr [--beam 5] [--average 5]

Writes ``<run>/eval_<split>[_avg<N> | _step_<S>]_beam<K>.json`` (BLEU both ways, the SacreBLEU
signature, sentences/s, config and versions) and the hypotheses beside it (``.hyp.txt``).
"""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Dict, Optional, Sequence


from common.utils import atomic_write_json, console, default_data_root, results_record
from common.utils.cli import add_runtime_options, runtime_from
from common.utils.paths import DATA_ROOT_ENV
from common.utils.runtime import DeviceError, Runtime

from .bleu import detokenised_bleu, tokenised_bleu
from .data import DataError, Prepared, load_split
from .run import RunFiles, load_model
from .text import write_lines
from .translation import ids_to_text, translate_ids


def bleu_on_split(model, prepared: Prepared, split: str, beam: int, length_penalty: float, max_len_a: float,
                  max_len_b: int, batch_size: int, limit: Optional[int] = None, detok: bool = True,
                  progress: bool = False, runtime: Optional[Runtime] = None) -> Dict[str, object]:
    """Translate ``split`` (its first ``limit`` sentences) with ``model`` (on its device, under the
    ``runtime``'s precision) and score it; hypotheses included."""
    data = load_split(prepared, split)
    refs_tok = prepared.lines(split, "tok", "tgt")
    sources = data.src[:limit] if limit else data.src
    refs_tok = refs_tok[: len(sources)]
    start = time.perf_counter()
    with runtime.autocast() if runtime is not None else nullcontext():
        ids = translate_ids(model, sources, prepared.src_vocab.pad, prepared.tgt_vocab, beam_size=beam,
                            length_penalty=length_penalty, max_len_a=max_len_a, max_len_b=max_len_b,
                            batch_size=batch_size, progress=progress)
    seconds = time.perf_counter() - start
    hyps = ids_to_text(ids, prepared.tgt_vocab)
    result: Dict[str, object] = {"split": split, "sentences": len(hyps), "bleu": tokenised_bleu(hyps, refs_tok),
                                 "decode_seconds": seconds, "sentences_per_second": len(hyps) / seconds,
                                 "hypotheses": hyps}
    if detok:
        refs_raw = prepared.lines(split, "raw", "tgt")[: len(sources)]
        sacre = detokenised_bleu(hyps, refs_raw, prepared.manifest["tgt"])
        result.update(sacrebleu=sacre["score"], sacrebleu_signature=sacre["signature"])
    return result


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
    try:
        runtime = runtime_from(args)
        files = RunFiles(args.run_dir)
        cfg = files.config()
        model = load_model(files, average_last=args.average, checkpoint=args.checkpoint).to(runtime.device)
        prepared = files.prepared(default_data_root(args.data_root))
    except (DataError, DeviceError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    beam = args.beam or cfg["eval"]["beam"]
    lp = cfg["eval"]["length_penalty"] if args.length_penalty is None else args.length_penalty
    written = []
    for split in args.split or cfg["data"]["test_splits"]:
        try:
            result = bleu_on_split(model, prepared, split, beam, lp, cfg["eval"]["max_len_a"],
                                   cfg["eval"]["max_len_b"], cfg["eval"]["batch_sentences"], progress=True,
                                   runtime=runtime)
        except DataError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        weights = f"_{args.checkpoint.stem}" if args.checkpoint else (f"_avg{args.average}" if args.average else "")
        name = f"eval_{split}{weights}_beam{beam}"
        write_lines(files.dir / f"{name}.hyp.txt", result.pop("hypotheses"))
        atomic_write_json(files.dir / f"{name}.json", results_record(
            cfg, **result, beam=beam, length_penalty=lp, average_last=args.average, runtime=runtime.describe(),
            checkpoint=str(args.checkpoint) if args.checkpoint else None))
        print(f"{split}: BLEU {result['bleu']:.2f} (tokenised, lowercased) | SacreBLEU {result['sacrebleu']:.2f} "
              f"{result['sacrebleu_signature']} | {result['sentences_per_second']:.1f} sentences/s")
        written += [files.dir / f"{name}.json", files.dir / f"{name}.hyp.txt"]
    console.files_written(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
