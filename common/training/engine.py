"""One training loop for every domain: a :class:`Task` supplies the model, an epoch's updates, a step and an
evaluation; the :class:`Engine` owns everything else.

    plan = Plan(max_epochs=cfg.train.max_epochs, patience=cfg.train.patience)
    state = Engine(runtime, run_dir, plan, desc="seed 0 update").fit(MyTask(cfg, data, runtime))

The engine runs the updates of each epoch (``task.updates(epoch)``, resumable at any position), each under
:func:`~common.utils.console.finish_first` so that a Ctrl-C lets the update end, checkpoints it and re-raises; it
zeroes the gradients, lets the task compute its losses and call ``runtime.backward``, clips
(``task.max_grad_norm``) and steps the optimizer, the fp16 scaler and the scheduler. It sums the step's logged values on the device (read only
at ``log_every`` updates and at epoch ends: no host synchronisation per step), evaluates on its cadence
(every ``eval_every`` updates, or every ``eval_epochs`` epochs, and always after the last update), keeps the best
evaluation (``task.judge``) and stops when the patience, the epochs, the updates or the minutes run out.
Checkpoints (:class:`~common.utils.Checkpointer`) hold the model, optimiser, scheduler, scaler, every RNG state,
the engine's :class:`TrainState` and ``task.state_dict()``: a resumed run follows the one that never stopped.
A checkpoint written on Ctrl-C is removed by the next one, so the kept checkpoints are those of an
uninterrupted run.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from common.utils import console
from common.utils.checkpoint import Checkpointer
from common.utils.distributed import all_reduce_sum, barrier, broadcast_objects
from common.utils.logger import MetricsLogger
from common.utils.runtime import Runtime
from common.utils.updates import check_updates


@dataclasses.dataclass(frozen=True)
class Plan:
    """When a run stops, evaluates, checkpoints and logs; each domain maps its config keys to one.

    ``max_epochs`` / ``max_updates`` / ``max_minutes`` / ``patience`` (evaluations without improvement): the
    first to run out ends training (None or 0: no limit). ``eval_every`` updates, or with 0 every ``eval_epochs``
    epochs; the last update is always evaluated. Checkpoints every ``checkpoint_every`` updates, at epoch ends
    (``checkpoint_epochs``), at evaluations (``checkpoint_evals``), at the end and on Ctrl-C; ``keep`` of them."""

    max_epochs: Optional[int] = None
    max_updates: Optional[int] = None
    max_minutes: float = 0.0
    patience: int = 0
    eval_every: int = 0
    eval_epochs: int = 1
    checkpoint_every: int = 0
    checkpoint_epochs: bool = True
    checkpoint_evals: bool = True
    log_every: int = 0
    keep: int = 1

    def __post_init__(self) -> None:
        if not (self.max_epochs or self.max_updates):
            raise ValueError("a training plan needs max_epochs or max_updates")


@dataclasses.dataclass
class TrainState:
    """Where training stands, saved in every checkpoint: ``step`` updates done, ``batch`` of them in ``epoch``
    (0-based, the epoch in progress), the best evaluation's ``score`` and ``step``, ``bad`` evaluations since
    it, the evaluation ``history`` (one row per evaluation: the epoch's training means and the metrics),
    the seconds spent in updates, and the step last evaluated and saved."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    done: bool = False
    best: Optional[float] = None
    best_step: Optional[int] = None
    bad: int = 0
    history: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    train_seconds: float = 0.0
    evaluated: Optional[int] = None


class Task:
    """What a domain supplies to the :class:`Engine`. Set ``model``, ``optimizer`` (and ``scheduler``, stepped
    after every update; ``max_grad_norm``, or ``clip``, called on the unscaled gradients) in ``__init__``, and define
    :meth:`updates` and :meth:`train_step`; the other methods have defaults."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    #: Where > 0, the gradients' total norm is clipped to it before each step (unless ``clip`` is set).
    max_grad_norm: float = 0.0
    clip: Optional[Callable[[], Any]] = None
    #: Why an epoch could hold no update, and the fix (the engine's error when :meth:`updates` is empty).
    empty_epoch: Tuple[str, str] = ("the training data holds fewer examples than one batch", "lower the batch size")
    #: The dtype that :meth:`train_step`'s values are summed in on the device (float32 keeps the sums of a loop that
    #: summed float32 losses); a sum is saved exactly either way.
    sum_dtype: torch.dtype = torch.float64
    #: The attributes that are the task's own resumable state (:meth:`state_dict`), e.g. a best-so-far snapshot.
    saved: Tuple[str, ...] = ()

    def updates(self, epoch: int) -> Sequence[Any]:
        """The updates of ``epoch`` (what :meth:`train_step` takes), a function of the seed and the epoch only, so
        that a resumed epoch replays them; sliced (``[start:]``) to resume inside the epoch."""
        raise NotImplementedError

    def train_step(self, update: Any, state: TrainState) -> Mapping[str, torch.Tensor]:
        """Forward and ``runtime.backward`` of one update (gradients are zero on entry); the values to log,
        as tensors (summed on the device over a window; :meth:`window_values` turns sums into what is logged)."""
        raise NotImplementedError

    def initial_values(self) -> Optional[Dict[str, float]]:
        """Values to log at update 0 of a fresh run (e.g. learnt attention spans before training), or None."""
        return None

    def before_update(self, state: TrainState) -> None:
        """Called before each update (e.g. a learning rate set per update)."""

    def after_update(self, state: TrainState) -> Optional[Dict[str, float]]:
        """Called after each optimizer step (e.g. clamping adaptive spans), with ``state.step`` counting it; values
        to log at this update, or None."""
        return None

    def window_values(self, sums: Dict[str, float], updates: int, state: TrainState) -> Dict[str, float]:
        """What is logged for the updates of a window (or an epoch) from the sums of their :meth:`train_step`
        values: their means, by default."""
        return {key: value / max(updates, 1) for key, value in sums.items()}

    def epoch_values(self, sums: Dict[str, float], updates: int, state: TrainState) -> Dict[str, float]:
        """What an epoch's row holds from the sums of its :meth:`train_step` values: :meth:`window_values`, by
        default (a task whose window values are not an epoch's, e.g. a rate since the last window, overrides it)."""
        return self.window_values(sums, updates, state)

    def evaluate(self, state: TrainState) -> Dict[str, float]:
        """Metrics of the current weights ({} when there is nothing to evaluate); on every process (the main
        process's metrics rule)."""
        return {}

    def score(self, metrics: Mapping[str, float]) -> Optional[float]:
        """The value that selects the best evaluation (higher is better); None: no selection, no patience."""
        return None

    def judge(self, metrics: Mapping[str, float], state: TrainState) -> Tuple[bool, Optional[float]]:
        """Whether the evaluation resets the patience, and the new best score (None: this one is not the best)."""
        score = self.score(metrics)
        if score is None or (state.best is not None and score <= state.best):
            return False, None
        return True, score

    def progress_postfix(self, state: TrainState) -> Dict[str, str]:
        """What the progress bar shows after its position from the end of each epoch on (e.g. the last evaluation
        and the best so far); nothing by default."""
        return {}

    def on_best(self, state: TrainState) -> None:
        """Called on the main process when an evaluation is the best so far (write the best weights)."""

    def state_dict(self) -> Dict[str, Any]:
        """The task's own state to checkpoint beside the engine's: each attribute named in :attr:`saved`, through
        its ``state_dict()`` where it has one (a schedule that is not a torch scheduler)."""
        return {name: _state_of(getattr(self, name)) for name in self.saved}

    def record(self, state: TrainState) -> Dict[str, Any]:
        """A seed's record when :func:`~common.training.train_seeds` trains the task (``seed<k>.json``): its
        metrics from the final ``state`` (and the task's best weights)."""
        raise NotImplementedError(f"{type(self).__name__} defines no record: train it with Engine.fit")

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict` on resumption (through ``load_state_dict`` where the attribute has one)."""
        if set(state) != set(self.saved):
            raise ValueError(f"its task state holds {sorted(state)} where {type(self).__name__} saves "
                             f"{sorted(self.saved)}: another version of the code wrote it; resume with that version, "
                             f"or train afresh in another out_dir")
        for name, value in state.items():
            current = getattr(self, name, None)
            if hasattr(current, "state_dict"):  # saved through its state_dict (_state_of): restored through its own
                current.load_state_dict(value)
            else:
                setattr(self, name, value)


class Engine:
    """Train one :class:`Task` under ``run_dir`` (checkpoints, ``metrics.jsonl`` + TensorBoard) to the end of
    its :class:`Plan` (module docstring). Only the main process writes files and shows progress."""

    def __init__(self, runtime: Runtime, run_dir: Path, plan: Plan, desc: str = "update", progress: bool = True,
                 label: str = ""):
        self.runtime, self.env, self.dir, self.plan = runtime, runtime.env, Path(run_dir), plan
        self.desc, self.label = desc, label or desc.split(" update")[0]
        self.progress = progress and self.env.is_main
        self.checkpointer = Checkpointer(self.dir, keep=plan.keep)
        self.state = TrainState()
        self._saved: Optional[int] = None  # the step of the newest checkpoint
        self._interrupted: Optional[Path] = None  # a checkpoint written on Ctrl-C, removed by the next one
        self._current = 0  # the update in progress (1-based)

    # ------------------------------------------------------------------ resume ---
    def restore(self, task: Task) -> TrainState:
        """Load the newest checkpoint into the task (weights, optimiser, scheduler, scaler, RNG) and the state."""
        saved = self.checkpointer.load_latest(task.model, task.optimizer, task.scheduler,
                                              map_location=self.runtime.device, scaler=self.runtime.scaler)
        if saved is not None:
            extra = saved["extra"]
            self.state = TrainState(**extra["engine"])
            self.state.done = self.state.done and self._limit_reached()  # a rerun may raise the limits
            try:
                task.load_state_dict(extra["task"])
            except ValueError as error:
                raise ValueError(f"checkpoint {self.checkpointer.paths()[-1]}: {error}") from None
            if self.env.is_main:  # the others' shares are in the main process's sums
                self._window.load(extra["sums"]["window"], self.runtime.device)
                self._epoch_sums.load(extra["sums"]["epoch"], self.runtime.device)
            self._saved = self.state.step
            if extra.get("interrupted"):
                self._interrupted = self.checkpointer.paths()[-1]
            if self.env.is_main:
                console.say(f"{self.label}: resuming from update {self.state.step} (epoch {self.state.epoch + 1})")
        return self.state

    def save(self, task: Task, interrupted: bool = False) -> Optional[Path]:
        """Checkpoint the current update (main process); the previous Ctrl-C checkpoint goes."""
        # the logged values so far (over every process where all save together; on Ctrl-C, this process's)
        sums = {name: acc.snapshot(self.runtime.device, self.env, collective=not interrupted)
                for name, acc in (("window", self._window), ("epoch", self._epoch_sums))}
        if not self.env.is_main:
            return None
        extra = {"engine": dataclasses.asdict(self.state), "task": task.state_dict(), "sums": sums,
                 "interrupted": interrupted}
        path = self.checkpointer.save(self.state.step, task.model, task.optimizer, task.scheduler, extra=extra,
                                      scaler=self.runtime.scaler, prune=False)
        if self._interrupted not in (None, path):
            self._interrupted.unlink(missing_ok=True)
        self._interrupted = path if interrupted else None
        if not interrupted:
            self.checkpointer.prune()
        self._saved = self.state.step
        return path

    # ------------------------------------------------------------------ loop -----
    def fit(self, task: Task) -> TrainState:
        """Train to the end of the plan (resuming from the newest checkpoint); the final state."""
        self._window, self._epoch_sums = _Sums(task.sum_dtype), _Sums(task.sum_dtype)
        s = self.restore(task)
        updates = task.updates(s.epoch)
        self.per_epoch = check_updates(len(updates), *task.empty_epoch)
        bar = console.progress(desc=self.desc, enabled=self.progress, initial=s.step, unit="update",
                               total=None if self.plan.patience else self._last_update(),
                               bound=self._last_update())
        # a killed attempt may have logged past its checkpoint: those records go (at a fresh start, all)
        self.logger = MetricsLogger(self.dir, enabled=self.env.is_main, resume=s.step)
        initial = task.initial_values() if s.step == 0 else None
        if initial:
            self.logger.log(0, **initial)
        self._epoch_keys: set = set()
        tick = time.perf_counter()
        try:
            with bar:
                while not s.done:
                    tick = self._epoch(task, updates, bar, tick)
                    if not s.done:
                        updates = task.updates(s.epoch)  # the next epoch's
        except console.InterruptedMidway:  # a second Ctrl-C: the update in progress is lost
            if self.env.is_main:
                console.say(f"stopped inside update {self._current}: the rerun resumes from update {self._saved or 0}")
            raise
        except KeyboardInterrupt:
            s.train_seconds += time.perf_counter() - tick
            if s.step not in (0, self._saved):
                path = self.save(task, interrupted=True)
                if path is not None:
                    console.say(f"{self.label}: update {s.step} saved to {path}")
            raise
        finally:
            self.logger.close()
        return s

    def _limit_reached(self) -> bool:
        """Whether the plan's epochs, updates, minutes or patience have run out at the current state."""
        p, s = self.plan, self.state
        return (s.epoch >= (p.max_epochs or math.inf) or s.step >= (p.max_updates or math.inf)
                or bool(p.max_minutes and s.train_seconds >= 60 * p.max_minutes)
                or bool(p.patience and s.bad >= p.patience))

    def _last_update(self) -> int:
        """Where training ends at the latest: the update budget, the epochs, or where the patience runs out
        unless an evaluation improves."""
        p, s = self.plan, self.state
        ends = [p.max_updates or math.inf, (p.max_epochs or math.inf) * self.per_epoch]
        if p.patience:
            per_eval = p.eval_every or self.per_epoch * p.eval_epochs
            ends.append(s.step - s.step % per_eval + (p.patience - s.bad) * per_eval)  # from the last evaluation
        return int(min(ends))

    def _epoch(self, task: Task, updates: Sequence[Any], bar, tick: float) -> float:
        """The rest of the current epoch's ``updates``, then its end (means, evaluation, checkpoint)."""
        p, s = self.plan, self.state
        for update in updates[s.batch:]:
            if s.done or s.step >= (p.max_updates or math.inf):
                break
            self._current = s.step + 1  # the update in progress, also once the block has counted it
            with console.finish_first(f"update {self._current}"):
                self._update(task, update)
                if p.log_every and s.step % p.log_every == 0:
                    s.train_seconds += time.perf_counter() - tick
                    tick = time.perf_counter()
                    self.logger.log(s.step, **self._values(self._window, task), train_seconds=s.train_seconds)
                    self._check_time()
                evaluate = p.eval_every and s.step % p.eval_every == 0
                if evaluate or (p.checkpoint_every and s.step % p.checkpoint_every == 0):
                    s.train_seconds += time.perf_counter() - tick
                    if evaluate:
                        self._evaluate(task, {})
                    if not evaluate or p.checkpoint_evals:
                        self.save(task)
                    tick = time.perf_counter()
                bar.update()  # in the block: a Ctrl-C held until its end names this update as done
        with console.finish_first("the end of the epoch"):
            s.train_seconds += time.perf_counter() - tick
            ended = s.batch >= len(updates)
            row = {}
            if ended:
                means = self._values(self._epoch_sums, task, epoch=True)
                self._epoch_keys = set(means)
                row = {"epoch": s.epoch + 1, **means}
                s.epoch, s.batch = s.epoch + 1, 0
            self._check_time()
            s.done = s.done or s.epoch >= (p.max_epochs or math.inf) or s.step >= (p.max_updates or math.inf)
            due = ended and not p.eval_every and s.epoch % p.eval_epochs == 0
            if (due or s.done) and s.evaluated != s.step:
                self._evaluate(task, row)
            elif row:
                self._log_row(row)
            if s.done or (ended and p.checkpoint_epochs) or (due and p.checkpoint_evals):
                self.save(task)
        bar.set_bound(self._last_update())
        postfix = task.progress_postfix(s)
        if postfix:
            bar.set_postfix(**postfix)
        return time.perf_counter()

    def _update(self, task: Task, update: Any) -> None:
        """One optimiser update: the task's losses and backward, then clipping, the step and the scheduler."""
        s, runtime = self.state, self.runtime
        task.model.train()
        task.before_update(s)
        runtime.begin_step()
        task.optimizer.zero_grad(set_to_none=True)
        values = task.train_step(update, s)
        clip = task.clip
        if clip is None and task.max_grad_norm > 0:
            clip = lambda: torch.nn.utils.clip_grad_norm_(task.model.parameters(), task.max_grad_norm)  # noqa: E731
        runtime.step(task.optimizer, clip)
        if task.scheduler is not None:
            task.scheduler.step()
        s.step, s.batch = s.step + 1, s.batch + 1
        logged = task.after_update(s)
        if logged:
            self.logger.log(s.step, **logged)
        self._window.add(values)
        self._epoch_sums.add(values)

    def _values(self, sums: "_Sums", task: Task, epoch: bool = False) -> Dict[str, float]:
        """What is logged for a window or an epoch: its sums (one device read, summed over processes), through
        ``task.window_values`` (``task.epoch_values`` for an epoch); the sums then restart."""
        totals, updates = sums.drain(self.runtime.device, self.env)
        values = task.epoch_values if epoch else task.window_values
        return values(totals, updates, self.state) if totals else {}

    def _evaluate(self, task: Task, row: Dict[str, Any]) -> None:
        """Evaluate, keep the row in the history, judge it against the best and apply the patience."""
        p, s = self.plan, self.state
        metrics = broadcast_objects([task.evaluate(s)], self.env)[0]
        s.evaluated = s.step
        if not metrics:
            if row:
                self._log_row(row)
            return
        row = {"epoch": row.get("epoch", s.epoch + (1 if s.batch else 0)), "step": s.step, **row, **metrics}
        s.history.append(row)
        resets, best = task.judge(metrics, s)
        if best is not None:
            s.best, s.best_step = best, s.step
            if self.env.is_main:
                task.on_best(s)
        s.bad = 0 if resets else s.bad + 1
        if p.patience and s.bad >= p.patience:
            s.done = True
        self._log_row(row)
        barrier(self.env)

    def _log_row(self, row: Dict[str, Any]) -> None:
        """Log an epoch's row: its numbers, the epoch's training means only where no window logs them."""
        means = self._epoch_keys if self.plan.log_every else ()
        values = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step" and k not in means}
        if set(values) - {"epoch"}:  # not a line that says only which epoch ended
            self.logger.log(self.state.step, **values)

    def _check_time(self) -> None:
        """Stop every process once any has trained ``max_minutes``."""
        if not self.plan.max_minutes:
            return
        over = torch.tensor([float(self.state.train_seconds >= 60 * self.plan.max_minutes)],
                            device=self.runtime.device)
        if all_reduce_sum(over, self.env).item():
            self.state.done = True


def _state_of(value: Any) -> Any:
    return value.state_dict() if hasattr(value, "state_dict") else value


class _Sums:
    """The :meth:`Task.train_step` values of the updates since the last drain, summed on the device."""

    def __init__(self, dtype: torch.dtype = torch.float64):
        self.sums: Dict[str, torch.Tensor] = {}
        self.updates, self.dtype = 0, dtype

    def add(self, values: Mapping[str, torch.Tensor]) -> None:
        for key, value in values.items():
            value = torch.as_tensor(value).detach().to(self.dtype)  # float64 by default: a resumed sum adds up alike
            self.sums[key] = self.sums[key] + value if key in self.sums else value
        self.updates += 1

    def drain(self, device: torch.device, env) -> Tuple[Dict[str, float], int]:
        """The sums over every process and the number of updates they cover; then empty."""
        snapshot = self.snapshot(device, env)
        self.sums, self.updates = {}, 0
        return snapshot["sums"], snapshot["updates"]

    def snapshot(self, device: torch.device, env, collective: bool = True) -> Dict[str, Any]:
        """``{"sums": {key: float}, "updates": n}``, over every process when ``collective`` (all must call; after a
        resume only the main process holds the sums saved before, so its keys are the ones reduced)."""
        keys = list(self.sums)
        if collective and env.distributed:
            keys = broadcast_objects([keys], env)[0]
        zero = torch.zeros((), dtype=torch.float64, device=device)
        totals = torch.stack([self.sums[k].to(device, torch.float64) if k in self.sums else zero for k in keys]
                             + [zero + self.updates])
        totals = (all_reduce_sum(totals, env) if collective else totals).tolist()
        return {"sums": dict(zip(keys, totals[:-1])), "updates": int(totals[-1])}

    def load(self, snapshot: Dict[str, Any], device: torch.device) -> None:
        self.sums = {k: torch.tensor(v, dtype=self.dtype, device=device) for k, v in snapshot["sums"].items()}
        self.updates = snapshot["updates"]
