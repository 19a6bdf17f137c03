"""What the data readers share about their input files: the words for an input with nothing in it, and a JSON
file read with one-line errors that name the file and the fix.

    if not examples:
        raise GlueFormatError(f"{path}: no examples: {blank_content(path, header=True)}; {fix}")
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Optional, Type, Union


def blank_content(path: Union[str, Path], header: bool = False) -> Optional[str]:
    """Why ``path`` (gzip when it ends in ``.gz``) holds nothing to read, when it holds no more than blank lines
    (after a header line, if ``header``): "the file is empty", "the file holds only blank lines" or "the file holds
    only its header line"; None when it holds more."""
    opener = gzip.open if Path(path).suffix == ".gz" else open
    lines = text_lines = 0
    with opener(path, "rb") as handle:
        for line in handle:
            lines += 1
            text_lines += bool(line.strip())
            if text_lines > int(header):
                return None
    if not lines:
        return "the file is empty"
    return "the file holds only its header line" if text_lines else "the file holds only blank lines"


def read_json(path: Union[str, Path], what: str, holds: str, fix: str, error: Type[Exception] = ValueError,
              missing: Optional[Type[Exception]] = None) -> Any:
    """The parsed JSON of ``path``, a ``what`` file (e.g. "answer vocabulary") that holds ``holds`` ("answers").
    A missing file raises ``missing`` (default ``error``): "<what> file <path> does not exist; <fix>"; a blank one
    and one that is not JSON raise ``error``: "<path>: no <holds>: the file is empty; <fix>", "<path> is not valid
    JSON (<where>); <fix>"."""
    path = Path(path)
    if not path.is_file():
        raise (missing or error)(f"{what} file {path} does not exist; {fix}")
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise error(f"{path}: no {holds}: {blank_content(path)}; {fix}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{path} is not valid JSON ({err}); {fix}") from None
