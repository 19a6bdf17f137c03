"""Readers for the GLUE TSV files, with the official files' quirks and one-line errors.

A split is ``<data_root>/glue/<TASK>/<split>.tsv.gz`` (the shared data, README section 7) or
``.tsv``; ``data_root`` may also be a ``glue_data`` directory (``<data_root>/<TASK>/``) or the
directory of one task's TSVs. It defaults to ``$ATTN_DATA_ROOT``. Files are read with the csv
module with quoting off (``csv.QUOTE_NONE``): RTE, MRPC, STS-B and WNLI text holds double quotes,
and default quoting merges rows. A UTF-8 BOM is stripped from the first line only (MRPC's
``\\ufeffQuality`` header). CoLA train/dev have no header; the last line may lack its newline.
"""
from __future__ import annotations

import csv
import gzip
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Union

from common.utils.inputs import blank_content

from .tasks import SCORE_RANGE, TaskSpec, get_task

_FIX_DOWNLOAD = ("get the official files with download_glue_data.py (glue_data/<TASK>/) or see section 7 of the "
                 "shared data README")
_FIX_QUOTING = "the file must be read with quoting off; was it edited?"


class GlueFormatError(ValueError):
    """A GLUE file that is missing or malformed; the message names the file, the line, the field and the fix."""


@dataclass
class GlueSplit:
    """One split of a task: texts, label ids (STS-B: float scores; test: None) and 1-based file lines."""
    task: str
    split: str
    path: Path
    text_a: List[str]
    text_b: Optional[List[str]]
    labels: Optional[Union[List[int], List[float]]]
    line_numbers: List[int]

    def __len__(self) -> int:
        return len(self.text_a)


def split_path(task, split: str, data_root: Optional[Union[str, Path]] = None) -> Path:
    """The file of ``split`` of ``task`` (``.tsv.gz`` preferred over ``.tsv``); GlueFormatError if none exists."""
    spec = get_task(task)
    spec.layout(split)  # validates the split name
    if data_root is None:
        data_root = os.environ.get("ATTN_DATA_ROOT")
        if not data_root:
            raise GlueFormatError(f"no GLUE data directory: pass data_root (--data-root) or set ATTN_DATA_ROOT to the "
                                  f"shared data directory (which holds glue/{spec.directory}/)")
    root = Path(data_root)
    candidates = [d / f"{split}{ext}" for d in (root / "glue" / spec.directory, root / spec.directory, root)
                  for ext in (".tsv.gz", ".tsv")]
    for path in candidates:
        if path.is_file():
            return path
    raise GlueFormatError(f"{candidates[0]}: missing (also looked for {', '.join(str(p) for p in candidates[1:])}); "
                          f"{_FIX_DOWNLOAD}")


def _lines(path: Path) -> Iterator[str]:
    """The decoded lines of ``path`` (gzip if it ends in ``.gz``), a BOM stripped from line 1 only."""
    gz = path.suffix == ".gz"
    number = 0
    try:
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as handle:
            for number, raw in enumerate(handle, 1):
                try:
                    yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as err:
                    raise GlueFormatError(f"{path}:{number}: bytes {raw[err.start:err.end]!r} at column {err.start + 1}"
                                          f" are not UTF-8; re-encode the file as UTF-8 or re-download it") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise GlueFormatError(f"{path}:{number + 1}: not a complete gzip file ({err}); re-download it, or drop the .gz "
                              f"suffix if it is plain text") from None


def _field(path: Path, line: int, row: List[str], column: int, name: str) -> str:
    value = row[column]
    if not value.strip():
        raise GlueFormatError(f"{path}:{line}: {name} (column {column + 1}) is empty; every example needs its text; "
                              f"fix or delete the row")
    return value


def _label(spec: TaskSpec, path: Path, line: int, value: str) -> Union[int, float]:
    column = f"label (column {spec.labelled.label + 1})"
    if spec.regression:
        low, high = SCORE_RANGE
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not (math.isfinite(score) and low <= score <= high):
            raise GlueFormatError(f"{path}:{line}: {column} {value!r} is not a similarity score, a float in "
                                  f"[{low:g}, {high:g}]; fix the row")
        return score
    if value not in spec.labels:
        raise GlueFormatError(f"{path}:{line}: {column} {value!r} is not a {spec.name} label "
                              f"({', '.join(spec.labels)}); fix the row or check the task")
    return spec.labels.index(value)


def _no_examples(spec: TaskSpec, split: str, path: Path, reason: str) -> GlueFormatError:
    return GlueFormatError(f"{path}: no {spec.name} {split} examples: {reason}; {_FIX_DOWNLOAD}")


def read_split(task, split: str, data_root: Optional[Union[str, Path]] = None) -> GlueSplit:
    """Read ``split`` (train, dev or test) of ``task``; see the module docstring for where files are looked for."""
    spec = get_task(task)
    layout = spec.layout(split)
    path = split_path(spec, split, data_root)
    text_a: List[str] = []
    text_b: List[str] = []
    labels: list = []
    numbers: List[int] = []
    reader = csv.reader(_lines(path), delimiter="\t", quoting=csv.QUOTE_NONE)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            raise GlueFormatError(f"{path}:{reader.line_num}: row: {err}; {_FIX_QUOTING}") from None
        line = reader.line_num
        if len(row) != layout.columns:
            blank = not row and not numbers and blank_content(path, layout.header)  # nothing but blank lines?
            if blank:
                raise _no_examples(spec, split, path, blank)
            what = "a blank line" if not row else f"{len(row)}"
            raise GlueFormatError(f"{path}:{line}: row: expected {layout.columns} tab-separated columns for "
                                  f"{spec.name} {split}, got {what}; {_FIX_QUOTING}")
        if layout.header and line == 1:
            continue
        text_a.append(_field(path, line, row, layout.text_a, "text_a"))
        if layout.text_b is not None:
            text_b.append(_field(path, line, row, layout.text_b, "text_b"))
        if layout.label is not None:
            labels.append(_label(spec, path, line, row[layout.label]))
        numbers.append(line)
    if not numbers:
        raise _no_examples(spec, split, path, blank_content(path, layout.header))
    return GlueSplit(spec.name, split, path, text_a, text_b if layout.text_b is not None else None,
                     labels if layout.label is not None else None, numbers)
