"""A token <-> id vocabulary with special symbols, built from counts and saved as JSON.

Translation (BPE units), captioning (words with count >= 5, else UNK) and VQA questions all
map tokens to ids the same way; only their tokenisers and thresholds differ.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Optional

from ..utils.io import PathLike, atomic_write_json

DEFAULT_SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
_ROLES = {"pad": "<pad>", "unk": "<unk>", "bos": "<bos>", "eos": "<eos>"}


class Vocabulary:
    """Tokens with ids ``0..len-1``; the specials come first, in the order given.

    ``pad``, ``unk``, ``bos`` and ``eos`` are the ids of ``<pad>``, ``<unk>``, ``<bos>`` and
    ``<eos>`` (``None`` when that special is absent). Unknown tokens map to ``unk``; without
    an ``<unk>`` special they raise ``KeyError``.
    """

    def __init__(self, tokens: Iterable[str], specials: Sequence[str] = DEFAULT_SPECIALS):
        self.specials = tuple(specials)
        self._tokens: list[str] = []
        self._ids: dict[str, int] = {}
        for token in (*self.specials, *tokens):
            if token in self._ids:
                raise ValueError(f"duplicate token {token!r} in the vocabulary")
            self._ids[token] = len(self._tokens)
            self._tokens.append(token)
        for role, symbol in _ROLES.items():
            setattr(self, role, self._ids[symbol] if symbol in self.specials else None)

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], min_count: int = 1, max_size: Optional[int] = None,
                    specials: Sequence[str] = DEFAULT_SPECIALS) -> "Vocabulary":
        """Tokens seen at least ``min_count`` times, most frequent first (ties by token), at
        most ``max_size`` of them besides the specials."""
        kept = sorted((t for t, c in counts.items() if c >= min_count and t not in specials),
                      key=lambda t: (-counts[t], t))
        return cls(kept[:max_size] if max_size is not None else kept, specials)

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: str) -> bool:
        return token in self._ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and (self._tokens, self.specials) == (other._tokens, other.specials)

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} tokens, specials={list(self.specials)})"

    @property
    def tokens(self) -> list[str]:
        return list(self._tokens)

    def index(self, token: str) -> int:
        """The id of ``token``; ``unk`` when it is not in the vocabulary."""
        found = self._ids.get(token)
        if found is not None:
            return found
        if self.unk is None:
            raise KeyError(f"token {token!r} is not in the vocabulary, which has no <unk> special")
        return self.unk

    def token(self, index: int) -> str:
        return self._tokens[index]

    def encode(self, tokens: Iterable[str], add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = [self.index(t) for t in tokens]
        if add_bos:
            ids.insert(0, self._require("bos"))
        if add_eos:
            ids.append(self._require("eos"))
        return ids

    def decode(self, ids: Iterable[int], strip_specials: bool = True, stop_at_eos: bool = True) -> list[str]:
        """Tokens of ``ids``, cut at the first ``eos`` and without pad/bos/eos (``<unk>`` is kept)."""
        dropped = {i for i in (self.pad, self.bos, self.eos) if i is not None} if strip_specials else set()
        out = []
        for i in ids:
            i = int(i)
            if stop_at_eos and i == self.eos:
                break
            if i not in dropped:
                out.append(self._tokens[i])
        return out

    def save(self, path: PathLike) -> Path:
        return atomic_write_json(path, {"specials": list(self.specials),
                                        "tokens": self._tokens[len(self.specials):]})

    @classmethod
    def load(cls, path: PathLike) -> "Vocabulary":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(data["tokens"], data["specials"])
        except FileNotFoundError:
            raise FileNotFoundError(f"vocabulary file {path} does not exist; build it with the domain's "
                                    f"prepare step") from None
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{path} is not a vocabulary file: expected JSON with 'specials' and 'tokens' "
                             f"lists ({err}); rebuild it with the domain's prepare step") from None

    def _require(self, role: str) -> int:
        value = getattr(self, role)
        if value is None:
            raise ValueError(f"this vocabulary has no {_ROLES[role]} special; build it with specials that "
                             f"include {_ROLES[role]!r}")
        return value
