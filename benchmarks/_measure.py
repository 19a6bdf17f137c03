"""Shared measuring helpers for the benchmark scripts: timing, peak memory, JSON output."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch
from torch.utils.benchmark import Timer

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def time_ms(fn: Callable[[], None], threads: int, min_run_time: float) -> float:
    """Median wall time of ``fn`` in milliseconds (``torch.utils.benchmark``)."""
    fn()  # warm-up
    timer = Timer("fn()", globals={"fn": fn}, num_threads=threads)
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def interleaved_times(fns: dict, threads: int, rounds: int, min_run_time: float) -> dict:
    """Time every function ``rounds`` times, interleaved so drift hits all alike; medians."""
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(time_ms(fn, threads, min_run_time))
    return {name: statistics.median(values) for name, values in samples.items()}


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory_mb(fn: Callable[[], None]) -> float:
    """Peak resident memory added by one call of ``fn`` (Linux: VmHWM after resetting it)."""
    fn()  # warm-up: allocator caches and lazy initialisation are not counted
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the VmHWM high-water mark to the current RSS
    before = _rss_kb("VmRSS")
    fn()
    return (_rss_kb("VmHWM") - before) / 1024


def in_subprocess(script: str, *args: str) -> dict:
    """Run ``python script args`` and parse the JSON it prints on its last line."""
    out = subprocess.run([sys.executable, script, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def environment(threads: int) -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
    }


def write_json(name: str, payload: dict) -> Path:
    """Write ``results/<name>.json`` atomically and return its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, path)
    return path
