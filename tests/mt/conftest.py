"""Fixtures for the translation tests: a tiny raw Multi30k-layout corpus written on the fly."""
from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

WORDS_DE = ["ein", "hund", "mann", "frau", "läuft", "spielt", "im", "park", "mit", "einem", "ball", "kind", "rot",
            "blauen", "hemd", "auf", "der", "straße", "sitzt", "bank"]
WORDS_EN = ["a", "dog", "man", "woman", "runs", "plays", "in", "park", "with", "ball", "child", "red", "blue",
            "shirt", "on", "the", "street", "sits", "bench", "bike"]


def fake_pairs(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    de, en = [], []
    for _ in range(n):
        idx = [rng.randrange(len(WORDS_DE)) for _ in range(rng.randint(3, 8))]
        de.append(" ".join(WORDS_DE[i] for i in idx).capitalize() + ".")
        en.append(" ".join(WORDS_EN[i] for i in idx).capitalize() + ".")
    return de, en


def write_gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


@pytest.fixture
def tiny_root(tmp_path: Path) -> Path:
    """``<root>/mt/multi30k/raw/{train,val,test_2016_flickr}.{de,en}.gz`` with a toy word-for-word language."""
    root = tmp_path / "data"
    for split, n, seed in (("train", 60, 0), ("val", 12, 1), ("test_2016_flickr", 12, 2)):
        de, en = fake_pairs(n, seed)
        write_gz(root / "mt/multi30k/raw" / f"{split}.de.gz", de)
        write_gz(root / "mt/multi30k/raw" / f"{split}.en.gz", en)
    return root


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every mt test runs on one thread (``one_thread`` in tests/conftest.py)."""
