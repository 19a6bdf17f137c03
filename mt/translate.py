"""Translate text from stdin to stdout with a trained run.

    echo "Ein Hund läuft im Park." | python -m mt.translate runs/mt/multi30k/lstm-cpu [--beam 5]

Each input line is Moses-tokenised and lowercased (``--pretokenised`` skips that), split
into BPE units with the run's codes, translated in batches, joined back and Moses-detokenised
(``--tokenised-output`` keeps the tokenised form). Output lines match input lines one to one.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

import torch

from common.utils.cli import add_runtime_options, runtime_from
from common.utils.runtime import DeviceError, Runtime

from .bpe import remove_bpe
from .data import DataError, corpus
from .run import RunFiles, load_model
from .text import MosesDetokenizer, MosesPreprocessor
from .translation import ids_to_text, translate_ids


def translate_lines(files: RunFiles, lines: Sequence[str], beam: int, length_penalty: float,
                    pretokenised: bool = False, tokenised_output: bool = False, average: Optional[int] = None,
                    batch_size: int = 64, runtime: Optional[Runtime] = None) -> List[str]:
    runtime = runtime or Runtime(torch.device("cpu"))
    cfg = files.config()
    src_vocab, tgt_vocab = files.vocabs()
    model = load_model(files, average_last=average).to(runtime.device)
    bpe = files.bpe()
    pre = None if pretokenised else MosesPreprocessor(_lang(files, "src"), normalize_punctuation=True)
    units = [bpe(pre(line) if pre else line.strip()) for line in lines]
    sources = [torch.tensor(src_vocab.encode(u.split(), add_eos=True), dtype=torch.long) for u in units]
    with runtime.autocast():
        ids = translate_ids(model, sources, src_vocab.pad, tgt_vocab, beam_size=beam, length_penalty=length_penalty,
                            max_len_a=cfg["eval"]["max_len_a"], max_len_b=cfg["eval"]["max_len_b"],
                            batch_size=batch_size)
    out = [remove_bpe(h) for h in ids_to_text(ids, tgt_vocab)]
    if tokenised_output:
        return out
    detok = MosesDetokenizer(_lang(files, "tgt"))
    return [detok(line) for line in out]


def _lang(files: RunFiles, side: str) -> str:
    spec = corpus(files.config()["dataset"])
    return spec.src if side == "src" else spec.tgt


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mt.translate", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a directory written by mt.train")
    parser.add_argument("--beam", type=int, default=5, help="beam size (1 = greedy)")
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument("--average", type=int, default=None, help="average the last N checkpoints")
    parser.add_argument("--pretokenised", action="store_true", help="input is already Moses-tokenised, lowercased")
    parser.add_argument("--tokenised-output", action="store_true", help="print tokenised (not detokenised) text")
    add_runtime_options(parser)
    args = parser.parse_args(argv)
    try:
        runtime = runtime_from(args)
        lines = sys.stdin.read().splitlines()
        files = RunFiles(args.run_dir)
        out = translate_lines(files, lines, args.beam, args.length_penalty, args.pretokenised,
                              args.tokenised_output, args.average, runtime=runtime)
    except (DataError, DeviceError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
