"""Atomic file writes: write a temporary file in the target directory, then ``os.replace``.

A reader (or a resumed run) never sees a half-written checkpoint or results file, even if
the writer is killed midway. Files get the mode of any new file under the umask (0644 under
umask 022), not ``mkstemp``'s 0600.
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Callable, Tuple, Union

PathLike = Union[str, os.PathLike]


def _temporary(path: Path) -> Tuple[int, str]:
    """A new hidden file beside ``path``, opened for writing with mode 0666 less the umask."""
    while True:
        tmp = str(path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp"))
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:  # a name drawn twice: draw another
            continue


def _atomic(path: PathLike, write: Callable[[Any], None], mode: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temporary(path)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return _atomic(path, lambda f: f.write(text.encode("utf-8")), "wb")


def atomic_write_json(path: PathLike, obj: Any, indent: int = 2) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (keys sorted, trailing newline)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=True) + "\n")


def atomic_save(obj: Any, path: PathLike) -> Path:
    """``torch.save(obj, path)``, atomically."""
    import torch  # here, so that the JSON and text writers import no torch

    return _atomic(path, lambda f: torch.save(obj, f), "wb")


def atomic_save_figure(fig: Any, path: PathLike, dpi: int = 110) -> Path:
    """Save a matplotlib ``fig`` as a PNG at ``path`` atomically and close it."""
    try:
        return _atomic(path, lambda f: fig.savefig(f, dpi=dpi, format="png"), "wb")
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
