"""Checks shared by the runtime tests of every domain: the tolerance within which a bf16-autocast run
must follow the fp32 run of the same model, data and seed (tests/<domain>/test_precision.py) and a
CUDA run the CPU run (tests/gpu), and checkpoints rewritten as a GPU machine writes them.

bfloat16 keeps 8 significant bits (relative rounding 2^-8 = 0.4%), so matrix products and the
losses built on them move by about 1%; over a few updates the trajectories drift apart slowly.
A run follows another when every loss and the final evaluation are finite and within
``rel * |reference| + abs``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence
from unittest import mock

import torch
import torch.serialization

#: bf16 autocast against fp32 (same device)
BF16 = dict(rel=0.02, abs=0.01)
#: the same precision on CUDA against the CPU (TF32 matmuls on CUDA: 10-bit mantissas)
CUDA_FP32 = dict(rel=0.01, abs=0.005)


def assert_follows(run: dict, reference: dict, rel: float, abs: float) -> None:
    """``run["losses"]`` / ``run["eval"]`` within ``rel * |reference| + abs`` of the reference's, all finite."""
    losses, expected = run["losses"], reference["losses"]
    assert len(losses) == len(expected) > 0
    pairs: Sequence = [*zip(losses, expected), (run["eval"], reference["eval"])]
    for step, (value, ref) in enumerate(pairs):
        assert math.isfinite(value), f"step {step}: {value}"
        assert abs_diff(value, ref) <= rel * math.fabs(ref) + abs, (
            f"{'evaluation' if step == len(losses) else f'loss {step}'}: {value} vs {ref}; "
            f"all: {losses} / {expected}, eval {run['eval']} / {reference['eval']}")


def abs_diff(a: float, b: float) -> float:
    return math.fabs(a - b)


def rewrite_as_written_on_cuda(run_dir: Path) -> int:
    """Rewrite every ``*.pt`` under ``run_dir`` as ``torch.save`` writes it on a GPU machine: each tensor
    tagged ``cuda:0`` (loading it without ``map_location`` fails on a CPU-only machine), and the
    generator states with a CUDA entry. Returns the number of files rewritten."""
    files = sorted(Path(run_dir).rglob("*.pt"))
    for path in files:
        state = torch.load(path, map_location="cpu", weights_only=False)
        if isinstance(state.get("rng"), dict):
            state["rng"]["cuda"] = [torch.get_rng_state()]  # a ByteTensor, as torch.cuda.get_rng_state() gives
        with mock.patch.object(torch.serialization, "location_tag", lambda storage: "cuda:0"):
            torch.save(state, path)
        if not torch.cuda.is_available():
            try:
                torch.load(path, weights_only=False)
            except RuntimeError as err:
                assert "CUDA" in str(err)
            else:
                raise AssertionError(f"{path} still loads without map_location")
    return len(files)
