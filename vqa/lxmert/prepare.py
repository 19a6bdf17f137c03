"""What a fine-tuning run starts from: ``--demo``'s data, the check of every input file, the training and eval
questions, the adaptation that the config asks for, the adapted model (pretrained, random, or empty to resume
into), the files of a fresh run and what the pretrained checkpoint supplied. Imported once the command line and
the config have been checked (:mod:`vqa.lxmert.train`)."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from omegaconf import DictConfig

from common.utils import atomic_write_json
from common.utils.config import to_dict
from vqa.answers import AnswerVocab
from vqa.data import VQADataError, VQADataset, data_path, load_split

from .data import bert_encoder

if TYPE_CHECKING:  # transformers and the model are imported when a function needs them
    from torch.utils.data import ConcatDataset

    from .adapt import Adaptation
    from .model import LoadReport


def write_demo_data(cfg: DictConfig) -> None:
    """``--demo``'s inputs under ``data_root``: the synthetic questions, features and answers of
    :func:`vqa.fixtures.write_demo_data`, and a word-piece vocabulary that ``model.random_init`` covers."""
    from vqa.fixtures import write_demo_data as write_data, write_wordpiece_vocab

    fixture = write_data(cfg.data_root, cfg.model.random_init.visual_feat_dim)
    size = write_wordpiece_vocab(data_path(cfg, cfg.data.vocab), list(fixture.questions.values()))
    if size > cfg.model.random_init.vocab_size:
        raise ValueError(f"model.random_init.vocab_size={cfg.model.random_init.vocab_size} is smaller than the "
                         f"demo's {size} word pieces; set model.random_init.vocab_size={size} or more")


def adaptation_of(cfg: DictConfig) -> Adaptation:
    from .adapt import Adaptation

    return Adaptation.from_dict(to_dict(cfg.model.adaptation))


def check_run_inputs(cfg: DictConfig, resuming: bool) -> None:
    """One error naming every input file of the run that is missing (answers, word pieces, the splits'
    questions, annotations and features, pretrained weights, answer table), each with its fix.
    A resumed run takes the answers and every weight from its own directory."""
    from common.utils.paths import check_inputs
    from vqa.answers import ANSWERS_FIX
    from vqa.data import split_inputs

    from .answer_head import ANSWER_TABLE_FIX
    from .data import VOCAB_FIX
    from .model import PRETRAINED_FIX

    pretrained = not resuming and cfg.model.random_init is None
    splits = dict.fromkeys([*cfg.data.train_splits, *([cfg.data.eval_split] if cfg.data.eval_split else [])])
    check_inputs([
        ("data.answers", None if resuming else data_path(cfg, cfg.data.answers), ANSWERS_FIX),
        ("data.vocab", data_path(cfg, cfg.data.vocab), VOCAB_FIX),
        *(entry for name in splits for entry in split_inputs(cfg, name)),
        ("model.pretrained", data_path(cfg, cfg.model.pretrained) / "config.json" if pretrained else None,
         PRETRAINED_FIX),
        ("model.answer_table", data_path(cfg, cfg.model.answer_table) if pretrained else None, ANSWER_TABLE_FIX),
    ])


def load_data(cfg: DictConfig, answers: AnswerVocab
              ) -> Tuple[ConcatDataset, Optional[VQADataset], Optional[List[dict]]]:
    """The questions of ``data.train_splits``, and those of ``data.eval_split`` with its annotations (None, None
    without one); a split without annotations to train on or to score is an error."""
    from torch.utils.data import ConcatDataset

    encode = bert_encoder(data_path(cfg, cfg.data.vocab), cfg.data.max_words)
    train_parts = [load_split(cfg, name) for name in cfg.data.train_splits]
    if any(annotations is None for _, annotations, _ in train_parts):
        raise VQADataError(f"data.train_splits {list(cfg.data.train_splits)} includes a split without annotations")
    train_set = ConcatDataset([VQADataset(qs, anns, store, answers, encode, pad_id=0, max_regions=cfg.data.max_regions)
                               for qs, anns, store in train_parts])
    if not cfg.data.eval_split:
        return train_set, None, None
    qs, annotations, store = load_split(cfg, cfg.data.eval_split)
    if annotations is None:
        raise VQADataError(f"data.eval_split={cfg.data.eval_split!r} has no annotations to score; evaluate it "
                           f"with python -m vqa.lxmert.evaluate --split {cfg.data.eval_split} after training")
    return train_set, VQADataset(qs, annotations, store, answers, encode, 0, cfg.data.max_regions), annotations


def prepare_model(cfg: DictConfig, out_dir: Path, answers: AnswerVocab, resuming: bool):
    """The adapted model and its load report (None when resuming or randomly initialised)."""
    from transformers import LxmertConfig

    from .answer_head import load_answer_table, transfer_answer_head
    from .model import build_vqa_model, load_vqa_model

    adaptation = adaptation_of(cfg)
    if resuming:  # the checkpoint holds every weight; the pretrained directory is not needed
        config = LxmertConfig.from_dict(json.loads((out_dir / "lxmert_config.json").read_text()))
        return build_vqa_model(config, len(answers), adaptation), None
    if cfg.model.random_init is not None:
        model = build_vqa_model(LxmertConfig(**to_dict(cfg.model.random_init)), len(answers), adaptation)
        return model, None
    pretrained = data_path(cfg, cfg.model.pretrained)
    model, report = load_vqa_model(pretrained, len(answers), adaptation)
    if cfg.model.answer_table:
        table = load_answer_table(data_path(cfg, cfg.model.answer_table))
        report.answers_from_pretraining, _ = transfer_answer_head(model, pretrained, table, answers.answers)
    return model, report


def write_run_files(out_dir: Path, config: Dict, model, answers: AnswerVocab, report: Optional[LoadReport]) -> None:
    """A fresh run's ``config.json``, ``lxmert_config.json``, ``answers.json`` and ``pretrained.json`` (when the
    weights are pretrained)."""
    atomic_write_json(out_dir / "config.json", config)
    atomic_write_json(out_dir / "lxmert_config.json", model.config.to_dict())
    answers.save(out_dir / "answers.json")
    if report is not None:
        atomic_write_json(out_dir / "pretrained.json", asdict(report))


def pretrained_summary(path: Path) -> Optional[Dict]:
    """What the first run of an ``out_dir`` loaded from the pretrained checkpoint (its ``pretrained.json``; None:
    a random start)."""
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    return {"checkpoint": report["checkpoint"], "tensors_loaded": report["loaded"],
            "unused_pretraining_heads": len(report["unused"]), "new": report["initialised"],
            "answers_from_pretraining": report["answers_from_pretraining"]}
