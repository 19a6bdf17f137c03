"""Text files and Moses-style preprocessing.

Corpora are one sentence per line, plain or gzip (``.gz``). Preprocessing is what fairseq's
``prepare-iwslt14.sh`` and the Multi30k ``tok/*.lc.norm.tok.*`` files use: Moses punctuation
normalisation, Moses tokenisation with its escapes (``&apos;``, ``&quot;``) and lowercasing,
here with ``sacremoses``.
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Iterable, List, Union

PathLike = Union[str, Path]


def open_text(path: PathLike, mode: str = "rt"):
    """Open a UTF-8 text file, gzip-compressed when its name ends in ``.gz``."""
    path = Path(path)
    if "r" in mode and not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    return opener(path, mode, encoding="utf-8")


def read_lines(path: PathLike) -> List[str]:
    """The lines of ``path`` without their newline (``\\r`` dropped too)."""
    with open_text(path) as f:
        try:
            return [line.rstrip("\r\n") for line in f]
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text ({err}); convert it with `iconv -t utf-8`") from None


def write_lines(path: PathLike, lines: Iterable[str]) -> Path:
    """Write ``lines`` atomically (temporary file, then rename); gzip when the name ends in ``.gz``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp.{path.name}")  # same suffix, so the same compression
    with open_text(tmp, "wt") as f:
        for line in lines:
            f.write(line + "\n")
    tmp.replace(path)
    return path


class MosesPreprocessor:
    """``[normalize-punctuation.perl |] tokenizer.perl | lowercase.perl`` for one language.

    fairseq's IWSLT'14 script tokenises without normalising punctuation; Multi30k's
    ``lc.norm.tok`` files normalise first.
    """

    def __init__(self, lang: str, lowercase: bool = True, normalize_punctuation: bool = False):
        from sacremoses import MosesPunctNormalizer, MosesTokenizer

        self.lang, self.lowercase = lang, lowercase
        self._normalizer = MosesPunctNormalizer(lang=lang) if normalize_punctuation else None
        self._tokenizer = MosesTokenizer(lang=lang)

    def __call__(self, line: str) -> str:
        line = line.strip()
        if self._normalizer is not None:
            line = self._normalizer.normalize(line)
        tokens = self._tokenizer.tokenize(line, escape=True, return_str=True)
        return tokens.lower() if self.lowercase else tokens

    def batch(self, lines: Iterable[str]) -> List[str]:
        return [self(line) for line in lines]


class MosesDetokenizer:
    """Undo Moses tokenisation (and its escapes) for detokenised SacreBLEU and for output."""

    def __init__(self, lang: str):
        from sacremoses import MosesDetokenizer as _Detok

        self._detok = _Detok(lang=lang)

    def __call__(self, line: str) -> str:
        return self._detok.detokenize(line.split(), unescape=True)


def check_parallel(src: List[str], tgt: List[str], src_path: PathLike, tgt_path: PathLike) -> None:
    """An error naming both files when the two sides of a parallel corpus differ in length."""
    if len(src) != len(tgt):
        raise ValueError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: parallel files "
                         "must have one sentence per line on each side")
