"""Running a grid of training commands, a few at a time, each with its own log (the reproduction scripts)."""
from __future__ import annotations

import os
import signal
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


def add_grid_options(parser) -> None:
    """A reproduction script's ``--jobs`` and ``--stop-after`` (minutes, :func:`stop_seconds`) for :func:`run_cells`."""
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, each on one thread (default 1)")
    parser.add_argument("--stop-after", type=float, metavar="MINUTES",
                        help="start no cell after this long and interrupt the running ones (each saves a checkpoint): "
                             "a rerun resumes them, e.g. over several sessions of a lent GPU")


def check_grid_options(parser, args) -> None:
    """Exit through ``parser.error`` on a ``--jobs`` below 1 or a ``--stop-after`` that is not positive."""
    if args.jobs < 1 or (args.stop_after is not None and args.stop_after <= 0):
        parser.error("--jobs must be at least 1 and --stop-after above 0")


def stop_seconds(args) -> Optional[float]:
    """``--stop-after`` in seconds (None: no stop)."""
    return None if args.stop_after is None else 60 * args.stop_after


def _default_sigint() -> None:
    """In a cell's process before it starts: SIGINT at its default, so that Python turns it into a Ctrl-C even where
    this grid was started in the background (``nohup ... &``), which leaves SIGINT ignored, and its children too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cells(cells: Sequence[Cell], jobs: int, cwd: Optional[Path] = None,
              stop_after: Optional[float] = None) -> List[str]:
    """Run ``cells`` in order, ``jobs`` at a time, each on one torch thread (``OMP_NUM_THREADS=1``); print a
    line as each ends. After ``stop_after`` seconds no cell starts and each running one gets a SIGINT (a trainer's
    Ctrl-C: it saves a checkpoint and exits), so that a rerun resumes the grid where it stopped. Returns the labels
    of the cells that failed (an interrupted cell has not failed)."""
    pending, running = list(cells), {}
    failed: List[str] = []
    total, started, stopping, not_started = len(pending), time.time(), False, 0
    while pending or running:
        while pending and len(running) < jobs and not stopping:
            cell = pending.pop(0)
            cell.out.mkdir(parents=True, exist_ok=True)
            log = open(cell.out / "train.log", "a")
            proc = subprocess.Popen(cell.command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                    env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=_default_sigint)
            running[proc] = (cell, log)
        if stop_after is not None and not stopping and time.time() - started >= stop_after:
            stopping = True
            print(f"[{(time.time() - started) / 60:.0f} min] stopping: {len(running)} running cells interrupted, "
                  f"{len(pending)} not started; a rerun resumes them", flush=True)
            for proc in running:
                proc.send_signal(signal.SIGINT)
            pending, not_started = [], len(pending)
        time.sleep(0.2 if stopping else 2)
        for proc in [p for p in running if p.poll() is not None]:
            cell, log = running.pop(proc)
            log.close()
            done = total - len(pending) - len(running) - not_started
            if proc.returncode == 0:
                status = "done"
            elif stopping and proc.returncode == 130:
                status = "interrupted (a rerun resumes it)"
            else:
                status = f"FAILED (exit {proc.returncode}, see {log.name})"
                failed.append(cell.label)
            print(f"[{done}/{total}, {(time.time() - started) / 60:.0f} min] {cell.label}: {status}", flush=True)
    if failed:
        print(f"{len(failed)} cells failed: {failed}", file=sys.stderr)
    return failed
