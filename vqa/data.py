"""VQA v2 data: the official question/annotation JSON files, question tokenisation, word
vectors, and a dataset of (question, region features, soft-score target) items.

Official formats (``visualqa.org``):

* questions: ``{"info", "license", "data_subtype", "task_type", "data_type",
  "questions": [{"image_id", "question", "question_id"}]}``;
* annotations: ``{"info", "license", "data_subtype", "data_type", "annotations":
  [{"question_id", "image_id", "question_type", "answer_type", "multiple_choice_answer",
  "answers": [{"answer", "answer_confidence", "answer_id"}] (10 of them)}]}``.

Visual Genome augmentation (MCAN's ``VG_questions.json`` / ``VG_annotations.json``) uses the
same formats and is simply one more split to train on.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from omegaconf import DictConfig
from torch.utils.data import Dataset

from common.features import RegionFeatures, RegionFeatureStore, pad_regions
from common.text import Vocabulary
from common.utils import default_data_root
from common.utils.inputs import read_json

from .answers import AnswerVocab

PathLike = Union[str, Path]
QUESTION_SPECIALS = ("<pad>", "<unk>")  # MCAN's PAD = 0, UNK = 1
_QUESTION_FIELDS = {"image_id": int, "question": str, "question_id": int}
_ANNOTATION_FIELDS = {"question_id": int, "image_id": int, "question_type": str, "answer_type": str, "answers": list}
_STRIP = re.compile(r"([.,'!?\"()*#:;])")


class VQADataError(ValueError):
    """A VQA file is missing or malformed; the message names the file, the field and the fix."""


#: Where a missing input of a split comes from.
VQA_FILES_FIX = ("download the official VQA v2 files from https://visualqa.org/download.html into <data-root>/vqa/ "
                 "(or set the path in the config)")
FEATURES_FIX = "convert bottom-up features with scripts/convert_features.py or set the path"
#: Where a missing GloVe file comes from.
GLOVE_FIX = ("download glove.840B.300d.txt (or another GloVe text file) and set data.glove to its path, or "
             "data.glove=null to train embeddings from scratch")


def _read_json(path: PathLike, what: str, key: str) -> List[dict]:
    """The ``key`` list of an official ``what`` file; VQADataError when it is missing, malformed or empty."""
    data = read_json(path, what, what, VQA_FILES_FIX, VQADataError)
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise VQADataError(f"{path}: expected a JSON object with a {key!r} list (the official {what} format)")
    if not data[key]:
        raise VQADataError(f"{path}: no {what}: its {key!r} list is empty; {VQA_FILES_FIX}")
    return data[key]


def _check_entries(path: PathLike, entries: List[dict], fields: Mapping[str, type], key: str) -> None:
    for i, entry in enumerate(entries):
        for name, kind in fields.items():
            value = entry.get(name) if isinstance(entry, dict) else None
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise VQADataError(f"{path}: {key}[{i}] field {name!r} must be {kind.__name__}, got {value!r}; "
                                   f"the file is not in the official VQA format")


def load_questions(path: PathLike) -> List[dict]:
    """The ``questions`` list of an official questions file, validated."""
    questions = _read_json(path, "questions", "questions")
    _check_entries(path, questions, _QUESTION_FIELDS, "questions")
    ids = Counter(q["question_id"] for q in questions)
    repeated = [q for q, c in ids.items() if c > 1]
    if repeated:
        raise VQADataError(f"{path}: question_id {repeated[0]} appears more than once; question ids must be unique")
    return questions


def load_annotations(path: PathLike) -> List[dict]:
    """The ``annotations`` list of an official annotations file, validated."""
    annotations = _read_json(path, "annotations", "annotations")
    _check_entries(path, annotations, _ANNOTATION_FIELDS, "annotations")
    for i, ann in enumerate(annotations):
        answers = ann["answers"]
        if not answers or not all(isinstance(a, dict) and isinstance(a.get("answer"), str) for a in answers):
            raise VQADataError(f"{path}: annotations[{i}] (question_id {ann['question_id']}) field 'answers' must be "
                               f"a non-empty list of {{'answer': str, ...}}")
    return annotations


def tokenize_question(question: str) -> List[str]:
    """MCAN's tokeniser: lower-case, drop ``.,'!?"()*#:;``, split on spaces, hyphens and slashes."""
    return _STRIP.sub("", question.lower()).replace("-", " ").replace("/", " ").split()


