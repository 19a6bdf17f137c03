"""A training run's directory over several seeds: its config (checked on resumption), the seeds finished
before, the mean +- std that results files report, and what an evaluate CLI says of the seeds it scores
(:class:`ScoredSeed`: which checkpoint, and whether the seed's training finished)."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

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


@dataclasses.dataclass(frozen=True)
class ScoredSeed:
    """A seed that an evaluate CLI scores: the checkpoint it reads (a tuple: their average) and whether the seed's
    training finished, i.e. wrote its record (``seed<k>.json``; ``results.json`` for a one-seed run)."""

    seed: int
    checkpoint: Union[Path, Tuple[Path, ...]]
    finished: bool

    @classmethod
    def of(cls, seed: int, checkpoint: Union[Path, Tuple[Path, ...]], record: Path) -> "ScoredSeed":
        """The seed, finished where its training's ``record`` file exists."""
        return cls(seed, checkpoint, Path(record).is_file())

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "ScoredSeed":
        """The seed whose :meth:`record` an evaluation JSON holds."""
        checkpoint = record["checkpoint"]
        paths = tuple(map(Path, checkpoint)) if isinstance(checkpoint, list) else Path(checkpoint)
        return cls(record["seed"], paths, record["finished"])

    def record(self) -> Dict[str, Any]:
        """Its keys in an evaluation JSON: ``seed``, ``checkpoint`` (a path, or the paths averaged), ``finished``."""
        averaged = isinstance(self.checkpoint, tuple)
        checkpoint = [str(path) for path in self.checkpoint] if averaged else str(self.checkpoint)
        return {"seed": self.seed, "checkpoint": checkpoint, "finished": self.finished}

    def line(self) -> str:
        """``seed 3: checkpoint <path>``, with ``(training unfinished: ...)`` where its training has not finished."""
        averaged = isinstance(self.checkpoint, tuple)
        shown = f"the average of {', '.join(map(str, self.checkpoint))}" if averaged else str(self.checkpoint)
        return f"seed {self.seed}: checkpoint {shown}" + ("" if self.finished else
                                                          " (training unfinished: the weights saved so far)")


def planned_seeds(config: Mapping[str, Any]) -> List[int]:
    """The seeds a run's config trains: ``seeds`` of them from ``first_seed``, or its one ``seed``."""
    if "seeds" in config:
        first = config.get("first_seed", 0)
        return list(range(first, first + config["seeds"]))
    return [config["seed"]]


def _unfinished(scored: Sequence[ScoredSeed], planned: Iterable[int]) -> Tuple[List[int], List[int]]:
    """The seeds scored before their training finished, and the ``planned`` ones not scored (no checkpoint)."""
    return [s.seed for s in scored if not s.finished], sorted(set(planned) - {s.seed for s in scored})


def unfinished_seeds(scored: Sequence[ScoredSeed], planned: Iterable[int] = ()) -> List[int]:
    """The seeds whose training has not finished: those scored before it did, and ``planned`` ones not scored."""
    partial, missing = _unfinished(scored, planned)
    return sorted(partial + missing)


def unfinished_note(scored: Sequence[ScoredSeed], planned: Iterable[int], train_cli: str) -> Optional[str]:
    """One line naming the unfinished seeds and how to finish them (None when every seed finished), e.g.
    ``unfinished: seed 0 scored at the weights saved so far; seeds 1, 2 not scored (no checkpoint); ...``."""
    partial, missing = _unfinished(scored, planned)
    parts = ([f"{_seeds(partial)} scored at the weights saved so far"] if partial else []) \
        + ([f"{_seeds(missing)} not scored (no checkpoint)"] if missing else [])
    if not parts:
        return None
    return f"unfinished: {'; '.join(parts)}; re-run the run's {train_cli} command to finish its training"


def print_unfinished(scored: Sequence[ScoredSeed], planned: Iterable[int], train_cli: str) -> None:
    """Print :func:`unfinished_note` (on stdout, beside the scores) where a seed is unfinished."""
    note = unfinished_note(scored, planned, train_cli)
    if note:
        print(note)


def _seeds(seeds: Sequence[int]) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
