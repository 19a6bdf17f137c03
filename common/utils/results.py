"""Results records that say what produced them: config, seed(s), library versions, git commit."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

import torch

DEFAULT_PACKAGES = ("attention-suite", "torch", "torch-geometric", "entmax", "numpy", "scipy", "omegaconf")


def git_commit(path: Optional[Path] = None) -> Optional[str]:
    """The commit checked out at ``path`` (default: this source tree), with ``-dirty`` when
    tracked files are modified; ``None`` outside a git checkout. ``$ATTN_SOURCE_COMMIT``, where set, is
    the answer instead: the commit that whoever copied the tree names (a lent GPU machine's copy carries a
    ``.git`` that need not be the tree's)."""
    if os.environ.get("ATTN_SOURCE_COMMIT"):
        return os.environ["ATTN_SOURCE_COMMIT"]
    cwd = Path(path) if path else Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def environment(packages: Iterable[str] = DEFAULT_PACKAGES) -> Dict[str, Any]:
    """Python, platform, torch threads/device and the installed version of each package."""
    versions = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "packages": versions,
        "git_commit": git_commit(),
    }


def results_record(config: Dict[str, Any], **results: Any) -> Dict[str, Any]:
    """A JSON-ready record: ``results`` plus the config, the environment and a UTC timestamp."""
    return {
        **results,
        "config": config,
        "environment": environment(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
