"""A small VQA v2 dataset in the official formats, for tests and demos (no real VQA v2 files
are available offline).

``write_vqa_fixture(root)`` writes, for every split subtype (default ``train2014`` and
``val2014``), the official questions and annotations JSON files and an HDF5 region-feature
file, plus MCAN's answer vocabulary, in the layout the configs expect::

    <root>/vqa/v2_OpenEnded_mscoco_<subtype>_questions.json
    <root>/vqa/v2_mscoco_<subtype>_annotations.json          (not for test subtypes)
    <root>/vqa/features/<subtype>.h5
    <root>/vqa/mcan/answer_dict.json                         ([ans_to_ix, ix_to_ans])

``write_wordpiece_vocab`` adds a BERT-style word-piece vocabulary of the questions (for LXMERT),
and ``write_demo_data`` writes what ``python -m vqa.train --demo`` and ``vqa.lxmert.train --demo`` read.
Questions follow the official question types (``mscoco_question_types.txt``) and answer types
(``yes/no``, ``number``, ``other``); each has ten human answers that mostly agree, with some
disagreement, answers outside the vocabulary and punctuation the evaluation strips, so soft
scores of .3/.6/.9/1 all occur. Question ids are ``image_id * 1000 + k`` as in VQA v2.
Everything is deterministic in ``seed``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np

from common.features.fixtures import write_random_features
from common.utils import atomic_write_json, atomic_write_text

from .answers import AnswerVocab

PathLike = Union[str, Path]

#: (question_type, template, answer type) triples; ``{obj}`` is filled with an object word.
TEMPLATES = (
    ("is the", "Is the {obj} on the table?", "yes/no"),
    ("is this", "Is this a {obj}?", "yes/no"),
    ("are there", "Are there {obj}s in the picture?", "yes/no"),
    ("does the", "Does the {obj} look new?", "yes/no"),
    ("how many", "How many {obj}s are there?", "number"),
    ("how many people are", "How many people are near the {obj}?", "number"),
    ("what color is the", "What color is the {obj}?", "other"),
    ("what is the", "What is the {obj} made of?", "other"),
    ("what sport is", "What sport is played near the {obj}?", "other"),
    ("what room is", "What room is the {obj} in?", "other"),
)
OBJECTS = ("dog", "cat", "bus", "umbrella", "pizza", "clock", "horse", "kite", "train", "bench", "laptop", "vase")
ANSWERS = {
    "yes/no": ("yes", "no"),
    "number": ("0", "1", "2", "3", "4", "5", "6", "10"),
    "other": ("red", "blue", "white", "black", "green", "brown", "wood", "metal", "plastic", "tennis", "baseball",
              "soccer", "kitchen", "bathroom", "living room", "bedroom"),
}
OUT_OF_VOCAB = ("not sure", "unknown object", "purple and gold")
CONFIDENCES = ("yes", "maybe", "no")


@dataclass
class VQAFixture:
    """Paths written by :func:`write_vqa_fixture` (``annotations`` lacks test subtypes)."""

    root: Path
    answers: Path
    questions: Dict[str, Path] = field(default_factory=dict)
    annotations: Dict[str, Path] = field(default_factory=dict)
    features: Dict[str, Path] = field(default_factory=dict)
    image_ids: Dict[str, list] = field(default_factory=dict)


def fixture_answer_vocab() -> AnswerVocab:
    """The fixture's own answer vocabulary (every answer of :data:`ANSWERS`)."""
    return AnswerVocab([a for group in ANSWERS.values() for a in group])


def _human_answers(rng: np.random.Generator, answer: str, answer_type: str) -> list[dict]:
    """Ten annotators: ``agree`` give ``answer`` (some with a trailing '!' or '?' the evaluation
    strips), the others a different answer of the same type or one outside the vocabulary."""
    agree = int(rng.choice([10, 9, 7, 5, 3, 2], p=[0.35, 0.2, 0.15, 0.12, 0.1, 0.08]))
    others = [a for a in ANSWERS[answer_type] if a != answer]
    given = []
    for i in range(10):
        if i < agree:
            text = answer + ("!" if rng.random() < 0.1 else "")
        else:
            text = str(rng.choice(OUT_OF_VOCAB)) if rng.random() < 0.2 else str(rng.choice(others))
        given.append(text)
    rng.shuffle(given)
    return [{"answer": a, "answer_confidence": str(rng.choice(CONFIDENCES, p=[0.8, 0.15, 0.05])), "answer_id": i + 1}
            for i, a in enumerate(given)]


