"""Fixtures of the LXMERT tests: a tiny config, a saved checkpoint, a VQA fixture with a tiny vocabulary."""
from __future__ import annotations

import pytest
import torch
from transformers import LxmertConfig, LxmertModel

from vqa.fixtures import write_vqa_fixture, write_wordpiece_vocab

from .helpers import tiny_config


@pytest.fixture
def config() -> LxmertConfig:
    return tiny_config()


@pytest.fixture
def pretrained_dir(tmp_path, config):
    """An ``LxmertModel`` checkpoint written with ``save_pretrained``."""
    torch.manual_seed(0)
    LxmertModel(config).save_pretrained(tmp_path / "pretrained")
    return tmp_path / "pretrained"


@pytest.fixture(scope="session")
def vqa_root(tmp_path_factory):
    """A VQA fixture (train, val, unannotated test; 8 images x 4 questions each, 10-36 regions of
    16-d features) and a word-piece vocabulary of its question words."""
    root = tmp_path_factory.mktemp("lxmert_vqa")
    fixture = write_vqa_fixture(root, subtypes=("train2014", "val2014", "test2015"), num_images=8,
                                questions_per_image=4, num_regions=(10, 36), feature_dim=16)
    size = write_wordpiece_vocab(root / "vocab.txt", list(fixture.questions.values()))
    return root, fixture, size
