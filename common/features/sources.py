"""The inputs of a conversion: clean errors for a missing, empty or wrong-kind path, and the
record a store keeps of them (``/sources``: path, format, bytes and, for a directory, files).

Checking every input before the output is opened means a bad path creates no output.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, List, Sequence, Union

from .errors import RegionFeatureError

PathLike = Union[str, os.PathLike]
Source = dict


def input_file(path: PathLike, format: str, what: str) -> Source:
    """The record of one input file, after checking that it exists, is a file and is not empty."""
    path = Path(path)
    if path.is_dir():
        raise RegionFeatureError(f"{path}: is a directory, expected {what}; to convert the files in it, pass them "
                                 f"(e.g. {path}/*.tsv)")
    if not path.exists():
        raise RegionFeatureError(f"{path}: no such file ({what}); check the path")
    if not path.is_file():
        raise RegionFeatureError(f"{path}: not a regular file, expected {what}")
    size = path.stat().st_size
    if size == 0:
        raise RegionFeatureError(f"{path}: the file is empty (0 bytes), expected {what}; the download or copy "
                                 f"failed: fetch it again")
    return {"path": os.path.abspath(path), "format": format, "bytes": size}


def input_directory(path: PathLike, what: str) -> Path:
    """``path``, after checking that it is a directory."""
    path = Path(path)
    if not path.exists():
        raise RegionFeatureError(f"{path}: no such directory of {what}; check the path")
    if not path.is_dir():
        raise RegionFeatureError(f"{path}: a file, expected a directory of {what}")
    return path


def directory_record(path: PathLike, format: str, files: Sequence[Path]) -> Source:
    """The record of a directory input: how many of its files are read, and their total size."""
    return {"path": os.path.abspath(path), "format": format, "files": len(files),
            "bytes": sum(file.stat().st_size for file in files)}


def check_distinct(sources: Sequence[Source]) -> None:
    """An input given twice would be read twice: an error naming it."""
    seen = set()
    for source in sources:
        if source["path"] in seen:
            raise RegionFeatureError(f"{source['path']}: given twice as an input; pass each input once")
        seen.add(source["path"])


def merge(recorded: Iterable[Source], new: Iterable[Source]) -> List[Source]:
    """``recorded`` with ``new`` added; a new record replaces the recorded one of the same path."""
    new = list(new)
    paths = {source["path"] for source in new}
    return [source for source in recorded if source["path"] not in paths] + new


def unrecorded(recorded: Iterable[Source], sources: Iterable[Source]) -> List[Source]:
    """The ``sources`` that ``recorded`` lacks, or records with another size or file count."""
    recorded = list(recorded)
    return [source for source in sources if source not in recorded]


def dumps(sources: Sequence[Source]) -> str:
    return json.dumps(list(sources), sort_keys=True)


def loads(text: str, where: str) -> List[Source]:
    try:
        sources = json.loads(text)
    except json.JSONDecodeError as err:
        raise RegionFeatureError(f"{where}: dataset 'sources' is not JSON ({err}); the file is corrupt") from None
    if not isinstance(sources, list) or not all(isinstance(s, dict) and "path" in s for s in sources):
        raise RegionFeatureError(f"{where}: dataset 'sources' is not a list of {{path, format, bytes}} records; "
                                 f"the file is corrupt")
    return sources


def describe(sources: Sequence[Source]) -> str:
    """``a.tsv (1,234 bytes), mcan/val2014 (3 files, 9,876 bytes)`` for messages."""
    if not sources:
        return "no recorded inputs"
    parts = []
    for source in sources:
        files = f"{source['files']:,} files, " if "files" in source else ""
        parts.append(f"{source['path']} ({files}{source.get('bytes', 0):,} bytes)")
    return ", ".join(parts)
