"""Prepare a corpus: tokenise, lowercase, learn and apply BPE, build vocabularies.

    python -m mt.prepare multi30k [--data-root DIR] [--out DIR] [--merges 8000]
    python -m mt.prepare iwslt14  [--data-root DIR] [--out DIR] [--offline]

``multi30k`` reads ``<data-root>/mt/multi30k/raw/*.gz``. ``iwslt14`` follows fairseq's
``examples/translation/prepare-iwslt14.sh``: when ``<data-root>/mt/iwslt14_de_en`` already
holds its output (``{train,valid,test}.{de,en}``) that is used; otherwise the TED release
``de-en.tgz`` is read from there (or downloaded from fairseq's mirror unless ``--offline``)
and processed as the script does: drop the ``<url>``/``<talkid>``/``<keywords>`` lines and
the title/description tags, Moses-tokenise, keep pairs of 1-175 tokens with a length ratio
<= 1.5 (``clean-corpus-n.perl``), lowercase, take every 23rd training pair as ``valid``,
and concatenate dev2010, TEDX dev2012 and tst2010-2012 as ``test``. Outputs go to
``--out`` (default ``<cache>/mt/<dataset>-bpe<merges>``), never into the data root.
"""
from __future__ import annotations

import argparse
import re
import sys
import tarfile
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from common.utils import console, default_data_root
from common.utils.extras import needs_extra
from common.utils.paths import DATA_ROOT_ENV

from .data import CORPORA, DataError, corpus, default_prepared_dir, prepare_corpus
from .text import MosesPreprocessor, write_lines

IWSLT14_URL = "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
IWSLT14_TEST = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
                "IWSLT14.TED.tst2012")
_DROP = ("<url>", "<talkid>", "<keywords>")
_TAGS = re.compile(r"</?(title|description)>")
_SEG = re.compile(r'^\s*<seg id="?\d+"?>\s*(.*?)\s*</seg>\s*$')


def clean_pairs(src: List[str], tgt: List[str], min_len: int = 1, max_len: int = 175,
                ratio: float = 1.5) -> tuple[List[str], List[str]]:
    """``clean-corpus-n.perl -ratio 1.5 ... 1 175``: keep pairs with token counts in range and ratio <= 1.5."""
    kept_src, kept_tgt = [], []
    for s, t in zip(src, tgt):
        s, t = " ".join(s.split()), " ".join(t.split())
        ns, nt = len(s.split()), len(t.split())
        if not (min_len <= ns <= max_len and min_len <= nt <= max_len):
            continue
        if ns / nt > ratio or nt / ns > ratio:
            continue
        kept_src.append(s)
        kept_tgt.append(t)
    return kept_src, kept_tgt


def _train_lines(text: str) -> List[str]:
    lines = [line for line in text.splitlines() if not any(tag in line for tag in _DROP)]
    return [_TAGS.sub("", line) for line in lines]


def _segments(text: str) -> List[str]:
    return [m.group(1).replace("\u2019", "'") for m in map(_SEG.match, text.splitlines()) if m]


def _release_member(files: Dict[str, str], name: str, release: Path) -> str:
    for path, text in files.items():
        if path.endswith(name):
            return text
    raise DataError(f"{release} has no {name}: it is not fairseq's IWSLT'14 de-en release ({IWSLT14_URL})")


def read_release(release: Path) -> Dict[str, str]:
    """``{member path: text}`` of the release (a ``.tgz`` or its extracted ``de-en/`` directory)."""
    release = Path(release)
    if release.is_dir():
        return {str(p): p.read_text(encoding="utf-8") for p in release.rglob("*") if p.is_file()}
    with tarfile.open(release) as tar:
        return {m.name: tar.extractfile(m).read().decode("utf-8") for m in tar.getmembers() if m.isfile()}


