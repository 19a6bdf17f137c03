"""What the data readers share about an input file with nothing in it: the words for their one-line errors.

    if not examples:
        raise GlueFormatError(f"{path}: no examples: {blank_content(path, header=True)}; {fix}")
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Optional, Union


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
