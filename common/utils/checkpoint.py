"""Atomic training checkpoints that a run resumes from exactly.

A checkpoint holds the model, the optimiser (and scheduler), the step, any extra state the
loop needs, and every random number generator's state, so that an interrupted run that
resumes follows the same trajectory as one that never stopped::

    ckpt = Checkpointer(run_dir, keep=3)
    state = ckpt.load_latest(model, optimizer, scheduler)   # None on a fresh run
    start = 0 if state is None else state["step"] + 1
    for step in range(start, total):
        ...
        ckpt.save(step, model, optimizer, scheduler, extra={"best": best})

Files are ``<run_dir>/checkpoints/step_<N>.pt``, each written atomically (temp file +
``os.replace``); only the newest ``keep`` are kept.

Checkpoints are portable between devices: one written on a GPU resumes on a CPU and the other
way round (``load_latest(..., map_location=device)``; the optimiser state follows its
parameters, the generator states are restored on the CPU, and the CUDA generators only where
there are GPUs). An fp16 run's gradient scaler is saved and restored with ``scaler=``.
"""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch
from torch import nn

from .io import atomic_save

_NAME = re.compile(r"step_(\d+)\.pt$")


def rng_state() -> Dict[str, Any]:
    """The state of Python's, NumPy's and torch's generators (CUDA included when present)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore :func:`rng_state`, wherever its tensors were mapped on loading. CUDA generators are
    restored for the GPUs both machines have; a checkpoint from a CPU-only machine leaves them."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state.cpu(), index)


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)  # DistributedDataParallel keeps the model in .module


class Checkpointer:
    """Save and resume training state under ``<run_dir>/checkpoints``."""

    def __init__(self, run_dir: Union[str, Path], keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.dir = Path(run_dir) / "checkpoints"
        self.keep = keep

    def paths(self) -> list[Path]:
        """Existing checkpoints, oldest first."""
        if not self.dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.dir.iterdir() if (m := _NAME.search(p.name))]
        return [p for _, p in sorted(found)]

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: Optional[torch.optim.Optimizer] = None,
        scheduler: Optional[Any] = None,
        extra: Optional[Dict[str, Any]] = None,
        scaler: Optional[torch.amp.GradScaler] = None,
        prune: bool = True,
    ) -> Path:
        """Write ``step_<step>.pt`` atomically; then, unless ``prune`` is False, :meth:`prune`."""
        state = {
            "step": int(step),
            "model": _unwrap(model).state_dict(),
            "optimizer": None if optimizer is None else optimizer.state_dict(),
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "extra": extra or {},
            "rng": rng_state(),
        }
        if scaler is not None and scaler.is_enabled():
            state["scaler"] = scaler.state_dict()
        path = atomic_save(state, self.dir / f"step_{step}.pt")
        if prune:
            self.prune()
        return path

    def prune(self) -> None:
        """Delete all but the newest ``keep`` checkpoints."""
        for old in self.paths()[: -self.keep]:
            old.unlink()

    def load_latest(
        self,
        model: nn.Module,
        optimizer: Optional[torch.optim.Optimizer] = None,
        scheduler: Optional[Any] = None,
        map_location: Union[str, torch.device] = "cpu",
        scaler: Optional[torch.amp.GradScaler] = None,
    ) -> Optional[Dict[str, Any]]:
        """Restore the newest checkpoint into the given objects; its dict, or None if none exists.

        ``map_location`` is where tensors land (the device the run resumes on); the scaler is
        restored when the checkpoint has one (an fp16 run), else left fresh."""
        paths = self.paths()
        if not paths:
            return None
        path = paths[-1]
        try:
            state = torch.load(path, map_location=map_location, weights_only=False)
        except Exception as err:
            raise RuntimeError(
                f"checkpoint {path} cannot be read ({err}); delete it to resume from the previous one"
            ) from err
        _unwrap(model).load_state_dict(state["model"])
        for name, target in (("optimizer", optimizer), ("scheduler", scheduler)):
            if target is not None:
                if state[name] is None:
                    raise RuntimeError(f"checkpoint {path} holds no {name} state to resume")
                target.load_state_dict(state[name])
        if scaler is not None and state.get("scaler") is not None and scaler.is_enabled():
            scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        return state


def average_checkpoints(paths: List[Path], key: str = "model") -> Dict[str, torch.Tensor]:
    """The element-wise mean of the ``key`` weights of several checkpoint files, summed in float64 (fairseq's
    ``average_checkpoints``); a tensor that is not floating point is taken from the last file."""
    if not paths:
        raise FileNotFoundError("no checkpoints to average")
    total: Dict[str, torch.Tensor] = {}
    for path in paths:
        state = torch.load(path, map_location="cpu", weights_only=False)[key]
        for name, value in state.items():
            value = value.double() if value.is_floating_point() else value
            total[name] = total[name] + value if name in total and value.is_floating_point() else value
    return {name: (v / len(paths)).float() if v.is_floating_point() else v for name, v in total.items()}
