"""A toy German-English corpus written on the fly: the demo (``python -m mt.train --preset demo``) and the tests.

The toy language translates word for word from a 20-word vocabulary (``ein hund läuft`` -> ``a dog runs``),
so that a small model learns it within a minute on a CPU. The files follow the Multi30k layout,
``<dir>/raw/<split>.{de,en}.gz``, raw (capitalised, with a full stop) as ``mt.prepare`` expects.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import List, Mapping, Tuple

from .text import write_lines

WORDS_DE = ["ein", "hund", "mann", "frau", "läuft", "spielt", "im", "park", "mit", "einem", "ball", "kind", "rot",
            "blauen", "hemd", "auf", "der", "straße", "sitzt", "bank"]
WORDS_EN = ["a", "dog", "man", "woman", "runs", "plays", "in", "park", "with", "ball", "child", "red", "blue",
            "shirt", "on", "the", "street", "sits", "bench", "bike"]
#: Pairs per split of the demo corpus.
DEMO_SPLITS = {"train": 2000, "val": 100, "test": 100}


def fake_pairs(n: int, seed: int = 0) -> Tuple[List[str], List[str]]:
    """``n`` sentence pairs of 3-8 words, the same for the same seed."""
    rng = random.Random(seed)
    de, en = [], []
    for _ in range(n):
        idx = [rng.randrange(len(WORDS_DE)) for _ in range(rng.randint(3, 8))]
        de.append(" ".join(WORDS_DE[i] for i in idx).capitalize() + ".")
        en.append(" ".join(WORDS_EN[i] for i in idx).capitalize() + ".")
    return de, en


def write_corpus(directory: Path, splits: Mapping[str, int]) -> Path:
    """``<directory>/raw/<split>.{de,en}.gz`` with ``splits[split]`` pairs (the i-th split drawn with seed i),
    each file written atomically; returns ``directory``."""
    directory = Path(directory)
    for seed, (split, n) in enumerate(splits.items()):
        de, en = fake_pairs(n, seed)
        write_lines(directory / "raw" / f"{split}.de.gz", de)
        write_lines(directory / "raw" / f"{split}.en.gz", en)
    return directory


def demo_corpus(directory: Path) -> Path:
    """The demo corpus in ``directory`` (written unless already there); returns ``directory``."""
    files = [Path(directory) / "raw" / f"{split}.{lang}.gz" for split in DEMO_SPLITS for lang in ("de", "en")]
    return Path(directory) if all(f.is_file() for f in files) else write_corpus(directory, DEMO_SPLITS)
