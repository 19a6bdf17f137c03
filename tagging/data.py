"""Universal Dependencies treebanks for part-of-speech tagging.

A treebank is a directory holding ``*-ud-train.conllu``, ``*-ud-dev.conllu`` and
``*-ud-test.conllu`` (each may be gzipped, ``.conllu.gz``), as in a UD release. Files are
read with the ``conllu`` package; only syntactic words are tagged: multiword-token ranges
(``1-2``) and empty nodes (``1.1``) are skipped, as the authors' loader does. Tags are UPOS.

The vocabularies follow the authors' code (``pdufter/convatt``, ``data/univdep.py``): the word index keeps
the most frequent ``vocab_fraction`` of the word types (rounded down, the authors' ``n // 2``) counted over
the splits of ``vocab_splits`` (the authors' ``build_voc_on_all``: all three; ``train``: the training split
only), the rest share ``<unk>`` (so its embedding is trained); characters are those of the training split.
Sentences longer than ``max_len`` are cut into chunks of ``max_len`` words; words keep their first
``max_word_chars`` characters. Each word also carries two flags, from which :mod:`tagging.metrics` takes two
definitions of each of the paper's word groups: OOV (ours: the form never occurs in the training data; the
authors': the word is ``<unk>``, outside the word index) and ambiguous (the form has more than one tag in the
training data; the authors' count only forms inside the word index).
"""
from __future__ import annotations

import gzip
import io
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from common.text.batching import length_sorted_batches
from common.utils.inputs import blank_content

from .config import PAPER_TREEBANKS  # noqa: F401 (re-exported)

SPLITS = ("train", "dev", "test")
#: The 17 universal part-of-speech tags of UD v2, in the order of the guidelines.
UPOS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
        "SCONJ", "SYM", "VERB", "X")
PAD, UNK = 0, 1


class TreebankError(ValueError):
    """A treebank directory or CoNLL-U file that cannot be read; the message names the file and the fix."""


@dataclass
class Sentence:
    words: List[str]
    tags: List[str]


def treebank_dir(data_root: Path, treebank: str) -> Path:
    """The directory of ``treebank``: ``<data_root>/ud/<name>``, ``<data_root>/<name>`` (``UD_`` optional), or
    ``treebank`` itself when it is a directory."""
    if Path(treebank).is_dir():
        return Path(treebank)
    names = [treebank] if treebank.startswith("UD_") else [f"UD_{treebank}", treebank]
    for base in (data_root / "ud", data_root):
        for name in names:
            if (base / name).is_dir():
                return base / name
    ud = data_root / "ud"
    found = sorted(p.name for p in ud.iterdir() if p.is_dir()) if ud.is_dir() else []
    hint = f"; treebanks there: {', '.join(found)}" if found else ""
    raise TreebankError(f"treebank {treebank!r} not found under {ud} or {data_root}{hint}. Pass --treebank NAME "
                        f"(a UD_<Language>-<Name> directory of a UD release) or a directory path, and --data-root")


def split_files(directory: Path) -> Dict[str, Path]:
    """``{"train": path, "dev": path, "test": path}``: the ``*-ud-<split>.conllu[.gz]`` files of a treebank."""
    files = {}
    for split in SPLITS:
        pattern = re.compile(rf".*-ud-{split}\.conllu(\.gz)?$")
        matches = sorted(p for p in directory.iterdir() if pattern.match(p.name))
        if not matches:
            raise TreebankError(f"{directory}: no *-ud-{split}.conllu (or .conllu.gz) file; a UD treebank directory "
                                f"holds train, dev and test files")
        if len(matches) > 1:
            raise TreebankError(f"{directory}: several {split} files ({', '.join(p.name for p in matches)}); "
                                f"keep one per split")
        files[split] = matches[0]
    return files


def _open_text(path: Path) -> io.TextIOBase:
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8", newline="")


def _blocks(path: Path) -> Iterator[Tuple[int, List[str]]]:
    """``(first line number, lines)`` of each blank-line-separated sentence block."""
    block: List[str] = []
    start = 1
    with _open_text(path) as handle:
        try:
            for number, line in enumerate(handle, 1):
                line = line.rstrip("\r\n")
                if line.strip():
                    if not block:
                        start = number
                    block.append(line)
                elif block:
                    yield start, block
                    block = []
        except (UnicodeDecodeError, EOFError, OSError) as err:
            raise TreebankError(f"{path}: cannot be read as UTF-8 CoNLL-U{' (gzip)' if path.suffix == '.gz' else ''}"
                                f" ({err}); re-download the file") from None
    if block:
        yield start, block


def _failing_line(lines: List[str], start: int) -> int:
    """The number of the first token line of a block that ``conllu`` cannot parse (else the block's first)."""
    from conllu.exceptions import ParseException
    from conllu.parser import DEFAULT_FIELDS, parse_line

    for offset, line in enumerate(lines):
        if not line.startswith("#"):
            try:
                parse_line(line, DEFAULT_FIELDS)
            except ParseException:
                return start + offset
    return start