def iwslt14_from_release(release: Path, out: Path, src: str = "de", tgt: str = "en") -> Path:
    """Run fairseq's preprocessing on the TED release; writes ``{train,valid,test}.{src,tgt}`` under ``out``."""
    files = read_release(release)
    pair = f"{src}-{tgt}"
    tok = {lang: MosesPreprocessor(lang, lowercase=False) for lang in (src, tgt)}
    train = {lang: tok[lang].batch(_train_lines(_release_member(files, f"train.tags.{pair}.{lang}", release)))
             for lang in (src, tgt)}
    if len(train[src]) != len(train[tgt]):
        raise DataError(f"{release}: train.tags.{pair}.{src} and .{tgt} have different line counts "
                        f"({len(train[src])} vs {len(train[tgt])})")
    pairs = len(train[src])
    train[src], train[tgt] = clean_pairs(train[src], train[tgt])
    if not train[src]:
        raise DataError(f"{release}: train.tags.{pair}.{src} and .{tgt} hold no pair of 1-175 tokens a side with a "
                        f"length ratio of at most 1.5 ({pairs} pairs before cleaning); it is not fairseq's IWSLT'14 "
                        f"release: download {IWSLT14_URL} again")
    for lang in (src, tgt):
        lowered = [line.lower() for line in train[lang]]
        write_lines(out / f"valid.{lang}", [x for i, x in enumerate(lowered, 1) if i % 23 == 0])
        write_lines(out / f"train.{lang}", [x for i, x in enumerate(lowered, 1) if i % 23 != 0])
        test = []
        for name in IWSLT14_TEST:
            segments = _segments(_release_member(files, f"{name}.{pair}.{lang}.xml", release))
            test.extend(tok[lang](line).lower() for line in segments)
        write_lines(out / f"test.{lang}", test)
    return out


def find_or_fetch_release(source_dir: Path, cache: Path, download: bool) -> Path:
    for candidate in (source_dir / "de-en.tgz", source_dir / "de-en", cache / "de-en.tgz"):
        if candidate.exists():
            return candidate
    if not download:
        raise DataError(f"{source_dir / 'train.de'} is missing and so is the TED release "
                        f"{source_dir / 'de-en.tgz'}: download {IWSLT14_URL} there (or run without --offline), "
                        "or place fairseq's prepare-iwslt14.sh output {train,valid,test}.{de,en} in "
                        f"{source_dir}")
    target = cache / "de-en.tgz"
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"downloading {IWSLT14_URL} -> {target}", file=sys.stderr)
    try:
        tmp = target.with_name(".tmp.de-en.tgz")
        urllib.request.urlretrieve(IWSLT14_URL, tmp)
        tmp.replace(target)
    except OSError as err:
        raise DataError(f"could not download {IWSLT14_URL} ({err}); fetch it by hand into {source_dir}") from None
    return target


def prepare(dataset: str, data_root: Path, out: Optional[Path] = None, num_merges: Optional[int] = None,
            download: bool = True) -> Path:
    """Prepare ``dataset`` into ``out``; returns ``out``."""
    spec = corpus(dataset)
    out = Path(out) if out else default_prepared_dir(dataset, num_merges)
    source_dir = spec.source_dir(data_root)
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    if dataset == "iwslt14" and not spec.path(source_dir, spec.train, spec.src).is_file():
        release = find_or_fetch_release(source_dir, out, download)
        say(f"running fairseq's IWSLT'14 preprocessing on {release}")
        source_dir = iwslt14_from_release(release, out / "fairseq")
    return prepare_corpus(spec, source_dir, out, num_merges, progress=say)


@needs_extra("mt")
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mt.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", choices=sorted(CORPORA))
    parser.add_argument("--data-root", default=None, help=f"data root (default: ${DATA_ROOT_ENV})")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: <cache>/mt/<dataset>-bpe<merges>)")
    parser.add_argument("--merges", type=int, default=None, help="joint BPE merges (default: the dataset's)")
    parser.add_argument("--offline", action="store_true", help="never download")
    args = parser.parse_args(argv)
    try:
        out = prepare(args.dataset, default_data_root(args.data_root), args.out, args.merges,
                      download=not args.offline)
    except (DataError, FileNotFoundError, ValueError) as err:
        return console.fail(err)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
