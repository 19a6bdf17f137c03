"""What every training CLI shows: progress, lines above it, a closing summary, and Ctrl-C.

    bar = console.progress(total=len(batches), desc="epoch 1", enabled=not args.no_progress)
    for batch in batches:
        ...
        bar.update()
    console.say("epoch 1: val ppl 12.3")        # above the bars, never onto them
    console.files_written([out / "results.json", out / "best.pt"])

* On a terminal the bars are ``tqdm`` bars on stderr. When stderr is not a terminal (a log
  file, ``nohup``, CI) each bar becomes one plain line every ``$ATTN_PROGRESS_SECONDS``
  seconds (default 30; 0 logs every update), so a long job is never silent and a log holds
  no carriage returns.
* :func:`say` prints through ``tqdm.write`` (stderr), which lifts live bars out of the way.
* :func:`interruptible` turns Ctrl-C into one line naming the innermost live bar
  (``interrupted at Cora softmax seeds 3/10, seed 3 epoch 41/100; re-run the same command to resume``) and the
  exit status 130 of a shell's SIGINT convention.
"""
from __future__ import annotations

import functools
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Union

from tqdm.auto import tqdm

PROGRESS_SECONDS_ENV = "ATTN_PROGRESS_SECONDS"
INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command

_live: List["Progress"] = []  # open bars, outermost first


def interactive() -> bool:
    """Whether stderr is a terminal (bars) or not (periodic one-line logs)."""
    return sys.stderr.isatty()


def log_interval() -> float:
    """Seconds between the one-line progress logs when stderr is not a terminal."""
    value = os.environ.get(PROGRESS_SECONDS_ENV, "30")
    try:
        return max(float(value), 0.0)
    except ValueError:
        raise ValueError(f"${PROGRESS_SECONDS_ENV}={value!r}: expected a number of seconds") from None


def say(message: str) -> None:
    """One line to stderr, above any live bar."""
    tqdm.write(message, file=sys.stderr)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"


class Progress:
    """A bar (terminal) or periodic log lines (elsewhere) over ``total`` steps.

    ``total`` may change while it runs (:meth:`set_total`): an early-stopping loop sets it to
    the step at which its patience would run out, so the ETA reflects the real budget.
    """

    def __init__(self, total: Optional[int] = None, desc: str = "", enabled: bool = True, initial: int = 0,
                 unit: str = "it", iterable: Optional[Iterable] = None):
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.desc, self.n, self.unit, self.iterable = total, desc, initial, unit, iterable
        self.enabled = enabled
        self.postfix = ""
        self._bar = None
        self._start = self._last = time.perf_counter()
        self._initial = initial
        if enabled and interactive():
            self._bar = tqdm(total=total, desc=desc, initial=initial, unit=unit, leave=False, file=sys.stderr,
                             mininterval=0.5, dynamic_ncols=True)
        self._interval = log_interval()
        _live.append(self)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled and time.perf_counter() - self._last >= self._interval:
            self._last = time.perf_counter()
            print(self.line(), file=sys.stderr, flush=True)

    def set_total(self, total: Optional[int]) -> None:
        self.total = total
        if self._bar is not None and self._bar.total != total:
            self._bar.total = total
            self._bar.refresh()

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{key} {value}" for key, value in values.items())
        if self._bar is not None:
            self._bar.set_postfix(values, refresh=False)

    def position(self) -> str:
        """``desc n/total``: where this loop is."""
        return f"{self.desc} {self.n}/{self.total}" if self.total else f"{self.desc} {self.n} {self.unit}"

    def line(self) -> str:
        """The one-line log of the loop's state: position, percentage, elapsed, ETA and postfix."""
        elapsed = time.perf_counter() - self._start
        parts = [self.position()]
        if self.total:
            parts.append(f"{100 * self.n / self.total:.0f}%")
        parts.append(f"{_duration(elapsed)} elapsed")
        done = self.n - self._initial
        if self.total and done > 0:
            parts.append(f"ETA {_duration(elapsed / done * max(self.total - self.n, 0))}")
        if self.postfix:
            parts.append(self.postfix)
        return " | ".join(parts)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self in _live:
            _live.remove(self)

    def __iter__(self) -> Iterator:
        """The items of ``iterable``, advancing the bar after each; closed at the end."""
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(iterable: Optional[Iterable] = None, total: Optional[int] = None, desc: str = "",
             enabled: bool = True, initial: int = 0, unit: str = "it") -> Progress:
    """A :class:`Progress` over ``total`` steps or, given ``iterable``, one to iterate over
    (``total`` defaults to ``len(iterable)``)."""
    return Progress(total, desc, enabled, initial, unit, iterable)


def where() -> Optional[str]:
    """The positions of the live bars, outermost first (``Cora softmax seeds 3/10, seed 3 epoch 41/100``)."""
    return ", ".join(bar.position() for bar in _live) or None


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def files_written(paths: Sequence[Union[str, Path]], title: str = "files written") -> None:
    """The closing block: every file (or directory) the run wrote that exists, one per line, on stdout."""
    existing = [Path(p) for p in paths if Path(p).exists()]
    if not existing:
        return
    print(f"{title}:")
    for path in existing:
        print(f"  {_shown(path)}{'/' if path.is_dir() else ''}")
    sys.stdout.flush()


def interruptible(main: Callable[..., int]) -> Callable[..., int]:
    """Decorate a CLI ``main``: Ctrl-C prints where the run stopped and returns 130.

    The position is taken when the signal arrives, before unwinding closes the bars.
    """
    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        stopped_at: List[Optional[str]] = [None]

        def on_sigint(signum, frame):
            stopped_at[0] = where()
            raise KeyboardInterrupt

        try:
            previous = signal.signal(signal.SIGINT, on_sigint)
        except ValueError:  # not the main thread: keep Python's handler
            previous = None
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:
            for bar in reversed(list(_live)):
                bar.close()
            sys.stdout.flush()
            at = stopped_at[0]
            print(f"{chr(10) if interactive() else ''}interrupted{f' at {at}' if at else ''}; re-run the same command to resume", file=sys.stderr,
                  flush=True)
            return INTERRUPTED
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
    return wrapper
