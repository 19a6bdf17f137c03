"""Where data and caches live: ``--data-root`` beats ``ATTN_DATA_ROOT`` beats the user cache."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

DATA_ROOT_ENV = "ATTN_DATA_ROOT"
CACHE_ENV = "ATTN_CACHE_DIR"


def cache_dir() -> Path:
    """A per-user writable cache: ``$ATTN_CACHE_DIR``, else ``$XDG_CACHE_HOME/attention-suite``,
    else ``~/.cache/attention-suite``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "attention-suite"


def default_data_root(explicit: Optional[str] = None) -> Path:
    """The data root: ``explicit`` if given, else ``$ATTN_DATA_ROOT``, else ``cache_dir()/data``."""
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get(DATA_ROOT_ENV):
        return Path(os.environ[DATA_ROOT_ENV]).expanduser()
    return cache_dir() / "data"
