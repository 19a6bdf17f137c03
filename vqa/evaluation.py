"""The official VQA accuracy and the official results (submission) format.

For one question with ten human answers, the official evaluation (``GT-Vision-Lab/VQA``,
``PythonEvaluationTools/vqaEvaluation/vqaEval.py``) scores a predicted answer ``a`` as the mean
over the ten leave-one-out subsets of nine annotators:

    acc(a) = 1/10 * sum_i min(#{j != i : answer_j == a} / 3, 1)

The answers are compared after normalisation (:mod:`vqa.answers`), by one of two rule sets:

* ``"official"`` (default): current master (commit a013f00, 2021-03-11, "Fixed processing
  answers bug"). Every answer, human and predicted, gets :func:`~vqa.answers.clean_answer`
  (newlines/tabs, surrounding whitespace). If the humans then agree, the stripped raw strings
  are compared; only if they disagree are the human answers *and* the prediction passed through
  :func:`~vqa.answers.process_punctuation` and :func:`~vqa.answers.process_digit_article`.
* ``"legacy-2016"``: the code before that commit (its v2.0 form of 2016-2017), with which the
  2019-2020 papers this library reproduces (MCAN, BAM) were scored. The prediction always gets every step; the
  human answers are not stripped and get only ``process_punctuation``, and only when they
  disagree.

Overall, per-answer-type and per-question-type accuracies are means of ``acc`` in percent,
rounded to ``digits`` decimals like the official ``n=2`` with Python 2's ``round`` (exact
binary halves away from zero, :func:`py2_round`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional, Sequence, Union

from common.utils import atomic_write_json
from common.utils.inputs import read_json

from .answers import clean_answer, normalize_answer, process_punctuation

Predictions = Union[Mapping[int, str], Iterable[Mapping]]
#: The rule sets of :func:`question_accuracy` (module docstring).
RULES = ("official", "legacy-2016")


def py2_round(value: float, digits: int) -> float:
    """Python 2's ``round``: the exact binary value of ``value`` rounded to ``digits`` decimals,
    halves away from zero (Python 3 rounds them to even: ``round(0.125, 2) == 0.12``, here 0.13)."""
    return float(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def _compared_answers(prediction: str, human_answers: Sequence[str], rules: str):
    """``(prediction, humans)`` as the chosen official code compares them."""
    if rules == "official":
        humans, predicted = [clean_answer(a) for a in human_answers], clean_answer(prediction)
        if len(set(humans)) > 1:
            humans, predicted = [normalize_answer(a) for a in humans], normalize_answer(predicted)
        return predicted, humans
    if rules == "legacy-2016":
        humans = list(human_answers)
        if len(set(humans)) > 1:
            humans = [process_punctuation(a) for a in humans]
        return normalize_answer(prediction), humans
    raise ValueError(f"unknown VQA evaluation rules {rules!r}; choose one of {', '.join(RULES)}")


def question_accuracy(prediction: str, human_answers: Sequence[str], rules: str = "official") -> float:
    """Official accuracy (in [0, 1]) of ``prediction`` against one question's human answers,
    under ``rules`` (``"official"`` or ``"legacy-2016"``, see the module docstring)."""
    if not human_answers:
        raise ValueError("a question needs at least one human answer to be scored")
    predicted, humans = _compared_answers(prediction, human_answers, rules)
    matches = [h == predicted for h in humans]
    total = sum(matches)
    return sum(min(1.0, (total - m) / 3) for m in matches) / len(humans)


@dataclass
class VQAAccuracy:
    """Accuracies in percent: ``overall``, ``per_answer_type``, ``per_question_type``, and
    ``per_question`` (question id -> accuracy)."""

    overall: float
    per_answer_type: Dict[str, float] = field(default_factory=dict)
    per_question_type: Dict[str, float] = field(default_factory=dict)
    per_question: Dict[int, float] = field(default_factory=dict)

    def summary(self) -> Dict:
        """Overall and per answer type, JSON-ready (for results files)."""
        return {"overall": self.overall, "per_answer_type": dict(self.per_answer_type),
                "per_question_type": dict(self.per_question_type)}


#: The answer types of VQA v2 in the order the papers report them.
ANSWER_TYPES = ("yes/no", "number", "other")


def format_answer_types(per_answer_type: Mapping[str, float]) -> str:
    """``per_answer_type`` as one readable phrase, ``yes/no 75.64, number 0.00, other 0.00``
    (VQA v2's types in the papers' order, any other type after them)."""
    order = [t for t in ANSWER_TYPES if t in per_answer_type] + sorted(set(per_answer_type) - set(ANSWER_TYPES))
    return ", ".join(f"{t} {per_answer_type[t]:.2f}" for t in order)


def _as_mapping(predictions: Predictions) -> Dict[int, str]:
    if isinstance(predictions, Mapping):
        return {int(k): str(v) for k, v in predictions.items()}
    out: Dict[int, str] = {}
    for i, item in enumerate(predictions):
        try:
            out[int(item["question_id"])] = str(item["answer"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"prediction #{i} must be {{'question_id': int, 'answer': str}}, got {item!r}") from None
    return out


def vqa_accuracy(annotations: Sequence[Mapping], predictions: Predictions, digits: Optional[int] = 2,
                 rules: str = "official") -> VQAAccuracy:
    """Official accuracy of ``predictions`` (``{question_id: answer}`` or the official results
    list) on ``annotations`` (entries of an official annotations file), under ``rules``
    (``"official"``: current master, ``"legacy-2016"``: the pre-2021 code; module docstring).

    As the official ``loadRes``, the predictions must answer exactly the annotated questions.
    """
    if rules not in RULES:
        raise ValueError(f"unknown VQA evaluation rules {rules!r}; choose one of {', '.join(RULES)}")
    predicted = _as_mapping(predictions)
    annotated = {int(a["question_id"]) for a in annotations}
    missing, extra = annotated - set(predicted), set(predicted) - annotated
    if missing or extra:
        raise ValueError(f"the predictions do not match the annotated questions: {len(missing)} question ids "
                         f"without a prediction (e.g. {sorted(missing)[:3]}) and {len(extra)} not annotated "
                         f"(e.g. {sorted(extra)[:3]}); predict every question of the split")
    per_question: Dict[int, float] = {}
    by_answer_type: Dict[str, list] = {}
    by_question_type: Dict[str, list] = {}
    for ann in annotations:
        qid = int(ann["question_id"])
        acc = question_accuracy(predicted[qid], [a["answer"] for a in ann["answers"]], rules)
        per_question[qid] = acc
        by_answer_type.setdefault(ann["answer_type"], []).append(acc)
        by_question_type.setdefault(ann["question_type"], []).append(acc)

    def pct(values: Sequence[float]) -> float:
        value = 100.0 * sum(values) / len(values)
        return py2_round(value, digits) if digits is not None else value

    return VQAAccuracy(
        overall=pct(list(per_question.values())) if per_question else 0.0,
        per_answer_type={k: pct(v) for k, v in sorted(by_answer_type.items())},
        per_question_type={k: pct(v) for k, v in sorted(by_question_type.items())},
        per_question={q: (py2_round(100 * a, digits) if digits is not None else 100 * a) for q, a in per_question.items()},
    )


def write_submission(path: Union[str, Path], predictions: Predictions) -> Path:
    """The official results file: ``[{"question_id": int, "answer": str}, ...]`` (atomic write)."""
    rows = [{"question_id": q, "answer": a} for q, a in sorted(_as_mapping(predictions).items())]
    return atomic_write_json(path, rows, indent=0)


#: How a results file is made.
_RESULTS_FIX = "write one with python -m vqa.evaluate (a list of {question_id, answer}, one per question)"


def load_submission(path: Union[str, Path]) -> Dict[int, str]:
    """A results file in the official format as ``{question_id: answer}``."""
    rows = read_json(path, "results", "predictions", _RESULTS_FIX, missing=FileNotFoundError)
    if not isinstance(rows, list):
        raise ValueError(f"{path}: the official results format is a list of {{question_id, answer}}")
    if not rows:
        raise ValueError(f"{path}: no predictions: the list is empty; {_RESULTS_FIX}")
    try:
        return _as_mapping(rows)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