def build_question_vocab(questions: Sequence[Mapping], min_count: int = 1) -> Vocabulary:
    """Words of the training questions (``<pad>`` = 0, ``<unk>`` = 1), most frequent first."""
    counts = Counter(w for q in questions for w in tokenize_question(q["question"]))
    return Vocabulary.from_counts(counts, min_count=min_count, specials=QUESTION_SPECIALS)


class QuestionEncoder:
    """``question -> ids``: :func:`tokenize_question`, then at most ``max_len`` ids (MCAN: 14)."""

    def __init__(self, vocab: Vocabulary, max_len: int = 14):
        if max_len < 1:
            raise ValueError(f"max_len must be positive, got {max_len}")
        self.vocab, self.max_len = vocab, max_len

    def __call__(self, question: str) -> List[int]:
        return self.vocab.encode(tokenize_question(question)[: self.max_len])


def load_glove(path: PathLike, vocab: Vocabulary) -> tuple[torch.Tensor, float]:
    """Word vectors for ``vocab`` from a local GloVe text file (``word v1 ... vD`` per line).

    Returns the ``[len(vocab), D]`` matrix and the fraction of words found; words without a
    vector (and the specials) get zeros, as spaCy's ``en_vectors_web_lg`` gives MCAN.
    """
    path = Path(path)
    if not path.is_file():
        raise VQADataError(f"GloVe file {path} does not exist; {GLOVE_FIX}")
    wanted = {t: i for i, t in enumerate(vocab.tokens)}
    matrix, found, dim = None, 0, None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, 1):
            word, _, rest = line.rstrip("\n").partition(" ")
            if word not in wanted:
                continue
            values = np.array(rest.split(" "), dtype=np.float32)
            if dim is None:
                dim = values.size
                matrix = np.zeros((len(vocab), dim), dtype=np.float32)
            if values.size != dim:
                raise VQADataError(f"{path}: line {line_no} has {values.size} values, expected {dim}")
            if not matrix[wanted[word]].any():
                found += 1
            matrix[wanted[word]] = values
    if matrix is None:
        raise VQADataError(f"{path}: none of the {len(vocab)} question words has a vector; is it a GloVe text file?")
    words = len(vocab) - len(vocab.specials)
    return torch.from_numpy(matrix), found / max(words, 1)


class VQADataset(Dataset):
    """Items ``{question_id, image_id, question, question_tokens, features, boxes, image_size[, target]}``.

    Args:
        questions: entries of an official questions file (:func:`load_questions`).
        annotations: entries of the matching annotations file, or None (test splits); then
            items have no ``target``.
        features: the region features of every image the questions refer to.
        answers: the answer vocabulary; ``target`` is MCAN's soft-score vector over it.
        encode_question: ``str -> list[int]`` (e.g. :class:`QuestionEncoder`, or a BERT tokenizer).
        pad_id: the id :meth:`collate` pads questions with.
        max_regions: pad/truncate every image to this many regions (MCAN: 100); None = batch max.
        question_len: pad every question to this many tokens (fixed shapes, for CUDA graphs); None =
            batch max.
    """

    def __init__(self, questions: Sequence[Mapping], annotations: Optional[Sequence[Mapping]],
                 features: RegionFeatureStore, answers: AnswerVocab, encode_question: Callable[[str], List[int]],
                 pad_id: int = 0, max_regions: Optional[int] = None, question_len: Optional[int] = None):
        self.questions = list(questions)
        self.features, self.answers, self.encode_question = features, answers, encode_question
        self.pad_id, self.max_regions, self.question_len = pad_id, max_regions, question_len
        missing = sorted({q["image_id"] for q in self.questions if q["image_id"] not in features})
        if missing:
            raise VQADataError(f"{features.path}: no region features for {len(missing)} image id(s) of the questions "
                               f"(e.g. {missing[:5]}); convert the features of those images into this file")
        self.annotations: Optional[Dict[int, Mapping]] = None
        if annotations is not None:
            self.annotations = {a["question_id"]: a for a in annotations}
            unannotated = [q["question_id"] for q in self.questions if q["question_id"] not in self.annotations]
            if unannotated:
                raise VQADataError(f"{len(unannotated)} question(s) have no annotation (e.g. question_id "
                                   f"{unannotated[0]}); pair each questions file with its own annotations file")

    def __len__(self) -> int:
        return len(self.questions)

    def __getitem__(self, index: int) -> Dict:
        q = self.questions[index]
        regions = self.features[q["image_id"]]
        tokens = self.encode_question(q["question"])
        item = {"question_id": q["question_id"], "image_id": q["image_id"], "question": q["question"],
                "question_tokens": torch.as_tensor(tokens, dtype=torch.long), "features": regions.features,
                "boxes": regions.boxes, "image_size": regions.image_size}
        if self.annotations is not None:
            human = [a["answer"] for a in self.annotations[q["question_id"]]["answers"]]
            item["target"] = self.answers.soft_target(human)
        return item

    def collate(self, items: Sequence[Dict]) -> Dict:
        return collate(items, pad_id=self.pad_id, max_regions=self.max_regions, question_len=self.question_len)


