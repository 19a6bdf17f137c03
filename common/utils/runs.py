"""A training run's directory over several seeds: its config (checked on resumption), the seeds finished
before, and the mean +- std that results files report."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

from .config import check_resumable
from .io import atomic_write_json


def open_run_dir(out_dir: Path, config: Dict[str, Any], resumable: Iterable[str]) -> Path:
    """Create ``out_dir`` and write ``config.json``; a directory holding a run with another config (beyond the
    ``resumable`` keys) is refused with the keys named (:func:`~common.utils.config.check_resumable`)."""
    path = Path(out_dir) / "config.json"
    if path.exists():
        check_resumable(json.loads(path.read_text(encoding="utf-8")), config, resumable, out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, config)
    return Path(out_dir)


def finished_seed(out_dir: Path, seed: int) -> Optional[dict]:
    """The record ``<out_dir>/seed<seed>.json`` of a seed finished before, else None."""
    path = Path(out_dir) / f"seed{seed}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def mean_std(values: Iterable[Optional[float]]) -> dict:
    """Mean, sample standard deviation (ddof=1; 0 for one value) and n of the values that are neither None
    nor NaN (NaN mean for none)."""
    kept = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not kept:
        return {"mean": float("nan"), "std": 0.0, "n": 0}
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((v - mean) ** 2 for v in kept) / (len(kept) - 1)) if len(kept) > 1 else 0.0
    return {"mean": mean, "std": std, "n": len(kept)}
