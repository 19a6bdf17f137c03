"""Shared measuring helpers for the benchmark scripts: timing, peak memory, JSON output."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.utils.benchmark import Timer

#: Where :func:`write_json` writes: ``$ATTN_RESULTS_DIR`` (the GPU suite sets it), else ``benchmarks/results``.
RESULTS_DIR = Path(os.environ.get("ATTN_RESULTS_DIR") or Path(__file__).resolve().parent / "results")


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


def interleaved_wall_cpu(fns: dict, repeats: int, warmup: int = 1) -> dict:
    """Per function, timed in alternation: median and minimum wall milliseconds, and the median
    CPU milliseconds of this process (``time.process_time``: what the step itself computed, much
    less disturbed than wall time when other jobs share the cores); and the wall milliseconds of the
    first warm-up call (``first_call_ms``: compilation and autotuning included), apart."""
    first = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            start = time.perf_counter()
            fn()
            first.setdefault(name, 1e3 * (time.perf_counter() - start))
    wall, cpu = {name: [] for name in fns}, {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - start_wall)
            cpu[name].append(time.process_time() - start_cpu)
    times = {name: {"wall_median_ms": 1e3 * statistics.median(wall[name]), "wall_min_ms": 1e3 * min(wall[name]),
                    "cpu_median_ms": 1e3 * statistics.median(cpu[name])} for name in fns}
    for name, ms in first.items():
        times[name]["first_call_ms"] = ms
    return times


@contextlib.contextmanager
def kernels_off():
    """Run the PyTorch paths instead of the fused Triton kernels (``ATTN_TRITON=0``) inside."""
    before = os.environ.get("ATTN_TRITON")
    os.environ["ATTN_TRITON"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["ATTN_TRITON"]
        else:
            os.environ["ATTN_TRITON"] = before


def rotated_times(fns: dict, rounds: int, device: str = "cpu", clock: Callable[[], float] = time.perf_counter) -> dict:
    """Per function, the seconds of each of ``rounds`` calls. Each round calls every function once, in
    order on even rounds and in reverse on odd ones (ABBA), so that drift hits all alike and round ``i``
    pairs adjacent calls. On CUDA each call lies between two CUDA events (the GPU's time of the call, read
    after the round: the host does not wait between calls); elsewhere ``clock`` times it."""
    times = {name: [] for name in fns}
    for i in range(rounds):
        order = list(fns) if i % 2 == 0 else list(fns)[::-1]
        if device.startswith("cuda"):
            events = []
            for name in order:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fns[name]()
                end.record()
                events.append((name, start, end))
            torch.cuda.synchronize()
            for name, start, end in events:
                times[name].append(start.elapsed_time(end) / 1e3)
        else:
            for name in order:
                start = clock()
                fns[name]()
                times[name].append(clock() - start)
    return times


def paired_ratio(times: dict, name: str, reference: str) -> float:
    """The median over rounds of ``name``'s time over ``reference``'s (:func:`rotated_times`)."""
    return statistics.median(a / b for a, b in zip(times[name], times[reference]))


def first_call_s(fn: Callable[[], None], device: str = "cpu") -> float:
    """Wall seconds of one call of ``fn``, the device synchronised around it: for a first call, what
    compilation, autotuning and kernel loading cost on top of a step."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def cuda_peak_mb(fn: Callable[[], None], warmup: bool = True) -> float:
    """Peak CUDA memory allocated by one call of ``fn`` above what was allocated before it (after one call
    to warm up, unless ``fn`` ran already)."""
    if warmup:
        fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory_mb(fn: Callable[[], None], warmup: Optional[Callable[[], None]] = None) -> float:
    """Peak resident memory added by one call of ``fn`` (Linux: VmHWM after resetting it).

    ``warmup`` (default ``fn``) runs first so that lazy initialisation is not counted. A warm-up
    by ``fn`` itself leaves its freed buffers in the allocator, which the measured call reuses
    without raising the resident set: pass a small case of the same code to count them.
    """
    (warmup or fn)()
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
