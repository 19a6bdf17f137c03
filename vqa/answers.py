"""VQA answers: the official normalisation, the 3,129-answer vocabulary and MCAN's soft scores.

The tables and rules below are copied from the official VQA evaluation
(``GT-Vision-Lab/VQA``, ``PythonEvaluationTools/vqaEvaluation/vqaEval.py``; the same in the
pre-2021 code and in current master, commit a013f00), including its quirks, so that accuracies
computed here equal the official ones. *When* each step applies differs between the two versions:
see :mod:`vqa.evaluation`.

* ``clean_answer``: newlines and tabs to spaces, surrounding whitespace stripped.

* ``process_punctuation``: each mark in :data:`PUNCT` is deleted when it touches a space, or
  when the text holds a comma between digits anywhere (``"1,000"``); otherwise it becomes a
  space. Periods not followed by a digit are then removed (the official regex
  ``(?!<=\\d)(\\.)(?!\\d)`` is a typo for a look-behind, so only the look-ahead acts, and
  ``re.UNICODE`` is passed where ``re.sub`` takes its ``count``: at most 32 periods go).
* ``process_digit_article``: lower-case, number words ``zero``..``ten`` (and ``none``) to
  digits, articles ``a an the`` dropped, apostrophe-less contractions restored
  (``dont`` -> ``don't``).

MCAN (``MILVLG/mcan-vqa``, ``core/data/ans_punct.py: prep_ans``) builds its training targets
with the same two steps and then deletes commas; :func:`soft_score` is its ``get_score``.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, Mapping, Optional, Sequence, Union

from common.utils import atomic_write_json
from common.utils.inputs import read_json

if TYPE_CHECKING:  # torch only for the training targets: vqa.score and the CLIs' --help need none
    import torch

CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd",
    "howll": "how'll", "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm", "Ive": "I've",
    "isnt": "isn't", "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll", "let's": "let's",
    "maam": "ma'am", "mightnt": "mightn't", "mightnt've": "mightn't've", "mightn'tve": "mightn't've",
    "mightve": "might've", "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't", "notve": "not've",
    "oclock": "o'clock", "oughtnt": "oughtn't", "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at",
    "shant": "shan't", "shed've": "she'd've", "she'dve": "she'd've", "she's": "she's", "shouldve": "should've",
    "shouldnt": "shouldn't", "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've", "somebodyll": "somebody'll",
    "somebodys": "somebody's", "someoned": "someone'd", "someoned've": "someone'd've", "someone'dve": "someone'd've",
    "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd", "somethingd've": "something'd've",
    "something'dve": "something'd've", "somethingll": "something'll", "thats": "that's", "thered": "there'd",
    "thered've": "there'd've", "there'dve": "there'd've", "therere": "there're", "theres": "there's",
    "theyd": "they'd", "theyd've": "they'd've", "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're",
    "theyve": "they've", "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've",
    "weve": "we've", "werent": "weren't", "whatll": "what'll", "whatre": "what're", "whats": "what's",
    "whatve": "what've", "whens": "when's", "whered": "where'd", "wheres": "where's", "whereve": "where've",
    "whod": "who'd", "whod've": "who'd've", "who'dve": "who'd've", "wholl": "who'll", "whos": "who's",
    "whove": "who've", "whyll": "why'll", "whyre": "why're", "whys": "why's", "wont": "won't", "wouldve": "would've",
    "wouldnt": "wouldn't", "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've", "yall": "y'all",
    "yall'll": "y'all'll", "y'allll": "y'all'll", "yall'd've": "y'all'd've", "y'alld've": "y'all'd've",
    "y'all'dve": "y'all'd've", "youd": "you'd", "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll",
    "youre": "you're", "youve": "you've",
}
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = ("a", "an", "the")
PUNCT = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")
_OFFICIAL_PERIOD_COUNT = re.UNICODE  # the official call passes re.UNICODE (= 32) as re.sub's count

#: MCAN's ``get_score``: soft score of an answer given by 0, 1, 2, 3 or >= 4 of the 10 annotators.
MCAN_SCORES = (0.0, 0.3, 0.6, 0.9, 1.0)


def process_punctuation(text: str) -> str:
    """The official ``processPunctuation`` (see the module docstring)."""
    out = text
    digit_comma = _COMMA_STRIP.search(text) is not None
    for p in PUNCT:
        if p + " " in text or " " + p in text or digit_comma:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD_STRIP.sub("", out, count=_OFFICIAL_PERIOD_COUNT)


def process_digit_article(text: str) -> str:
    """The official ``processDigitArticle``: lower-case, number words to digits, no articles,
    contractions restored."""
    words = [NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    return " ".join(CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES)


def clean_answer(answer: str) -> str:
    """Newlines and tabs to spaces, surrounding whitespace stripped (the official first step)."""
    return answer.replace("\n", " ").replace("\t", " ").strip()


def normalize_answer(answer: str) -> str:
    """An answer with every official step: :func:`clean_answer`, :func:`process_punctuation`,
    :func:`process_digit_article`."""
    return process_digit_article(process_punctuation(clean_answer(answer)))


def prep_answer(answer: str) -> str:
    """MCAN's ``prep_ans`` for training targets: the official normalisation without commas."""
    return process_digit_article(process_punctuation(answer)).replace(",", "")


