"""The inputs of a conversion: clean errors for a missing, empty or wrong-kind path, the record a
store keeps of them (``/sources``: path, format, bytes and, for a directory, files), and one
sequential read of a text input (``open_text``).

Checking every input before the output is opened means a bad path creates no output. A text
input may be a regular file, a member of a ``.zip`` file, or a stream: a FIFO, a pipe or a
process substitution (``<(zcat a.tsv.gz)``), or ``-`` for stdin. A stream is read once, from
its start; its record has ``"stream": true`` and no size (it is known by its path only).
Gzip-compressed input (``.tsv.gz``, or gzip bytes on a stream) is decompressed while read.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import sys
import zipfile
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, TextIO, Union

from .errors import RegionFeatureError

PathLike = Union[str, os.PathLike]
Source = dict
STDIN = "-"
#: The path a store records for stdin (``-``).
STDIN_PATH = "<stdin>"
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"


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


def text_input(path: PathLike, format: str, what: str, member: Optional[str] = None) -> Source:
    """The record of one text input: a file (``member``: the one to read if it is a zip file), or
    a stream (a FIFO, a pipe, ``-`` for stdin), which is not opened here."""
    if str(path) == STDIN:
        return {"path": STDIN_PATH, "format": format, "stream": True}
    if Path(path).is_fifo():  # a named pipe, or a process substitution's /dev/fd/N
        return {"path": os.path.abspath(path), "format": format, "stream": True}
    record = input_file(path, format, what)
    with open(path, "rb") as handle:
        if handle.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
            return record
    return {**record, "member": zip_member(Path(path), member)}


def zip_member(path: Path, member: Optional[str]) -> str:
    """The member of the zip file ``path`` to read: ``member``, or its only file."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [info.filename for info in archive.infolist() if not info.is_dir()]
    except (zipfile.BadZipFile, OSError) as err:
        raise RegionFeatureError(f"{path}: cannot read the zip file ({err}); it is truncated or corrupt: fetch it "
                                 f"again") from None
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    if member is None and len(names) != 1:
        raise RegionFeatureError(f"{path}: a zip file with {len(names)} files ({shown}); choose the one to read "
                                 f"with --member NAME")
    if member is not None and member not in names:
        raise RegionFeatureError(f"{path}: no member {member!r} in this zip file (it holds {shown}); check --member")
    return member if member is not None else names[0]


def label(source: Source) -> str:
    """How messages and origins name an input: its path, ``path:member`` for a zip member."""
    return f"{source['path']}:{source['member']}" if "member" in source else source["path"]


class _Prefixed(io.RawIOBase):
    """``head`` (bytes already read from ``rest``), then the rest of ``rest``."""

    def __init__(self, head: bytes, rest):
        super().__init__()
        self._head, self._rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._head:
            count = min(len(buffer), len(self._head))
            buffer[:count], self._head = self._head[:count], self._head[count:]
            return count
        data = self._rest.read1(len(buffer))
        buffer[:len(data)] = data
        return len(data)


@contextlib.contextmanager
def open_text(source: Source) -> Iterator[TextIO]:
    """The input of ``source`` as UTF-8 text, read once from its start (gzip decompressed)."""
    with contextlib.ExitStack() as stack:
        if source["path"] == STDIN_PATH:
            raw = sys.stdin.buffer
        elif "member" in source:
            archive = stack.enter_context(zipfile.ZipFile(source["path"]))
            raw = stack.enter_context(archive.open(source["member"]))
        else:
            raw = stack.enter_context(open(source["path"], "rb"))
        head = raw.read(len(ZIP_MAGIC))  # blocks until 4 bytes (or the end) arrive, also on a pipe
        binary = io.BufferedReader(_Prefixed(head, raw))
        if head.startswith(GZIP_MAGIC):
            binary = gzip.GzipFile(fileobj=binary, mode="rb")
        elif head == ZIP_MAGIC:
            raise RegionFeatureError(f"{label(source)}: a zip file, which cannot be read from a stream (reading one "
                                     f"needs seeking); pass the .zip file itself, or stream one member with "
                                     f"<(unzip -p FILE.zip MEMBER)")
        yield stack.enter_context(io.TextIOWrapper(binary, encoding="utf-8", newline=""))


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
        if label(source) in seen:
            raise RegionFeatureError(f"{label(source)}: given twice as an input; pass each input once")
        seen.add(label(source))


def merge(recorded: Iterable[Source], new: Iterable[Source]) -> List[Source]:
    """``recorded`` with ``new`` added; a new record replaces the recorded one of the same path (and member)."""
    new = list(new)
    labels = {label(source) for source in new}
    return [source for source in recorded if label(source) not in labels] + new


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
    """``a.tsv (1,234 bytes), mcan/val2014 (3 files, 9,876 bytes), /dev/fd/63 (a stream)`` for messages."""
    if not sources:
        return "no recorded inputs"
    parts = []
    for source in sources:
        files = f"{source['files']:,} files, " if "files" in source else ""
        size = "a stream" if source.get("stream") else f"{files}{source.get('bytes', 0):,} bytes"
        parts.append(f"{label(source)} ({size})")
    return ", ".join(parts)
