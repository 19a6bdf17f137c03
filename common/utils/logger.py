"""Training curves: every scalar goes to a JSONL file and to TensorBoard.

    with MetricsLogger(run_dir) as log:
        log.log(step, loss=0.7, kl=0.01)      # runs/<...>/metrics.jsonl + TensorBoard events

``tensorboard --logdir runs`` shows the curves; ``metrics.jsonl`` (one JSON object per line,
``{"step": 3, "loss": 0.7, ...}``) is for scripts and plots. Lines are flushed as written,
so a killed run keeps everything logged so far. A run that resumes from a checkpoint passes its step
(``resume=``): what a killed attempt logged after it goes, from the file and from TensorBoard's view, so
that every step is recorded once; ``resume=0`` (a fresh start) drops every record of an earlier attempt.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Union

import torch

from .io import atomic_write_text


class MetricsLogger:
    """Append scalars to ``<run_dir>/metrics.jsonl`` and, unless disabled, TensorBoard."""

    def __init__(self, run_dir: Union[str, Path], tensorboard: bool = True, enabled: bool = True,
                 resume: Optional[int] = None):
        """``resume``: None appends; a step keeps only the records up to it (0: none), see the module docstring."""
        self.run_dir = Path(run_dir)
        self.enabled = enabled  # False on non-main processes of a distributed run
        self.path = self.run_dir / "metrics.jsonl"
        self._file = None
        self._writer = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume is not None:
            self._drop_after(resume)
        self._file = open(self.path, "a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:  # pragma: no cover - depends on the environment
                raise ImportError(
                    "TensorBoard logging needs the `tensorboard` package: `pip install tensorboard`, "
                    "or pass tensorboard=False"
                ) from err
            # TensorBoard hides the events at steps from purge_step on that earlier files hold
            self._writer = SummaryWriter(str(self.run_dir), purge_step=None if resume is None else resume + 1)

    def _drop_after(self, step: int) -> None:
        """Keep the records up to ``step`` (none when it is 0); at a fresh start, also the old event files."""
        if step == 0:
            for events in self.run_dir.glob("events.out.tfevents.*"):
                events.unlink()
        if self.path.is_file():
            lines = [line for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
            kept = [line for line in lines if step and _step_of(line) <= step]
            if len(kept) < len(lines):
                atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def log(self, step: int, **scalars: Union[float, torch.Tensor]) -> None:
        """Record ``scalars`` at ``step``; tensors are converted with ``.item()``."""
        if not self.enabled:
            return
        values = {k: float(v.item() if isinstance(v, torch.Tensor) else v) for k, v in scalars.items()}
        record = {"step": int(step), **{k: (v if math.isfinite(v) else str(v)) for k, v in values.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._writer is not None:
            for name, value in values.items():
                self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _step_of(line: str) -> float:
    """A record's step; infinite for a line cut short (a process killed while writing it), so it is dropped."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return math.inf


def read_metrics(path: Union[str, Path], name: Optional[str] = None) -> list[dict]:
    """The records of a ``metrics.jsonl`` file (only those holding ``name`` if given)."""
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if name is None or name in r]