def collate(items: Sequence[Dict], pad_id: int = 0, max_regions: Optional[int] = None,
            question_len: Optional[int] = None) -> Dict:
    """Batch :class:`VQADataset` items: questions padded with ``pad_id`` (to ``question_len``, or the longest)
    and ``question_mask`` ([B, L], True = a real token), regions padded with ``region_mask`` ([B, N], True = real)."""
    lengths = [len(item["question_tokens"]) for item in items]
    width = max(max(lengths), 1) if question_len is None else max(max(lengths), question_len)
    tokens = torch.full((len(items), width), pad_id, dtype=torch.long)
    for i, item in enumerate(items):
        tokens[i, : lengths[i]] = item["question_tokens"]
    question_mask = torch.arange(tokens.shape[1]) < torch.tensor(lengths).unsqueeze(1)
    regions = [RegionFeatures(item["image_id"], item["features"], item["boxes"], item["image_size"]) for item in items]
    features, boxes, region_mask = pad_regions(regions, max_regions)
    batch = {
        "question_id": torch.tensor([item["question_id"] for item in items], dtype=torch.long),
        "image_id": torch.tensor([item["image_id"] for item in items], dtype=torch.long),
        "question": [item["question"] for item in items],
        "question_tokens": tokens, "question_mask": question_mask,
        "features": features, "boxes": boxes, "region_mask": region_mask,
        "image_size": torch.tensor([item["image_size"] for item in items], dtype=torch.long),
    }
    if all("target" in item for item in items):
        batch["target"] = torch.stack([item["target"] for item in items])
    return batch


def data_path(cfg: DictConfig, path: Optional[str]) -> Optional[Path]:
    """``path`` under the data root (``--data-root``, else ``$ATTN_DATA_ROOT``), unless absolute."""
    if path is None:
        return None
    path = Path(path).expanduser()
    return path if path.is_absolute() else default_data_root(cfg.data_root) / path


def split_inputs(cfg: DictConfig, name: str) -> List[Tuple[str, Optional[Path], str]]:
    """``(config key, path, fix)`` of each file of split ``name`` (for :func:`common.utils.paths.check_inputs`);
    none for a split the config does not define (:func:`load_split` reports it)."""
    if name not in cfg.data.splits:
        return []
    fixes = {"questions": VQA_FILES_FIX, "annotations": VQA_FILES_FIX, "features": FEATURES_FIX}
    return [(f"data.splits.{name}.{field}", data_path(cfg, cfg.data.splits[name][field]), fix)
            for field, fix in fixes.items()]


def load_split(cfg: DictConfig, name: str) -> Tuple[List[dict], Optional[List[dict]], RegionFeatureStore]:
    """Questions, annotations (None for test splits) and region features of split ``name``."""
    if name not in cfg.data.splits:
        raise VQADataError(f"unknown split {name!r}; the config defines data.splits {sorted(cfg.data.splits)}")
    split = cfg.data.splits[name]
    questions = load_questions(data_path(cfg, split.questions))
    annotations = load_annotations(data_path(cfg, split.annotations)) if split.annotations else None
    features_path = data_path(cfg, split.features)
    if not features_path.is_file():
        raise VQADataError(f"region features {features_path} (data.splits.{name}.features) do not exist; "
                           f"{FEATURES_FIX}")
    return questions, annotations, RegionFeatureStore(features_path)
