"""Fixtures for the tagging tests: a tiny CoNLL-U treebank written on the fly, one torch thread."""
from __future__ import annotations

from pathlib import Path

import pytest

from tagging.fixtures import write_toy_treebank


@pytest.fixture
def tiny_treebank(tmp_path: Path) -> Path:
    """A 42-sentence toy treebank directory (30 train, 6 dev, 6 test)."""
    return write_toy_treebank(tmp_path / "UD_Toy-Tiny")


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every tagging test runs on one thread (``one_thread`` in tests/conftest.py)."""
