"""The inputs of an MCAN training run (:mod:`vqa.training`): every missing input file named at once, the question
vocabulary and answers (built on a fresh run, reloaded on resumption), the training and eval datasets, the GloVe
vectors, and the run's own files (``config.json``, ``question_vocab.json``, ``answers.json``) written once nothing
can fail before training."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from omegaconf import DictConfig
from torch.utils.data import ConcatDataset, DataLoader

from common.text import Vocabulary
from common.utils import atomic_write_json, console
from common.utils.config import check_resumable
from common.utils.distributed import DistEnv
from common.utils.paths import check_inputs
from common.utils.runtime import Runtime
from common.utils.updates import full_batches

from .answers import ANSWERS_FIX, AnswerVocab
from .config import RESUMABLE_KEYS, to_dict
from .data import (GLOVE_FIX, QuestionEncoder, VQADataError, VQADataset, build_question_vocab, data_path, load_glove,
                   load_split, split_inputs)


def prepare_run(cfg: DictConfig, out_dir: Path, train_questions: Sequence[dict]) -> Tuple[Vocabulary, AnswerVocab]:
    """The question vocabulary and answers of the run: built on a fresh run (:func:`save_run` writes
    them), reloaded from ``out_dir`` on resumption so that ids never change."""
    config_path = out_dir / "config.json"
    if config_path.exists():
        saved = json.loads(config_path.read_text(encoding="utf-8"))
        check_resumable(saved, to_dict(cfg), RESUMABLE_KEYS, out_dir)
        return Vocabulary.load(out_dir / "question_vocab.json"), AnswerVocab.load(out_dir / "answers.json")
    answers = AnswerVocab.load(data_path(cfg, cfg.data.answers))
    return build_question_vocab(train_questions, cfg.data.min_word_count), answers


def check_run_inputs(cfg: DictConfig, resuming: bool, fresh: bool) -> None:
    """One error naming every input file of the run that is missing (answers, the splits' questions,
    annotations and features, GloVe), each with its config key and fix. A resumed run (``config.json``
    written) takes its answers from its own directory, and one with a checkpoint (not ``fresh``) its embeddings."""
    splits = dict.fromkeys([*cfg.data.train_splits, *([cfg.data.eval_split] if cfg.data.eval_split else [])])
    check_inputs([
        ("data.answers", None if resuming else data_path(cfg, cfg.data.answers), ANSWERS_FIX),
        *(entry for name in splits for entry in split_inputs(cfg, name)),
        ("data.glove", data_path(cfg, cfg.data.glove) if fresh else None, GLOVE_FIX),
    ])


class RunData(NamedTuple):
    """What a training process reads: the question vocabulary and answers, the training questions, and the eval
    split's loader and annotations (None where the split has none, or on processes other than the main one)."""

    vocab: Vocabulary
    answers: AnswerVocab
    train_set: ConcatDataset
    eval_loader: Optional[DataLoader]
    eval_annotations: Optional[List[dict]]


def load_run_data(cfg: DictConfig, out_dir: Path, runtime: Runtime, fresh: bool) -> RunData:
    """Every input checked at once (:func:`check_run_inputs`), then the training splits (each annotated, a full
    batch for every process) and on the main process the eval split; questions are padded to
    ``data.max_question_len`` under CUDA graphs (one shape: one graph)."""
    check_run_inputs(cfg, resuming=(out_dir / "config.json").exists(), fresh=fresh)
    train_parts = [load_split(cfg, name) for name in cfg.data.train_splits]
    if any(annotations is None for _, annotations, _ in train_parts):
        raise VQADataError(f"data.train_splits {list(cfg.data.train_splits)} includes a split without annotations")
    # MCAN drops each process's last partial batch (drop_last)
    full_batches(sum(len(qs) for qs, _, _ in train_parts), cfg.train.batch_size,
                 f"training questions of data.train_splits {list(cfg.data.train_splits)}", runtime.env.world_size)
    vocab, answers = prepare_run(cfg, out_dir, [q for qs, _, _ in train_parts for q in qs])
    encode = QuestionEncoder(vocab, cfg.data.max_question_len)
    question_len = cfg.data.max_question_len if runtime.fixed_shapes else None

    def dataset(questions, annotations, store) -> VQADataset:
        return VQADataset(questions, annotations, store, answers, encode, vocab.pad, cfg.data.max_regions,
                          question_len)

    train_set = ConcatDataset([dataset(*part) for part in train_parts])
    eval_loader, eval_annotations = None, None
    if cfg.data.eval_split and runtime.env.is_main:
        questions, eval_annotations, store = load_split(cfg, cfg.data.eval_split)
        if eval_annotations is not None:
            eval_set = dataset(questions, eval_annotations, store)
            eval_loader = DataLoader(eval_set, cfg.train.eval_batch_size, collate_fn=eval_set.collate,
                                     num_workers=cfg.train.num_workers, pin_memory=runtime.pin_memory)
    return RunData(vocab, answers, train_set, eval_loader, eval_annotations)


def save_run(cfg: DictConfig, out_dir: Path, vocab: Vocabulary, answers: AnswerVocab) -> None:
    """``config.json``, ``question_vocab.json`` and ``answers.json`` of a fresh run, written once
    everything that can fail before training has passed (a failed start leaves no run folder)."""
    if not (out_dir / "config.json").exists():
        vocab.save(out_dir / "question_vocab.json")
        answers.save(out_dir / "answers.json")
        atomic_write_json(out_dir / "config.json", to_dict(cfg))


def word_vectors(cfg: DictConfig, vocab: Vocabulary, env: DistEnv) -> torch.Tensor:
    """GloVe vectors for ``vocab`` from ``data.glove``, checked against ``model.word_dim``."""
    vectors, coverage = load_glove(data_path(cfg, cfg.data.glove), vocab)
    if vectors.shape[1] != cfg.model.word_dim:
        raise VQADataError(f"{cfg.data.glove}: vectors have {vectors.shape[1]} dimensions but "
                           f"model.word_dim={cfg.model.word_dim}; set model.word_dim={vectors.shape[1]}")
    if env.is_main:
        console.say(f"GloVe: vectors for {100 * coverage:.1f}% of {len(vocab)} question words")
    return vectors
