"""Score any official-format VQA results file against any official annotations file.

    python -m vqa.score RESULTS ANNOTATIONS [--rules official|legacy-2016] [--out report.json]

RESULTS is ``[{"question_id": int, "answer": str}, ...]`` (what ``vqa.evaluate`` writes and
EvalAI takes); ANNOTATIONS an official annotations file (``{"annotations": [...]}``). As the
official ``loadRes``, the results must answer exactly the annotated questions. ``--rules``
chooses the official evaluator of today (default) or the pre-2021 one that scored MCAN and BAM
(:mod:`vqa.evaluation`). Prints the overall and per-answer-type accuracies; ``--out`` also
writes them, with the per-question-type ones, as JSON.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from common.utils import atomic_write_json, console

from .evaluation import RULES, VQAAccuracy, load_submission, vqa_accuracy


def score_files(results: Path, annotations: Path, rules: str = "official") -> VQAAccuracy:
    """The official accuracy of the results file ``results`` on the annotations file ``annotations``."""
    from .data import load_annotations  # vqa.data imports torch: only once the command line has been parsed

    predictions = load_submission(results)
    entries = load_annotations(annotations)
    try:
        return vqa_accuracy(entries, predictions, rules=rules)
    except ValueError as err:
        raise ValueError(f"{results} against {annotations}: {err}") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vqa.score", description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, help="results file: [{question_id, answer}, ...]")
    parser.add_argument("annotations", type=Path, help="official annotations file ({'annotations': [...]})")
    parser.add_argument("--rules", choices=RULES, default="official",
                        help="official: current GT-Vision-Lab/VQA master (default); legacy-2016: the pre-2021 "
                             "evaluator that scored MCAN and BAM")
    parser.add_argument("--out", type=Path, help="also write the accuracies to this JSON file")
    args = parser.parse_args(argv)
    from .data import VQADataError

    try:
        accuracy = score_files(args.results, args.annotations, args.rules)
    except (FileNotFoundError, VQADataError, ValueError) as err:
        return console.fail(err)
    print(f"overall {accuracy.overall:.2f} ({len(accuracy.per_question)} questions, rules {args.rules})")
    for kind, value in accuracy.per_answer_type.items():
        print(f"{kind} {value:.2f}")
    if args.out is not None:
        atomic_write_json(args.out, {"results": str(args.results), "annotations": str(args.annotations),
                                     "rules": args.rules, "questions": len(accuracy.per_question),
                                     **accuracy.summary()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