def read_conllu(path: Path) -> List[Sentence]:
    """The sentences of a CoNLL-U file: syntactic words and their UPOS tags."""
    try:
        import conllu
    except ImportError:
        raise TreebankError('reading CoNLL-U needs the conllu package: pip install -e ".[tagging]"') from None

    sentences = []
    for start, lines in _blocks(Path(path)):
        for offset, line in enumerate(lines):
            if not line.startswith("#") and line.count("\t") != 9:
                raise TreebankError(f"{path}:{start + offset}: a token line has {line.count(chr(9)) + 1} "
                                    f"tab-separated columns, CoNLL-U has 10 (ID FORM LEMMA UPOS XPOS FEATS HEAD "
                                    f"DEPREL DEPS MISC); fix or remove the line")
        try:
            tokens = conllu.parse_token_and_metadata("\n".join(lines))
        except conllu.exceptions.ParseException as err:
            raise TreebankError(f"{path}:{_failing_line(lines, start)}: not valid CoNLL-U ({err}); fix the line or "
                                f"remove its sentence") from None
        words, tags = [], []
        token_lines = [start + i for i, line in enumerate(lines) if not line.startswith("#")]
        for line_number, token in zip(token_lines, tokens):
            if not isinstance(token["id"], int):  # a multiword range (1, '-', 2) or an empty node (1, '.', 1)
                continue
            if token["upos"] not in UPOS:
                raise TreebankError(f"{path}:{line_number}: UPOS {token['upos']!r} of word {token['form']!r} is not "
                                    f"one of the 17 UD tags ({' '.join(UPOS)}); fix the tag")
            words.append(token["form"])
            tags.append(token["upos"])
        if words:
            sentences.append(Sentence(words, tags))
    if not sentences:
        reason = blank_content(path) or "no token line of a syntactic word (only comments, ranges or empty nodes)"
        raise TreebankError(f"{path}: no sentence found: {reason}; a CoNLL-U file holds sentences of one token per "
                            f"line, separated by blank lines: put back the treebank's file from its UD release")
    return sentences


@dataclass
class Vocabulary:
    """Word, character and tag indices, and the training-data word statistics of the metrics."""

    words: List[str]
    chars: List[str]
    tags: Tuple[str, ...] = UPOS
    train_forms: set = field(default_factory=set)
    ambiguous_forms: set = field(default_factory=set)

    def __post_init__(self):
        self.word_index = {w: i for i, w in enumerate(self.words)}
        self.char_index = {c: i for i, c in enumerate(self.chars)}
        self.tag_index = {t: i for i, t in enumerate(self.tags)}

    @classmethod
    def build(cls, train: Sequence[Sentence], vocab_fraction: float = 0.5,
              counted: Optional[Sequence[Sentence]] = None) -> "Vocabulary":
        """The vocabularies of ``train``; the word index keeps the most frequent ``vocab_fraction`` of the word types
        of ``counted`` (default ``train``; ties in order of first occurrence, as ``Counter.most_common``)."""
        counts = Counter(w for s in train for w in s.words)
        indexed = counts if counted is None else Counter(w for s in counted for w in s.words)
        keep = max(1, math.floor(len(indexed) * vocab_fraction))
        tags_of = defaultdict(set)
        for s in train:
            for w, t in zip(s.words, s.tags):
                tags_of[w].add(t)
        chars = sorted({c for w in counts for c in w})
        return cls(words=["<pad>", "<unk>"] + [w for w, _ in indexed.most_common(keep)],
                   chars=["<pad>", "<unk>"] + chars, train_forms=set(counts),
                   ambiguous_forms={w for w, tags in tags_of.items() if len(tags) > 1})

    def state(self) -> dict:
        return {"words": self.words, "chars": self.chars, "tags": list(self.tags),
                "train_forms": sorted(self.train_forms), "ambiguous_forms": sorted(self.ambiguous_forms)}

    @classmethod
    def from_state(cls, state: dict) -> "Vocabulary":
        return cls(state["words"], state["chars"], tuple(state["tags"]), set(state["train_forms"]),
                   set(state["ambiguous_forms"]))


@dataclass
class Chunk:
    """One sequence of at most ``max_len`` words, as index tensors."""

    words: Tensor      # [L]
    chars: Tensor      # [L, C]
    tags: Tensor       # [L]
    oov: Tensor        # [L] bool
    ambiguous: Tensor  # [L] bool


