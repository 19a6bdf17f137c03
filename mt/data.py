"""Corpora, their preparation (tokenise, lowercase, BPE, vocabularies) and id tensors.

Source files under the data root (``--data-root``, default ``$ATTN_DATA_ROOT``):

* ``mt/multi30k/raw/{train,val,test_2016_flickr,...}.{de,en}.gz``: raw text (Moses
  normalisation, tokenisation and lowercasing are applied here);
* ``mt/iwslt14_de_en/{train,valid,test}.{de,en}[.gz]``: the output of fairseq's
  ``prepare-iwslt14.sh`` (already tokenised and lowercased; ``python -m mt.prepare iwslt14``
  makes it from the TED release).

The ``demo`` corpus needs no data root: :mod:`mt.fixtures` writes it into ``<cache>/mt/demo`` on first use.

A prepared directory (default ``<cache>/mt/<dataset>-bpe<merges>``; never inside the data root) holds
``<split>.tok.<lang>`` (tokenised, lowercased: the BLEU references), ``<split>.raw.<lang>``
(untokenised: the SacreBLEU references; Moses-detokenised when only tokenised text exists),
``<split>.bpe.<lang>``,
the BPE codes, ``vocab.<lang>.json`` and ``prepared.json`` describing how it was made.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from common.text import Vocabulary
from common.utils import atomic_write_json, cache_dir
from common.utils.inputs import blank_content

from .bpe import BPE, learn_codes
from .text import MosesDetokenizer, MosesPreprocessor, check_parallel, read_lines, write_lines

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CorpusSpec:
    """Where a corpus lives under the data root and how it is preprocessed."""

    name: str
    subdir: str
    src: str
    tgt: str
    train: str
    splits: Tuple[str, ...]
    tokenised: bool          # files are already Moses-tokenised and lowercased
    num_merges: int
    missing_hint: str = ""
    fixture: bool = False    # written by mt.fixtures into the cache on first use, not read from the data root

    def source_dir(self, root: Path) -> Path:
        """The corpus directory under the data ``root``; for a fixture corpus, ``<cache>/<subdir>``, written first."""
        if self.fixture:
            from .fixtures import demo_corpus

            return demo_corpus(cache_dir() / self.subdir)
        return Path(root) / self.subdir

    def path(self, base: Path, split: str, lang: str) -> Path:
        """The file of ``split`` in ``lang`` under the corpus directory ``base`` (``.gz`` or plain,
        whichever exists; else the ``.gz`` name)."""
        base = Path(base)
        stem = f"raw/{split}.{lang}" if not self.tokenised else f"{split}.{lang}"
        for candidate in (base / f"{stem}.gz", base / stem):
            if candidate.is_file():
                return candidate
        return base / f"{stem}.gz"


CORPORA: Dict[str, CorpusSpec] = {
    "multi30k": CorpusSpec(
        name="multi30k", subdir="mt/multi30k", src="de", tgt="en", train="train",
        splits=("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr"),
        tokenised=False, num_merges=8000,
        missing_hint="Multi30k task 1 is published at https://github.com/multi30k/dataset (data/task1/raw)",
    ),
    "iwslt14": CorpusSpec(
        name="iwslt14", subdir="mt/iwslt14_de_en", src="de", tgt="en", train="train",
        splits=("train", "valid", "test"), tokenised=True, num_merges=10000,
        missing_hint=("make it with `python -m mt.prepare iwslt14` (fairseq's prepare-iwslt14.sh: it downloads "
                      "de-en.tgz when online, or reads it from <data-root>/mt/iwslt14_de_en/de-en.tgz)"),
    ),
    "demo": CorpusSpec(name="demo", subdir="mt/demo", src="de", tgt="en", train="train",
                       splits=("train", "val", "test"), tokenised=False, num_merges=100, fixture=True,
                       missing_hint="mt.fixtures writes it on first use: delete its directory to write it again"),
}


class DataError(ValueError):
    """A missing or malformed corpus file; the message names the file and the fix."""


def corpus(name: str) -> CorpusSpec:
    try:
        return CORPORA[name]
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; choose one of {sorted(CORPORA)}") from None


def default_prepared_dir(name: str, num_merges: Optional[int] = None) -> Path:
    """``<cache>/mt/<dataset>-bpe<merges>`` (the dataset's default number of merges when None)."""
    return cache_dir() / "mt" / f"{name}-bpe{num_merges or corpus(name).num_merges}"


def require_file(path: Path, spec: CorpusSpec) -> Path:
    if not Path(path).is_file():
        raise DataError(f"{path} is missing ({spec.name}); {spec.missing_hint}. Pass --data-root (or set "
                        "ATTN_DATA_ROOT) to the directory that holds mt/")
    return Path(path)


def read_corpus_file(path: Path, spec: CorpusSpec) -> List[str]:
    """The lines of a source file of ``spec``; DataError when it is missing or holds no sentence."""
    lines = read_lines(require_file(path, spec))
    if not any(line.strip() for line in lines):
        raise DataError(f"{path}: no sentences ({spec.name}): {blank_content(path)}; {spec.missing_hint}")
    return lines


def prepare_corpus(spec: CorpusSpec, source_dir: Path, out_dir: Path, num_merges: Optional[int] = None,
                   splits: Optional[Sequence[str]] = None, progress=None) -> Path:
    """Tokenise the files in ``source_dir``, learn joint BPE on train, apply it and build
    vocabularies into ``out_dir``.

    Splits whose files are absent are skipped (listed in ``prepared.json``), except train.
    Returns ``out_dir``. ``progress`` is an optional callable taking a message.
    """
    out_dir = Path(out_dir)
    num_merges = num_merges or spec.num_merges
    splits = list(splits or spec.splits)
    if spec.train not in splits:
        splits.insert(0, spec.train)
    say = progress or (lambda msg: None)
    tokenised: Dict[Tuple[str, str], List[str]] = {}
    raw: Dict[Tuple[str, str], List[str]] = {}
    missing = []
    for split in splits:
        if split != spec.train and not spec.path(source_dir, split, spec.src).is_file():
            missing.append(split)
            continue
        for lang in (spec.src, spec.tgt):
            say(f"tokenising {split}.{lang}")
            raw[split, lang] = read_corpus_file(spec.path(source_dir, split, lang), spec)
            tokenised[split, lang] = (raw[split, lang] if spec.tokenised
                                      else MosesPreprocessor(lang, normalize_punctuation=True).batch(raw[split, lang]))
            if spec.tokenised:  # no raw text: detokenise for SacreBLEU references
                raw[split, lang] = [MosesDetokenizer(lang)(line) for line in raw[split, lang]]
        check_parallel(tokenised[split, spec.src], tokenised[split, spec.tgt],
                       spec.path(source_dir, split, spec.src), spec.path(source_dir, split, spec.tgt))
    say(f"learning {num_merges} BPE merges")
    codes = learn_codes([tokenised[spec.train, spec.src], tokenised[spec.train, spec.tgt]], num_merges,
                        out_dir)
    bpe = BPE(codes)
    for (split, lang), lines in tokenised.items():
        write_lines(out_dir / f"{split}.tok.{lang}", lines)
        write_lines(out_dir / f"{split}.raw.{lang}", raw[split, lang])
        say(f"applying BPE to {split}.{lang}")
        encoded = bpe.batch(lines)
        write_lines(out_dir / f"{split}.bpe.{lang}", encoded)
        if split == spec.train:
            build_vocab(encoded).save(out_dir / f"vocab.{lang}.json")
    atomic_write_json(out_dir / "prepared.json", {
        "dataset": spec.name, "src": spec.src, "tgt": spec.tgt, "num_merges": num_merges,
        "codes": codes.name, "splits": [s for s in splits if s not in missing], "missing_splits": missing,
        "source_dir": str(source_dir),
    })
    return out_dir


def build_vocab(lines: Sequence[str], min_count: int = 1) -> Vocabulary:
    counts: Dict[str, int] = {}
    for line in lines:
        for token in line.split():
            counts[token] = counts.get(token, 0) + 1
    return Vocabulary.from_counts(counts, min_count=min_count)


@dataclass
class Prepared:
    """A prepared directory: its manifest and vocabularies."""

    dir: Path
    manifest: dict
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary

    @classmethod
    def open(cls, directory: Path) -> "Prepared":
        directory = Path(directory)
        manifest_path = directory / "prepared.json"
        if not manifest_path.is_file():
            raise DataError(f"{manifest_path} is missing: {directory} is not a prepared corpus; run "
                            "`python -m mt.prepare <dataset> --out <dir>` (or mt.train prepares it on first use)")
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        return cls(directory, manifest, Vocabulary.load(directory / f"vocab.{manifest['src']}.json"),
                   Vocabulary.load(directory / f"vocab.{manifest['tgt']}.json"))

    @property
    def bpe(self) -> BPE:
        return BPE(self.dir / self.manifest["codes"])

    def split_path(self, split: str, kind: str, lang: str) -> Path:
        """``kind`` is ``tok`` (BLEU references), ``raw`` (SacreBLEU references) or ``bpe`` (model text)."""
        path = self.dir / f"{split}.{kind}.{lang}"
        if not path.is_file():
            have = ", ".join(self.manifest.get("splits", []))
            raise DataError(f"{path} is missing: split {split!r} is not in {self.dir} (it has: {have}); "
                            "pick another split or re-run mt.prepare with its source files present")
        return path

    def lines(self, split: str, kind: str, side: str) -> List[str]:
        return read_lines(self.split_path(split, kind, self.manifest[side]))


def ensure_prepared(dataset: str, data_root: Path, prepared_dir: Optional[Path] = None,
                    num_merges: Optional[int] = None, progress=None) -> Prepared:
    """Open the prepared corpus, preparing it first when it does not exist yet."""
    spec = corpus(dataset)
    directory = Path(prepared_dir) if prepared_dir else default_prepared_dir(dataset, num_merges)
    if not (directory / "prepared.json").is_file():
        prepare_corpus(spec, spec.source_dir(data_root), directory, num_merges, progress=progress)
    prepared = Prepared.open(directory)
    if prepared.manifest["dataset"] != dataset or (num_merges and prepared.manifest["num_merges"] != num_merges):
        raise DataError(f"{directory} holds {prepared.manifest['dataset']} with {prepared.manifest['num_merges']} "
                        f"BPE merges, not {dataset} with {num_merges}; choose another prepared_dir")
    return prepared


@dataclass
class ParallelData:
    """Id tensors of a split: ``src[i]`` ends with ``eos``; ``tgt[i]`` is ``bos ... eos``."""

    src: List[torch.Tensor]
    tgt: List[torch.Tensor]

    def __len__(self) -> int:
        return len(self.src)

    @property
    def src_lengths(self) -> List[int]:
        return [len(s) for s in self.src]

    @property
    def tgt_lengths(self) -> List[int]:
        return [len(t) for t in self.tgt]

    @classmethod
    def encode(cls, src_lines: Sequence[str], tgt_lines: Sequence[str], src_vocab: Vocabulary,
               tgt_vocab: Vocabulary, max_len: Optional[int] = None) -> "ParallelData":
        """Encode BPE lines; with ``max_len``, pairs with a longer side (in BPE units) are dropped."""
        import torch  # here, so that preparing a corpus (mt.prepare) needs no torch

        src, tgt = [], []
        for s, t in zip(src_lines, tgt_lines):
            s_tok, t_tok = s.split(), t.split()
            if max_len is not None and (len(s_tok) > max_len or len(t_tok) > max_len):
                continue
            src.append(torch.tensor(src_vocab.encode(s_tok, add_eos=True), dtype=torch.long))
            tgt.append(torch.tensor(tgt_vocab.encode(t_tok, add_bos=True, add_eos=True), dtype=torch.long))
        return cls(src, tgt)


def load_split(prepared: Prepared, split: str, max_len: Optional[int] = None) -> ParallelData:
    """The pairs of ``split`` (see :meth:`ParallelData.encode`); DataError when there are none, or none within
    ``max_len``."""
    src = prepared.lines(split, "bpe", "src")
    path = prepared.split_path(split, "bpe", prepared.manifest["src"])
    if not any(line.strip() for line in src):
        raise DataError(f"{path}: no sentence pairs: {blank_content(path)}; delete {prepared.dir} to have the "
                        f"corpus prepared again")
    data = ParallelData.encode(src, prepared.lines(split, "bpe", "tgt"), prepared.src_vocab, prepared.tgt_vocab,
                               max_len)
    if not len(data):
        raise DataError(f"{path}: all {len(src)} sentence pairs of split {split!r} have a side longer than "
                        f"data.max_len={max_len} BPE units; raise data.max_len (null keeps every pair)")
    return data
