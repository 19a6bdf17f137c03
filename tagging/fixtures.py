"""A toy treebank in the official CoNLL-U format: the ``--demo`` data of ``tagging.train`` and the tests'.

Toy English sentences ``DET (ADJ) NOUN VERB (DET NOUN) PUNCT``: "run" and "walk" are NOUN after a
determiner and VERB after a noun, so they are ambiguous; "bird" and "sings" occur only in dev and test
(out of vocabulary). Every token line has the 10 columns, with a ``sent_id`` and ``text`` comment.
"""
from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import List, Sequence, Tuple

DETS = ("the", "a")
NOUNS = ("dog", "cat", "run", "walk", "man")
VERBS = ("sees", "eats", "run", "walk")
ADJS = ("big", "small", "red")
#: The demo treebank's directory name under ``<data_root>/ud``.
DEMO_TREEBANK = "UD_Demo-Toy"


def toy_sentence(rng: random.Random, unseen: bool = False) -> List[Tuple[str, str]]:
    """``[(form, upos), ...]``: DET (ADJ) NOUN VERB (DET NOUN) PUNCT; ``unseen`` mixes in the OOV words."""
    words = [(rng.choice(DETS), "DET")]
    if rng.random() < 0.5:
        words.append((rng.choice(ADJS), "ADJ"))
    words.append(("bird" if unseen and rng.random() < 0.5 else rng.choice(NOUNS), "NOUN"))
    words.append(("sings" if unseen and rng.random() < 0.5 else rng.choice(VERBS), "VERB"))
    if rng.random() < 0.6:
        words += [(rng.choice(DETS), "DET"), (rng.choice(NOUNS), "NOUN")]
    return words + [(".", "PUNCT")]


def conllu_text(sentences: Sequence[Sequence[Tuple[str, str]]], start_id: int = 1) -> str:
    """CoNLL-U for ``sentences`` (10 columns, a sent_id comment, a blank line after each sentence)."""
    blocks = []
    for k, words in enumerate(sentences, start_id):
        lines = [f"# sent_id = s{k}", f"# text = {' '.join(w for w, _ in words)}"]
        for i, (form, upos) in enumerate(words, 1):
            lines.append("\t".join([str(i), form, form, upos, "_", "_", "0" if i == 1 else "1",
                                    "root" if i == 1 else "dep", "_", "_"]))
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks) + "\n"


def write_toy_treebank(directory: Path, train: int = 30, dev: int = 6, test: int = 6, seed: int = 0,
                       gzipped: bool = False) -> Path:
    """``directory/xx_tiny-ud-{train,dev,test}.conllu[.gz]`` of toy sentences; returns ``directory``."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("dev", dev), ("test", test)):
        text = conllu_text([toy_sentence(rng, unseen=split != "train") for _ in range(n)])
        name = f"xx_tiny-ud-{split}.conllu"
        if gzipped:
            (directory / f"{name}.gz").write_bytes(gzip.compress(text.encode("utf-8")))
        else:
            (directory / name).write_text(text, encoding="utf-8")
    return directory


def write_demo_treebank(data_root: Path) -> Path:
    """The ``--demo`` treebank, ``<data_root>/ud/UD_Demo-Toy`` (300 / 60 / 60 sentences, gzipped)."""
    return write_toy_treebank(Path(data_root) / "ud" / DEMO_TREEBANK, train=300, dev=60, test=60, gzipped=True)