def encode(sentences: Sequence[Sentence], vocab: Vocabulary, max_len: int = 60, max_word_chars: int = 20
           ) -> List[Chunk]:
    """Index tensors for every chunk of every sentence."""
    chunks = []
    for s in sentences:
        for lo in range(0, len(s.words), max_len):
            words, tags = s.words[lo:lo + max_len], s.tags[lo:lo + max_len]
            width = max(min(len(w), max_word_chars) for w in words)
            chars = torch.zeros(len(words), width, dtype=torch.long)
            for i, w in enumerate(words):
                ids = [vocab.char_index.get(c, UNK) for c in w[:max_word_chars]]
                chars[i, :len(ids)] = torch.tensor(ids)
            chunks.append(Chunk(words=torch.tensor([vocab.word_index.get(w, UNK) for w in words]),
                                chars=chars, tags=torch.tensor([vocab.tag_index[t] for t in tags]),
                                oov=torch.tensor([w not in vocab.train_forms for w in words]),
                                ambiguous=torch.tensor([w in vocab.ambiguous_forms for w in words])))
    return chunks


@dataclass
class Batch:
    words: Tensor       # [B, L], PAD beyond each length
    chars: Tensor       # [U, C]: the characters of each distinct word of the batch; row 0 is padding
    char_index: Tensor  # [B, L]: the row of ``chars`` of each word (0 beyond each length)
    tags: Tensor        # [B, L], -100 beyond each length (ignored by cross_entropy)
    mask: Tensor        # [B, L] bool: a real word
    oov: Tensor         # [B, L] bool
    ambiguous: Tensor   # [B, L] bool

    def to(self, device) -> "Batch":
        return Batch(*(getattr(self, name).to(device, non_blocking=True) for name in self.__dataclass_fields__))


def collate(chunks: Sequence[Chunk]) -> Batch:
    """Pad a list of chunks to the longest one; each distinct word's characters appear once (the character
    CNN then runs once per word type, not per token)."""
    B, L = len(chunks), max(len(c.words) for c in chunks)
    words = torch.full((B, L), PAD, dtype=torch.long)
    tags = torch.full((B, L), -100, dtype=torch.long)
    mask, oov, ambiguous = (torch.zeros(B, L, dtype=torch.bool) for _ in range(3))
    for b, c in enumerate(chunks):
        n = len(c.words)
        words[b, :n], tags[b, :n], mask[b, :n] = c.words, c.tags, True
        oov[b, :n], ambiguous[b, :n] = c.oov, c.ambiguous
    C = max(c.chars.shape[1] for c in chunks)
    padded = torch.cat([torch.zeros(1, C, dtype=torch.long)] +
                       [F.pad(c.chars, (0, C - c.chars.shape[1])) for c in chunks])
    chars, inverse = torch.unique(padded, dim=0, return_inverse=True)  # the all-padding row sorts first
    char_index = torch.zeros(B, L, dtype=torch.long)
    char_index[mask] = inverse[1:]
    return Batch(words, chars, char_index, tags, mask, oov, ambiguous)


def batches(chunks: Sequence[Chunk], batch_size: int, order: Optional[Sequence[Sequence[int]]] = None
            ) -> Iterator[Batch]:
    """The batches of ``chunks`` listed in ``order`` (lists of chunk indices; default: consecutive batches)."""
    if order is None:
        order = [range(lo, min(lo + batch_size, len(chunks))) for lo in range(0, len(chunks), batch_size)]
    for indices in order:
        yield collate([chunks[i] for i in indices])


def length_sorted_order(chunks: Sequence[Chunk], batch_size: int) -> List[List[int]]:
    """Evaluation batches of chunks sorted by length (least padding; the order does not change any metric)."""
    return length_sorted_batches([len(c.words) for c in chunks], batch_size)


@dataclass
class Treebank:
    name: str
    files: Dict[str, Path]
    sentences: Dict[str, List[Sentence]]
    vocab: Vocabulary
    chunks: Dict[str, List[Chunk]]

    def counts(self) -> Dict[str, Dict[str, int]]:
        return {split: {"sentences": len(s), "words": sum(len(x.words) for x in s)}
                for split, s in self.sentences.items()}


#: Which splits the word index is counted over (``data.vocab_splits``).
VOCAB_SPLITS = {"all": SPLITS, "train": ("train",)}


def load_treebank(data_root: Path, treebank: str, max_len: int = 60, max_word_chars: int = 20,
                  vocab_fraction: float = 0.5, vocab_splits: str = "all") -> Treebank:
    """Read, index and chunk the three splits of ``treebank``; the word index counts the ``vocab_splits``
    (``all``, the authors' default, or ``train``)."""
    if vocab_splits not in VOCAB_SPLITS:
        raise ValueError(f"vocab_splits={vocab_splits!r}: use one of {', '.join(VOCAB_SPLITS)}")
    directory = treebank_dir(Path(data_root), treebank)
    files = split_files(directory)
    sentences = {split: read_conllu(path) for split, path in files.items()}
    counted = [s for split in VOCAB_SPLITS[vocab_splits] for s in sentences[split]]
    vocab = Vocabulary.build(sentences["train"], vocab_fraction, counted)
    chunks = {split: encode(s, vocab, max_len, max_word_chars) for split, s in sentences.items()}
    return Treebank(directory.name, files, sentences, vocab, chunks)
