"""Where data and caches live: ``--data-root`` beats ``ATTN_DATA_ROOT`` beats the user cache."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

DATA_ROOT_ENV = "ATTN_DATA_ROOT"
CACHE_ENV = "ATTN_CACHE_DIR"


def cache_dir() -> Path:
    """A per-user writable cache: ``$ATTN_CACHE_DIR``, else ``$XDG_CACHE_HOME/attention-suite``,
    else ``~/.cache/attention-suite``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "attention-suite"


class DataRootError(ValueError):
    """A data root given by ``--data-root`` or ``$ATTN_DATA_ROOT`` that is not a directory."""


def default_data_root(explicit: Optional[str] = None) -> Path:
    """The data root: ``explicit`` if given, else ``$ATTN_DATA_ROOT``, else ``cache_dir()/data``.

    A root the user named must exist: a mistyped path is an error, never a directory created
    (and downloaded into) as a side effect. Only the default cache directory is created on demand.
    """
    if explicit:
        root, source = Path(explicit).expanduser(), f"--data-root {explicit}"
    elif os.environ.get(DATA_ROOT_ENV):
        root, source = Path(os.environ[DATA_ROOT_ENV]).expanduser(), f"${DATA_ROOT_ENV}={os.environ[DATA_ROOT_ENV]}"
    else:
        return cache_dir() / "data"
    if not root.is_dir():
        raise DataRootError(f"{source}: {'not a directory' if root.exists() else 'no such directory'} "
                            "(nothing was created); point it at the directory holding planetoid/, mt/, coco/ or "
                            "vqa/, or create it first for downloads to go there")
    return root


class MissingInputsError(ValueError):
    """Files a run needs that do not exist; the message names each one, its config key and the fix."""


def check_inputs(inputs: Iterable[Tuple[str, Optional[Path], str]]) -> None:
    """Raise :class:`MissingInputsError` naming every ``(key, path, fix)`` whose ``path`` does not exist,
    in one line (``<path> (<key>) does not exist: <fix>``, inputs with the same fix together), so that
    a user fetches everything at once. An input whose path is None is not needed."""
    missing: Dict[str, List[str]] = {}
    for key, path, fix in inputs:
        if path is not None and not Path(path).exists():
            missing.setdefault(fix, []).append(f"{path} ({key})")
    if missing:
        raise MissingInputsError("; ".join(
            f"{names[0]} does not exist: {fix}" if len(names) == 1 else f"{', '.join(names)} do not exist: {fix}"
            for fix, names in missing.items()))
