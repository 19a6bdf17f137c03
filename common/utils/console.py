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
* A bar's total never changes, so its percentage never falls. A loop that cannot know its end
  (early stopping) has no total but an upper ``bound``: it shows ``epoch 153 of at most 253``
  and no percentage or ETA; :meth:`Progress.set_bound` moves the bound as the loop learns more
  (where its patience runs out), and its postfix says what it waits for (``patience_left 75/100``).
* The ETA comes from the mean time of the steps done in this run, measured at each update, so
  it moves only when a step ends; :meth:`Progress.skip` advances over reused work (a seed
  trained by an earlier run) without counting it as fast work. Few, uneven steps (seeds that stop
  early at different epochs, on a shared CPU) make that mean jump from step to step: with
  ``smooth_eta`` the finish time is the mean of those predicted at each update, each weighted by
  the steps it rests on, so one slow seed moves it by its share of the evidence.
* :func:`say` prints through ``tqdm.write`` (stderr), which lifts live bars out of the way.
* :func:`interruptible` turns Ctrl-C into one line naming the innermost live bar
  (``interrupted at Cora softmax seeds 3/10, seed 3 epoch 41/100; re-run the same command to resume``) and the
  exit status 130 of a shell's SIGINT convention. Inside :func:`finish_first` a Ctrl-C waits for the block
  (a training update) to end, so that the loop can checkpoint a consistent state; a second one stops at once.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
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


def fail(error: Union[BaseException, str], status: int = 2) -> int:
    """``error: <message>`` on stderr, the one line a command ends with on bad input or a failed run; returns the
    exit status (2: the command was used wrongly or its inputs are bad) for ``main`` to return."""
    print(f"error: {error}", file=sys.stderr)
    return status


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"


class _Bar(tqdm):
    """A tqdm bar whose rate and ETA are its :class:`Progress`'s (steady, and smoothed where asked)."""

    progress: Optional["Progress"] = None

    @property
    def format_dict(self):
        values = super().format_dict
        if self.progress is None:  # while tqdm's constructor draws the bar
            return values
        rate, eta = self.progress.rate(), self.progress.eta()
        return {**values, **({"rate": rate} if rate else {}), **({"remaining": _duration(eta)} if eta is not None
                                                                 else {})}


