"""Caption metrics with ``pycocoevalcap``, exactly as ``COCOEvalCap.evaluate`` computes them.

Both the generated captions and the references go through the Stanford PTB tokenizer
(lower case, punctuation removed), then BLEU-1..4, METEOR, ROUGE-L, CIDEr-D and, when its
Stanford CoreNLP models are installed, SPICE score the corpus. All of them need Java.
SPICE's models are a separate ~1 GB download that ``pycocoevalcap`` would start on first use;
here a missing model is reported (``SPICE`` skipped, with the reason) instead.
"""
from __future__ import annotations

import io
import os
import re
import sys
import tempfile
import warnings
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

METRICS = ("bleu", "meteor", "rouge", "cider", "spice")
#: The line the Stanford PTB tokenizer (Java, run by pycocoevalcap) writes to stderr on every call.
TOKENIZER_PROGRESS = re.compile(r"PTBTokenizer tokenized \d+ tokens at [\d.]+ tokens per second\.")


def spice_unavailable_reason() -> Optional[str]:
    """Why SPICE cannot run here, or ``None`` when its CoreNLP jars are installed."""
    from pycocoevalcap.spice import get_stanford_models

    lib = Path(get_stanford_models.SPICEDIR) / get_stanford_models.SPICELIB
    missing = [name for name in (f"{get_stanford_models.JAR}.jar", f"{get_stanford_models.JAR}-models.jar")
               if not (lib / name).is_file()]
    if not missing:
        return None
    return (f"SPICE skipped: {', '.join(missing)} not in {lib}; run `python -c \"from pycocoevalcap.spice."
            f"get_stanford_models import get_stanford_models; get_stanford_models()\"` once, online, to install it")


def _scorers(metrics: Sequence[str]) -> list:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.spice.spice import Spice

    table = {"bleu": (Bleu, (4,), ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"]), "meteor": (Meteor, (), "METEOR"),
             "rouge": (Rouge, (), "ROUGE_L"), "cider": (Cider, (), "CIDEr"), "spice": (Spice, (), "SPICE")}
    return [(table[m][0](*table[m][1]), table[m][2]) for m in metrics]


@contextmanager
def _without_tokenizer_progress() -> Iterator[None]:
    """Capture file descriptor 2, which the Java tokenizer inherits, and pass on every line written to it
    except the tokenizer's progress line (:data:`TOKENIZER_PROGRESS`): errors stay visible."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not TOKENIZER_PROGRESS.fullmatch(line.rstrip())))


def tokenize(captions: Mapping[int, Sequence[str]]) -> dict[int, list[str]]:
    """PTB-tokenize ``{image_id: [sentence, ...]}`` (pycocoevalcap's tokenizer), without its progress line."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    with _without_tokenizer_progress():
        return PTBTokenizer().tokenize({k: [{"caption": c} for c in v] for k, v in captions.items()})


def score_captions(predictions: Mapping[int, str], references: Mapping[int, Sequence[str]],
                   metrics: Sequence[str] = METRICS) -> dict:
    """Corpus scores of one generated caption per image against its references.

    Returns ``{"Bleu_1": .., "Bleu_4": .., "METEOR": .., "ROUGE_L": .., "CIDEr": .., "SPICE": ..}``
    (the names ``COCOEvalCap`` uses) for the requested ``metrics``; a skipped SPICE is listed
    under ``"skipped"`` with its reason.
    """
    unknown = sorted(set(metrics) - set(METRICS))
    if unknown:
        raise ValueError(f"unknown caption metrics {unknown}; choose from {list(METRICS)}")
    missing = sorted(set(predictions) - set(references))
    if missing:
        raise ValueError(f"no references for image ids {missing[:5]} ({len(missing)} in all)")
    if not predictions:
        raise ValueError("no captions to score")
    result: dict = {}
    metrics = list(metrics)
    if "spice" in metrics and (reason := spice_unavailable_reason()) is not None:
        warnings.warn(reason, stacklevel=2)
        result["skipped"] = {"SPICE": reason}
        metrics.remove("spice")
    ids = sorted(predictions)
    gts = tokenize({i: references[i] for i in ids})
    res = tokenize({i: [predictions[i]] for i in ids})
    for scorer, names in _scorers(metrics):
        with redirect_stdout(io.StringIO()):  # Bleu prints its n-gram counts
            score, _ = scorer.compute_score(gts, res)
        if isinstance(names, list):
            result.update({name: float(s) for name, s in zip(names, score)})
        else:
            result[names] = float(score)
    return result


def coco_results(predictions: Mapping[int, str]) -> list[dict]:
    """The COCO caption results format: ``[{"image_id": .., "caption": ..}, ...]``."""
    return [{"image_id": int(i), "caption": c} for i, c in sorted(predictions.items())]


def format_scores(scores: dict) -> str:
    """``BLEU-4 31.2 CIDEr 98.7 ...``: the scores in percent, on one line."""
    return " ".join(f"{name} {100 * value:.1f}" for name, value in scores.items() if isinstance(value, float))
