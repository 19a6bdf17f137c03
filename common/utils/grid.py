"""Running a grid of training commands, a few at a time, each with its own log (the reproduction scripts)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence


@dataclass
class Cell:
    """One run of the grid: a label for the progress lines, the command, and its output directory
    (``train.log`` is appended there)."""

    label: str
    command: List[str]
    out: Path


def run_cells(cells: Sequence[Cell], jobs: int, cwd: Optional[Path] = None) -> List[str]:
    """Run ``cells`` in order, ``jobs`` at a time, each on one torch thread (``OMP_NUM_THREADS=1``); print a
    line as each ends. Returns the labels of the cells that failed."""
    pending, running = list(cells), {}
    failed: List[str] = []
    total, started = len(pending), time.time()
    while pending or running:
        while pending and len(running) < jobs:
            cell = pending.pop(0)
            cell.out.mkdir(parents=True, exist_ok=True)
            log = open(cell.out / "train.log", "a")
            proc = subprocess.Popen(cell.command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                    env={**os.environ, "OMP_NUM_THREADS": "1"})
            running[proc] = (cell, log)
        time.sleep(2)
        for proc in [p for p in running if p.poll() is not None]:
            cell, log = running.pop(proc)
            log.close()
            done = total - len(pending) - len(running)
            status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}, see {log.name})"
            if proc.returncode:
                failed.append(cell.label)
            print(f"[{done}/{total}, {(time.time() - started) / 60:.0f} min] {cell.label}: {status}", flush=True)
    if failed:
        print(f"{len(failed)} cells failed: {failed}", file=sys.stderr)
    return failed