def _split_entries(rng: np.random.Generator, image_ids: Sequence[int], per_image: int, subtype: str):
    questions, annotations = [], []
    for image_id in image_ids:
        for k in range(per_image):
            question_type, template, answer_type = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
            obj = str(rng.choice(OBJECTS))
            qid = int(image_id) * 1000 + k
            questions.append({"image_id": int(image_id), "question": template.format(obj=obj), "question_id": qid})
            answer = str(rng.choice(ANSWERS[answer_type]))
            humans = _human_answers(rng, answer, answer_type)
            counts: Dict[str, int] = {}
            for h in humans:
                counts[h["answer"]] = counts.get(h["answer"], 0) + 1
            annotations.append({"question_type": question_type, "multiple_choice_answer": max(counts, key=counts.get),
                                "answers": humans, "image_id": int(image_id), "answer_type": answer_type,
                                "question_id": qid})
    info = {"description": "Synthetic VQA v2-format fixture (vqa.fixtures)", "version": "2.0", "year": 2017}
    license_ = {"name": "Creative Commons Attribution 4.0 International License",
                "url": "http://creativecommons.org/licenses/by/4.0/"}
    q_file = {"info": info, "task_type": "Open-Ended", "data_type": "mscoco", "license": license_,
              "data_subtype": subtype, "questions": questions}
    a_file = {"info": info, "license": license_, "data_subtype": subtype, "data_type": "mscoco",
              "annotations": annotations}
    return q_file, a_file


def write_vqa_fixture(root: PathLike, subtypes: Sequence[str] = ("train2014", "val2014"), num_images: int = 10,
                      questions_per_image: int = 5, answers: Optional[AnswerVocab] = None,
                      num_regions: Union[int, Tuple[int, int]] = (10, 100), feature_dim: int = 2048,
                      seed: int = 0) -> VQAFixture:
    """Write the fixture under ``<root>/vqa`` (see the module docstring); returns its paths.

    ``answers`` is the vocabulary to write as ``answer_dict.json`` (e.g. the real 3,129 MCAN
    answers, which contain every fixture answer); default :func:`fixture_answer_vocab`.
    Subtypes starting with ``test`` get no annotations file.
    """
    root = Path(root)
    vocab = answers if answers is not None else fixture_answer_vocab()
    missing = [a for group in ANSWERS.values() for a in group if a not in vocab]
    if missing:
        raise ValueError(f"the answer vocabulary lacks fixture answers {missing[:5]}; pass a vocabulary that "
                         f"holds them or answers=None")
    base = root / "vqa"
    answers_path = atomic_write_json(base / "mcan" / "answer_dict.json",
                                     [{a: i for i, a in enumerate(vocab.answers)},
                                      {str(i): a for i, a in enumerate(vocab.answers)}], indent=0)
    fixture = VQAFixture(root=root, answers=answers_path)
    for s, subtype in enumerate(subtypes):
        rng = np.random.default_rng([seed, s])
        image_ids = sorted(int(i) for i in rng.choice(np.arange(1, 600_000), size=num_images, replace=False))
        q_file, a_file = _split_entries(rng, image_ids, questions_per_image, subtype)
        fixture.image_ids[subtype] = image_ids
        fixture.questions[subtype] = atomic_write_json(base / f"v2_OpenEnded_mscoco_{subtype}_questions.json",
                                                       q_file, indent=0)
        if not subtype.startswith("test"):
            fixture.annotations[subtype] = atomic_write_json(base / f"v2_mscoco_{subtype}_annotations.json",
                                                             a_file, indent=0)
        path = base / "features" / f"{subtype}.h5"
        path.unlink(missing_ok=True)  # the writer resumes an existing file; a fixture starts afresh
        fixture.features[subtype] = write_random_features(path, image_ids, num_regions, feature_dim,
                                                          seed=seed + s)
    return fixture


def write_wordpiece_vocab(path: PathLike, questions_files: Sequence[PathLike]) -> int:
    """A word-piece vocabulary (``vocab.txt``) holding BERT's specials, ``[PAD]`` first, and every word of
    the given questions files; returns its size."""
    words = set()
    for file in questions_files:
        for q in json.loads(Path(file).read_text(encoding="utf-8"))["questions"]:
            words |= set(re.findall(r"\w+|[^\w\s]", q["question"].lower()))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words)
    atomic_write_text(Path(path), "\n".join(tokens) + "\n")
    return len(tokens)


def write_demo_data(root: PathLike, feature_dim: int, wordpieces: Optional[PathLike] = None) -> VQAFixture:
    """The ``--demo`` data under ``root``: train2014 and val2014, 40 images x 5 questions each, 10-36 regions
    of ``feature_dim``-d random features; with ``wordpieces`` (a path under ``root``), its word-piece
    vocabulary too (:func:`write_wordpiece_vocab`)."""
    fixture = write_vqa_fixture(root, num_images=40, questions_per_image=5, feature_dim=feature_dim,
                                num_regions=(10, 36))
    if wordpieces is not None:
        write_wordpiece_vocab(Path(root) / wordpieces, list(fixture.questions.values()))
    return fixture