class Progress:
    """A bar (terminal) or periodic log lines (elsewhere) over ``total`` steps, or, when the end is
    unknown, over at most ``bound`` steps (no percentage, no ETA)."""

    def __init__(self, total: Optional[int] = None, desc: str = "", enabled: bool = True, initial: int = 0,
                 unit: str = "it", iterable: Optional[Iterable] = None, bound: Optional[int] = None,
                 smooth_eta: bool = False):
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.desc, self.n, self.unit, self.iterable = total, desc, initial, unit, iterable
        self.bound = None if total else bound
        self.enabled, self.smooth_eta = enabled, smooth_eta
        self.postfix = ""
        self._bar = None
        self._start = self._last = self._step_end = time.perf_counter()
        self._counted, self._busy = 0, 0.0  # steps timed in this run, and their seconds
        self._finish, self._evidence = 0.0, 0  # sum of the finish times predicted at each update x its steps timed
        if enabled and interactive():
            self._bar = _Bar(total=total, desc=desc, initial=initial, unit=unit, leave=False, file=sys.stderr,
                             mininterval=0.5, dynamic_ncols=True, smoothing=0, bar_format=self._bar_format())
            self._bar.progress = self
        self._interval = log_interval()
        _live.append(self)

    def _bar_format(self) -> Optional[str]:
        """tqdm's layout with a total (our ETA is its ``{remaining}``); without one, the position, the bound and the
        rate (tqdm's own where there is no bound either)."""
        if self.bound is not None:
            return f"{{desc}} {{n_fmt}} of at most {self.bound} [{{elapsed}}, {{rate_fmt}}{{postfix}}]"
        return "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]" if self.total else None

    def rate(self) -> Optional[float]:
        """Steps per second over the steps timed so far (None before the first)."""
        return self._counted / self._busy if self._counted and self._busy > 0 else None

    def eta(self) -> Optional[float]:
        """Seconds left after the last update (None without a total or before the first timed step): the steps
        left at the mean time per step, or with ``smooth_eta`` the smoothed finish time (module docstring)."""
        rate = self.rate()
        if not (rate and self.total):
            return None
        if self.n >= self.total:  # done: a smoothed finish time may still lie ahead of now
            return 0.0
        if self.smooth_eta:
            return max(self._finish / self._evidence - self._step_end, 0.0)
        return max(self.total - self.n, 0) / rate

    def update(self, n: int = 1) -> None:
        """``n`` steps done; their time since the previous update counts towards the rate."""
        now = time.perf_counter()
        self._counted, self._busy, self._step_end = self._counted + n, self._busy + now - self._step_end, now
        rate = self.rate()
        if rate and self.total:  # the finish time this update predicts, weighted by the steps it rests on
            self._finish += self._counted * (now + max(self.total - self.n - n, 0) / rate)
            self._evidence += self._counted
        self._advance(n)

    def set_bound(self, bound: int) -> None:
        """Move the upper bound of a loop without a total as it learns more (early stopping: the step at which
        its patience runs out, unless it improves)."""
        self.bound = bound
        if self._bar is not None:
            self._bar.bar_format = self._bar_format()

    def skip(self, n: int = 1) -> None:
        """``n`` steps passed over (work reused from an earlier run): no part of the rate or ETA."""
        self._step_end = time.perf_counter()
        if self._bar is not None:
            self._bar.initial += n
        self._advance(n)

    def _advance(self, n: int) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled and time.perf_counter() - self._last >= self._interval:
            self._last = time.perf_counter()
            print(self.line(), file=sys.stderr, flush=True)

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{key} {value}" for key, value in values.items())
        if self._bar is not None:
            self._bar.set_postfix(values, refresh=False)

    def position(self) -> str:
        """``desc n/total`` (or ``desc n of at most bound``): where this loop is."""
        if self.total:
            return f"{self.desc} {self.n}/{self.total}"
        return f"{self.desc} {self.n} of at most {self.bound}" if self.bound else f"{self.desc} {self.n} {self.unit}"

    def line(self) -> str:
        """The one-line log of the loop's state: position, percentage, elapsed, ETA (or, with no
        total, the time per step) and postfix."""
        parts = [self.position()]
        if self.total:
            parts.append(f"{100 * self.n / self.total:.0f}%")
        parts.append(f"{_duration(time.perf_counter() - self._start)} elapsed")
        rate, eta = self.rate(), self.eta()
        if eta is not None:
            parts.append(f"ETA {_duration(eta)}")
        elif rate:
            parts.append(f"{1 / rate:.2f} s/{self.unit}" if rate < 1 else f"{rate:.1f} {self.unit}/s")
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
        """The items of ``iterable``, advancing the bar after each (unless the loop :meth:`skip`-ped
        it); closed at the end."""
        try:
            for item in self.iterable:
                before = self.n
                yield item
                if self.n == before:
                    self.update()
        finally:
            self.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(iterable: Optional[Iterable] = None, total: Optional[int] = None, desc: str = "",
             enabled: bool = True, initial: int = 0, unit: str = "it", bound: Optional[int] = None,
             smooth_eta: bool = False) -> Progress:
    """A :class:`Progress` over ``total`` steps (or at most ``bound`` when the end is unknown) or,
    given ``iterable``, one to iterate over (``total`` defaults to ``len(iterable)``); ``smooth_eta`` for
    few, uneven steps such as seeds."""
    return Progress(total, desc, enabled, initial, unit, iterable, bound, smooth_eta)


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


class InterruptedMidway(KeyboardInterrupt):
    """A second Ctrl-C inside :func:`finish_first`: the block stopped before its end."""


@contextlib.contextmanager
def finish_first(what: str = "the current update") -> Iterator[None]:
    """Run the block whole: a Ctrl-C (SIGINT) that arrives inside it is held and raised as the block ends,
    so that the state the block changes is never left half-updated; a second Ctrl-C raises
    :class:`InterruptedMidway` at once. Outside the main thread, or where SIGINT is ignored, it does nothing.
    Advance the loop's bar inside the block: the stop message names the bars' positions as the block ends, so the
    update it names is the one done (and saved)."""
    previous = signal.getsignal(signal.SIGINT)
    if previous in (None, signal.SIG_IGN) or threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: List[Any] = []

    def hold(signum, frame):
        if pending:
            raise InterruptedMidway
        pending.append(frame)
        with contextlib.suppress(OSError):  # os.write: a print here could re-enter a write in progress
            os.write(2, f"\nCtrl-C: stopping after {what} (Ctrl-C again to stop at once)\n".encode())

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        if callable(previous):
            previous(signal.SIGINT, pending[0])
        raise KeyboardInterrupt


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
