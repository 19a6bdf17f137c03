"""Translate text from stdin to stdout with a trained run.

    echo "Ein Hund läuft im Park." | python -m mt.translate runs/mt/multi30k/lstm-cpu [--beam 5]

Each input line is Moses-tokenised and lowercased (``--pretokenised`` skips that), split
into BPE units with the run's codes, translated in batches, joined back and Moses-detokenised
(``--tokenised-output`` keeps the tokenised form). Output lines match input lines one to one.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from common.utils import console
from common.utils.cli import add_runtime_options, runtime_from
from common.utils.extras import needs_extra

from .data import DataError


@needs_extra("mt")
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
    # the command line is valid: now torch and the model
    from common.utils.runtime import DeviceError

    from .run import RunFiles
    from .translation import translate_lines

    try:
        runtime = runtime_from(args)
        lines = sys.stdin.read().splitlines()
        files = RunFiles(args.run_dir)
        out = translate_lines(files, lines, args.beam, args.length_penalty, args.pretokenised,
                              args.tokenised_output, args.average, runtime=runtime)
    except (DataError, DeviceError, FileNotFoundError, ValueError) as err:
        return console.fail(err)
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
