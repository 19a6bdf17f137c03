"""Fixtures for the translation tests: a tiny raw Multi30k-layout corpus written on the fly (mt.fixtures)."""
from __future__ import annotations

from pathlib import Path

import pytest

from mt.fixtures import write_corpus


@pytest.fixture
def tiny_root(tmp_path: Path) -> Path:
    """``<root>/mt/multi30k/raw/{train,val,test_2016_flickr}.{de,en}.gz`` with a toy word-for-word language."""
    root = tmp_path / "data"
    write_corpus(root / "mt/multi30k", {"train": 60, "val": 12, "test_2016_flickr": 12})
    return root


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every mt test runs on one thread (``one_thread`` in tests/conftest.py)."""