def soft_score(count: int) -> float:
    """MCAN's soft score of an answer that ``count`` of the 10 annotators gave: 0, .3, .6, .9, 1
    for 0, 1, 2, 3, >= 4 (close to the official ``min(count / 3, 1)`` averaged over annotators)."""
    if count < 0:
        raise ValueError(f"an answer count cannot be negative, got {count}")
    return MCAN_SCORES[min(count, 4)]


#: Where a missing answer vocabulary comes from.
ANSWERS_FIX = ("use MCAN's core/data/answer_dict.json or LXMERT's data/vqa/trainval_ans2label.json "
               "(under <data-root>/vqa/)")


class AnswerVocab:
    """The classifier's answer space: answer string <-> class index.

    Load the MCAN file (``answer_dict.json``: ``[ans_to_ix, ix_to_ans]``) or LXMERT's
    (``trainval_ans2label.json``: ``{answer: index}``, or ``trainval_label2ans.json``: a list)
    with :meth:`load`; both hold the same 3,129 VQA v2 answers, in different orders.
    """

    def __init__(self, answers: Sequence[str]):
        self.answers = list(answers)
        self._index = {a: i for i, a in enumerate(self.answers)}
        if len(self._index) != len(self.answers):
            duplicates = sorted(a for a, c in Counter(self.answers).items() if c > 1)
            raise ValueError(f"duplicate answers in the vocabulary: {duplicates[:5]}")

    @classmethod
    def from_mapping(cls, ans_to_ix: Mapping[str, int], source: str = "the mapping") -> "AnswerVocab":
        """From ``{answer: index}`` whose indices are exactly ``0..len-1``."""
        order = sorted(ans_to_ix.items(), key=lambda kv: kv[1])
        if [i for _, i in order] != list(range(len(order))):
            raise ValueError(f"{source}: answer indices must be 0..{len(order) - 1} without gaps or repeats")
        return cls([a for a, _ in order])

    @classmethod
    def load(cls, path: Union[str, Path]) -> "AnswerVocab":
        """MCAN ``answer_dict.json``, LXMERT ``trainval_ans2label.json`` or ``trainval_label2ans.json``."""
        data = read_json(path, "answer vocabulary", "answers", ANSWERS_FIX, missing=FileNotFoundError)
        if not data:
            raise ValueError(f"{path}: no answers: the answer vocabulary is empty; {ANSWERS_FIX}")
        if isinstance(data, list) and len(data) == 2 and all(isinstance(d, dict) for d in data):
            return cls.from_mapping(data[0], f"{path} (MCAN [ans_to_ix, ix_to_ans])")
        if isinstance(data, dict) and all(isinstance(v, int) for v in data.values()):
            return cls.from_mapping(data, f"{path} (ans2label)")
        if isinstance(data, list) and all(isinstance(a, str) for a in data):
            return cls(data)
        raise ValueError(f"{path}: unknown answer vocabulary format; expected MCAN's [ans_to_ix, ix_to_ans], "
                         f"an {{answer: index}} dict or a list of answers")

    def save(self, path: Union[str, Path]) -> Path:
        """As ``{answer: index}`` JSON (atomic); :meth:`load` reads it back."""
        return atomic_write_json(path, {a: i for i, a in enumerate(self.answers)}, indent=0)

    def __len__(self) -> int:
        return len(self.answers)

    def __contains__(self, answer: str) -> bool:
        return answer in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnswerVocab) and self.answers == other.answers

    def __repr__(self) -> str:
        return f"AnswerVocab({len(self)} answers)"

    def index(self, answer: str) -> Optional[int]:
        """The class of ``answer`` (already normalised), or None when it is outside the vocabulary."""
        return self._index.get(answer)

    def answer(self, index: int) -> str:
        return self.answers[index]

    def soft_target(self, human_answers: Iterable[str]) -> torch.Tensor:
        """MCAN's target ``FloatTensor[len(self)]``: :func:`soft_score` of how many annotators gave
        each in-vocabulary answer, after :func:`prep_answer`."""
        import torch

        target = torch.zeros(len(self))
        for answer, count in Counter(prep_answer(a) for a in human_answers).items():
            index = self._index.get(answer)
            if index is not None:
                target[index] = soft_score(count)
        return target


def answers_of(question_ids: Sequence[int], logits: torch.Tensor, answers: AnswerVocab) -> Dict[int, str]:
    """The highest-scoring answer of each question: ``{question_id: answer}``."""
    return {q: answers.answer(i) for q, i in zip(question_ids, logits.argmax(-1).tolist())}
