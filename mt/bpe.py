"""Byte-pair encoding with ``subword-nmt`` (Sennrich et al., 2016), learned once and cached.

Codes are learned jointly on the source and target training text (as fairseq's
``prepare-iwslt14.sh`` does) and stored under a name derived from the text's hash and the
number of merges, so a second preparation of the same data reuses them. Continuation
units end in ``@@``; :func:`remove_bpe` is ``sed 's/@@ //g'``.
"""
from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path
from typing import Iterable, List, Sequence
from unittest import mock

from common.utils import atomic_write_text, console

SEPARATOR = "@@"
_JOIN = re.compile(r"@@( |$)")


def _fingerprint(texts: Sequence[Sequence[str]], num_merges: int) -> str:
    digest = hashlib.sha256(f"merges={num_merges}\n".encode())
    for lines in texts:
        for line in lines:
            digest.update(line.encode("utf-8") + b"\n")
    return digest.hexdigest()[:16]


def learn_codes(texts: Sequence[Sequence[str]], num_merges: int, cache: Path, min_frequency: int = 2) -> Path:
    """Learn ``num_merges`` joint BPE merges on the lines of ``texts``; the codes file path.

    The file is ``cache/bpe<num_merges>.<hash>.codes``; it is reused when it already exists.
    """
    from subword_nmt import learn_bpe as subword

    path = Path(cache) / f"bpe{num_merges}.{_fingerprint(texts, num_merges)}.codes"
    if path.is_file():
        return path
    joined = io.StringIO("".join(line + "\n" for lines in texts for line in lines))
    codes = io.StringIO()
    # subword-nmt draws its own tqdm bar over the merges; show it as the other progress is shown
    with mock.patch.object(subword, "tqdm", lambda merges, *a, **k: console.progress(merges, desc="BPE merge")):
        subword.learn_bpe(joined, codes, num_merges, min_frequency=min_frequency)
    atomic_write_text(path, codes.getvalue())
    return path


class BPE:
    """Apply learned codes to tokenised lines: ``"ein spielhaus"`` -> ``"ein spiel@@ haus"``."""

    def __init__(self, codes: Path):
        from subword_nmt.apply_bpe import BPE as _BPE

        codes = Path(codes)
        if not codes.is_file():
            raise FileNotFoundError(f"BPE codes file {codes} does not exist; run `python -m mt.prepare` first")
        with open(codes, encoding="utf-8") as f:
            self._bpe = _BPE(f, separator=SEPARATOR)
        self.codes = codes

    def __call__(self, line: str) -> str:
        return self._bpe.process_line(line)

    def batch(self, lines: Iterable[str]) -> List[str]:
        return [self(line) for line in lines]


def remove_bpe(line: str) -> str:
    """Join BPE units back into tokens (``sed -r 's/(@@ )|(@@ ?$)//g'``)."""
    return _JOIN.sub("", line)
