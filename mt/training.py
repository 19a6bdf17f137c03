"""Training a translation model: the work behind ``python -m mt.train`` (:mod:`mt.train` parses the
command line and checks the config before this module, torch and the models are imported).

Loss: label-smoothed cross-entropy per target token (+ the weighted BAM KL when a BAM
normalizer runs, collected by ``common.attention.aux_losses``). Adam with either an
inverse-square-root schedule after a linear warm-up or plateau halving of the learning rate
on validation perplexity; gradient-norm clipping. Every ``train.eval_every`` updates (or
each epoch) the run validates (perplexity, greedy BLEU), writes a resumable checkpoint and
keeps ``best.pt``. Rerunning the same command resumes from the newest checkpoint, with the
same batches. At the end the best (or checkpoint-averaged) model is scored with beam search
on the test splits; ``results.json`` and ``curves.png`` go to the run directory.

``--device``, ``train.precision`` and ``train.compile`` choose where and how it computes
(:mod:`common.utils.runtime`); a checkpoint resumes on any device. Several GPUs::

    torchrun --nproc_per_node 4 -m mt.train --preset transformer-base

deals each epoch's token-budget batches to the processes in rounds of ``N *
batching.update_freq`` batches (every batch exactly once; a process left without a batch in
the last round contributes zero), and every update is the mean token loss over the round's
batches together: N processes follow one process with ``update_freq`` N times larger. Only the
first process validates, checkpoints and writes files.
"""
from __future__ import annotations

import json
import math
import shutil
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from common import attention
from common.utils import (Checkpointer, MetricsLogger, atomic_save, atomic_write_json, read_metrics,
                          results_record, seed_everything)
from common.utils import console
from common.utils.config import check_resumable
from common.utils.distributed import all_reduce_sum, barrier, broadcast_objects, round_robin, wrap_model
from common.utils.runtime import Runtime

from .batching import Batch, collate, iterate_batches, token_batches
from .config import to_dict
from .data import ParallelData, Prepared, ensure_prepared, load_split
from .run import RunFiles, load_model, new_model
from .text import write_lines
from .translation import bleu_on_split

#: Config keys that may change between a run and its resumption (where files go, stopping, speed, evaluation).
RESUMABLE_KEYS = ("data_root", "prepared_dir", "out_dir", "device", "train.max_steps", "train.max_epochs",
                  "train.max_minutes", "train.patience", "train.threads", "train.precision", "train.compile",
                  "train.log_every", "train.progress", "train.average_last", "eval")
#: With ``train.compile=reduce-overhead`` batch lengths are rounded up to a multiple of this: fewer shapes, each
#: recorded once as a CUDA graph.
LENGTH_MULTIPLE = 16

#: How the summary line and the plot title name the corpora of :data:`mt.data.CORPORA`.
CORPUS_TITLES = {"multi30k": "Multi30k de-en", "iwslt14": "IWSLT'14 de-en", "demo": "a toy de-en corpus"}


class LRSchedule:
    """Learning rate per update: ``inverse_sqrt``, ``plateau`` halving, or ``constant``."""

    def __init__(self, optimizer: torch.optim.Optimizer, kind: str, base_lr: float, warmup: int = 0,
                 plateau_factor: float = 0.5, plateau_start: int = 2):
        if kind not in ("inverse_sqrt", "plateau", "constant"):
            raise ValueError(f"schedule.kind must be inverse_sqrt, plateau or constant, got {kind!r}")
        if kind == "inverse_sqrt" and warmup < 1:
            raise ValueError("schedule.warmup must be >= 1 for inverse_sqrt")
        self.optimizer, self.kind, self.base_lr, self.warmup = optimizer, kind, base_lr, warmup
        self.factor, self.start = plateau_factor, plateau_start
        self.scale, self.last_ppl, self.validations = 1.0, math.inf, 0

    def lr(self, update: int) -> float:
        """lr of update ``update`` (1-based): ``lr * min(u / warmup, sqrt(warmup / u))`` for inverse_sqrt."""
        if self.kind == "inverse_sqrt":
            return self.base_lr * min(update / self.warmup, math.sqrt(self.warmup / update))
        return self.base_lr * self.scale

    def before_update(self, update: int) -> float:
        lr = self.lr(update)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def after_validation(self, ppl: float) -> None:
        """Plateau: halve when perplexity got worse than at the previous validation (from ``start`` on)."""
        self.validations += 1
        if self.kind == "plateau" and self.validations >= self.start and ppl > self.last_ppl:
            self.scale *= self.factor
        self.last_ppl = ppl

    def state_dict(self) -> dict:
        return {"scale": self.scale, "last_ppl": self.last_ppl, "validations": self.validations}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.last_ppl, self.validations = state["scale"], state["last_ppl"], state["validations"]


def batch_loss(model, batch: Batch, pad: int, label_smoothing: float, kl_weight: float,
               total_tokens: Optional[int] = None, replicas: int = 1) -> Dict[str, torch.Tensor]:
    """Label-smoothed CE (+ weighted KL) of ``batch``, as its share of an update's mean token loss.

    Alone (``total_tokens`` None) the loss is the batch's mean CE per target token plus the
    weighted KL. In a round of ``replicas`` data-parallel batches with ``total_tokens`` target
    tokens together, it is ``replicas * (CE sum + weight * KL * tokens) / total_tokens``, so that
    DDP's gradient mean over the replicas is the gradient of the round's mean token loss.
    """
    with attention.aux_losses() as aux:
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
    tokens = batch.tgt_out.ne(pad).sum()
    ce_sum = F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=pad,
                             label_smoothing=label_smoothing, reduction="sum")
    kl = aux.total()
    total = tokens if total_tokens is None else total_tokens
    loss = (ce_sum + kl_weight * kl * tokens) * (replicas / max(int(total), 1))
    return {"loss": loss, "ce_sum": ce_sum, "kl": kl, "tokens": tokens}


@torch.no_grad()
def validation_loss(model, data: ParallelData, src_pad: int, tgt_pad: int, max_tokens: int,
                    runtime: Optional[Runtime] = None) -> float:
    """Mean cross-entropy per target token (no smoothing, posterior-mean attention)."""
    runtime = runtime or Runtime(torch.device("cpu"))
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for batch in iterate_batches(data, token_batches(data.src_lengths, data.tgt_lengths, max_tokens, shuffle=False),
                                 src_pad, tgt_pad):
        batch = runtime.to_device(batch)
        with runtime.autocast():
            logits = model(batch.src, batch.src_mask, batch.tgt_in)
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=tgt_pad,
                                       reduction="sum"))
        tokens += int(batch.tgt_out.ne(tgt_pad).sum())
    model.train(was_training)
    return total / tokens


class Trainer:
    """State of one run: data, model, optimiser, schedule, checkpoints and metrics."""

    def __init__(self, cfg: DictConfig, out_dir: Path, data_root: Path, runtime: Optional[Runtime] = None):
        from common.utils.updates import check_updates

        self.cfg, self.out_dir = cfg, out_dir
        self.runtime = runtime = runtime or Runtime(torch.device("cpu"))
        self.env = runtime.env
        seed_everything(cfg.seed)
        for turn in ("main", "others"):  # the main process tokenises and caches; the others then read the cache
            if (turn == "main") == self.env.is_main:
                self.prepared: Prepared = ensure_prepared(cfg.dataset, data_root, cfg.prepared_dir,
                                                          cfg.data.num_merges,
                                                          progress=lambda m: print(m, file=sys.stderr))
            barrier(self.env)
        self.src_pad, self.tgt_pad = self.prepared.src_vocab.pad, self.prepared.tgt_vocab.pad
        self.train_data = load_split(self.prepared, cfg.data.train_split, cfg.data.max_len)
        # every pair lands in a batch (token_batches refuses a pair over the budget): no pair, no update
        within = f" with both sides within data.max_len={cfg.data.max_len} BPE units" if cfg.data.max_len else ""
        check_updates(len(self.train_data), f"data.train_split {cfg.data.train_split!r} has no pair{within}",
                      "raise data.max_len (null keeps every pair)" if within else
                      "prepare a dataset with training pairs")
        self.valid_data = load_split(self.prepared, cfg.data.valid_split)
        if self.env.is_main:
            self._write_run_files()
        barrier(self.env)
        self.model = new_model(to_dict(cfg), self.prepared.src_vocab, self.prepared.tgt_vocab).to(runtime.device)
        self.ddp = wrap_model(self.model, self.env)  # the model itself when there is one process
        self.forward = runtime.compile(self.ddp)
        o = cfg.optim
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                                          weight_decay=o.weight_decay)
        s = cfg.schedule
        self.schedule = LRSchedule(self.optimizer, s.kind, o.lr, s.warmup, s.plateau_factor, s.plateau_start)
        self.kl = attention.KLSchedule.from_config(cfg.kl)
        self.checkpointer = Checkpointer(out_dir, keep=cfg.train.keep_checkpoints)
        state = self.checkpointer.load_latest(self.model, self.optimizer, self.schedule,
                                              map_location=runtime.device, scaler=runtime.scaler)
        self.progress = {"step": 0, "epoch": 0, "batch": 0, "best": None, "best_step": None, "bad": 0,
                         "train_seconds": 0.0, "done": False, "validated": None}
        #: The update of the newest checkpoint, and that checkpoint's path when Ctrl-C wrote it.
        self.saved_step: Optional[int] = None
        self.interrupted_checkpoint: Optional[Path] = None
        if state is not None:
            extra = dict(state["extra"])
            if extra.pop("interrupted", False):
                self.interrupted_checkpoint = self.checkpointer.paths()[-1]
            self.progress.update(extra)
            self.saved_step = self.progress["step"]
            if self.env.is_main:
                console.say(f"resuming {out_dir} from update {self.progress['step']} (epoch {self.epoch_number()}, "
                            f"batch {self.progress['batch']})")

    def _write_run_files(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.out_dir / "config.json"
        if config_path.exists() and Checkpointer(self.out_dir).paths():
            check_resumable(json.loads(config_path.read_text(encoding="utf-8")), to_dict(self.cfg), RESUMABLE_KEYS,
                            self.out_dir)
        atomic_write_json(self.out_dir / "config.json", to_dict(self.cfg))
        self.prepared.src_vocab.save(self.out_dir / "vocab.src.json")
        self.prepared.tgt_vocab.save(self.out_dir / "vocab.tgt.json")
        shutil.copyfile(self.prepared.bpe.codes, self.out_dir / "bpe.codes")

    # ------------------------------------------------------------------ loop ----
    def epoch_number(self) -> int:
        """The 1-based epoch of the latest update, as the progress bar counts (0 before the first)."""
        p = self.progress
        return p["epoch"] + (1 if p["batch"] else 0)

    def run(self) -> None:
        """Train until ``max_steps``, ``max_epochs``, ``max_minutes`` or the patience runs out; a run that stops between
        two validations validates (and checkpoints) its last update, so no run ends without ``best.pt``.

        Ctrl-C lets the current update (with its logging and validation) finish, checkpoints it and re-raises; the
        same command then resumes from that update exactly. A second Ctrl-C stops at once, and the rerun resumes
        from the checkpoint before."""
        cfg, p = self.cfg.train, self.progress
        logger = MetricsLogger(self.out_dir, enabled=self.env.is_main)
        self.model.train()
        try:
            while not p["done"] and p["epoch"] < cfg.max_epochs and p["step"] < cfg.max_steps:
                self._epoch(logger)
            with console.finish_first("the last validation"):
                if p["validated"] != p["step"]:
                    self._validate(logger)
                p["done"] = True
        except console.InterruptedMidway:
            if self.env.is_main:
                console.say(f"stopped inside update {p['step']}: the rerun resumes from update {self.saved_step or 0}")
            raise
        except KeyboardInterrupt:
            if self.env.is_main and p["step"] not in (0, self.saved_step):
                path = self._checkpoint(interrupted=True)
                console.say(f"update {p['step']} saved to {path}")
            raise
        finally:
            logger.close()

    def _checkpoint(self, interrupted: bool = False) -> Path:
        """Checkpoint the current update. One written on Ctrl-C is deleted by the next checkpoint, so that
        ``keep_checkpoints`` and checkpoint averaging see the checkpoints of a run that was never interrupted."""
        p = self.progress
        path = self.checkpointer.save(p["step"], self.model, self.optimizer, self.schedule,
                                      extra={**p, "interrupted": interrupted}, scaler=self.runtime.scaler, prune=False)
        if self.interrupted_checkpoint not in (None, path):
            self.interrupted_checkpoint.unlink(missing_ok=True)
        self.interrupted_checkpoint = path if interrupted else None
        if not interrupted:
            self.checkpointer.prune()
        self.saved_step = p["step"]
        return path

    def _collate(self, indices: List[int]) -> Batch:
        return collate(self.train_data.src, self.train_data.tgt, indices, self.src_pad, self.tgt_pad,
                       LENGTH_MULTIPLE if self.runtime.fixed_shapes else 1)

    def _update(self, batches: List[Batch], kl_weight: float, fallback: List[int]) -> List[Dict[str, torch.Tensor]]:
        """One optimiser update on this process's ``batches`` of the round; their losses.

        Gradients accumulate over the batches (DDP synchronises on the last one only). A process
        left without a batch in the last round runs the ``fallback`` batch weighted zero, so that
        DDP's gradient all-reduce still meets and no sentence counts twice.
        """
        cfg, runtime, env = self.cfg, self.runtime, self.env
        tokens = sum(int(batch.tgt_out.ne(self.tgt_pad).sum()) for batch in batches)
        total = int(all_reduce_sum(torch.tensor(tokens, device=runtime.device), env)) if env.distributed else tokens
        weight = 1.0
        if not batches:
            batches, weight = [self._collate(fallback)], 0.0
        self.optimizer.zero_grad(set_to_none=True)
        outs = []
        for i, batch in enumerate(batches):
            synchronised = i == len(batches) - 1 or not env.distributed
            with nullcontext() if synchronised else self.ddp.no_sync():
                with runtime.autocast():
                    out = batch_loss(self.forward, runtime.to_device(batch), self.tgt_pad,
                                     cfg.optim.label_smoothing, kl_weight, total, env.world_size)
                out = {key: value * weight for key, value in out.items()}
                runtime.backward(out["loss"])
            outs.append(out)
        clip = None
        if cfg.optim.clip_norm > 0:
            clip = lambda: torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.clip_norm)  # noqa: E731
        runtime.step(self.optimizer, clip)
        attention.clamp_spans(self.model)
        return outs

    def _epoch(self, logger: MetricsLogger) -> None:
        cfg, p, env = self.cfg, self.progress, self.env
        batches = token_batches(self.train_data.src_lengths, self.train_data.tgt_lengths, cfg.batching.max_tokens,
                                cfg.batching.max_sentences, shuffle=True, seed=cfg.seed, epoch=p["epoch"])
        # the bar ends where this epoch ends or the update budget runs out, whichever comes first
        rounds = math.ceil(len(batches) / (env.world_size * cfg.batching.update_freq))
        done_rounds = math.ceil(p["batch"] / (env.world_size * cfg.batching.update_freq))
        bar = console.progress(total=min(rounds, done_rounds + cfg.train.max_steps - p["step"]), initial=done_rounds,
                               desc=f"epoch {p['epoch'] + 1} update", enabled=cfg.train.progress and env.is_main)
        window = {"ce_sum": 0.0, "weighted_kl": 0.0, "kl": 0.0, "tokens": 0}
        tick = time.perf_counter()
        try:
            for position, mine in round_robin(batches, env, start=p["batch"], per_process=cfg.batching.update_freq):
                with console.finish_first(f"update {p['step'] + 1}"):
                    p["step"] += 1
                    bar.update()
                    p["batch"] = position
                    lr = self.schedule.before_update(p["step"])
                    kl_weight = self.kl(p["step"])
                    for out in self._update([self._collate(indices) for indices in mine], kl_weight,
                                            fallback=batches[position - 1]):
                        # summed on the device, read at the log step (a read per update would synchronise the host)
                        tokens, kl = out["tokens"].detach(), out["kl"].detach()
                        window["ce_sum"] = window["ce_sum"] + out["ce_sum"].detach()
                        window["weighted_kl"] = window["weighted_kl"] + kl_weight * kl * tokens
                        window["kl"] = window["kl"] + kl * tokens
                        window["tokens"] = window["tokens"] + tokens
                    if p["step"] % cfg.train.log_every == 0:
                        now = time.perf_counter()
                        p["train_seconds"] += now - tick
                        self._log_window(logger, window, lr, kl_weight, now - tick)
                        window = {k: 0 for k in window}
                        tick = now
                        if cfg.train.max_minutes and self._out_of_time():
                            p["done"] = True
                    if cfg.train.eval_every and p["step"] % cfg.train.eval_every == 0:
                        p["train_seconds"] += time.perf_counter() - tick
                        self._validate(logger)
                        tick = time.perf_counter()
                    if p["done"] or p["step"] >= cfg.train.max_steps:
                        break
        except console.InterruptedMidway:
            raise
        except KeyboardInterrupt:
            p["train_seconds"] += time.perf_counter() - tick  # the time since the last log, kept in the checkpoint
            raise
        bar.close()
        with console.finish_first("the end of the epoch"):
            p["train_seconds"] += time.perf_counter() - tick
            if p["batch"] >= len(batches):
                p["epoch"] += 1
                p["batch"] = 0
                if not cfg.train.eval_every:
                    self._validate(logger)

    def _out_of_time(self) -> bool:
        """Whether any process has trained for ``train.max_minutes`` (all of them stop together)."""
        over = self.progress["train_seconds"] >= 60 * self.cfg.train.max_minutes
        if not self.env.distributed:
            return over
        return bool(all_reduce_sum(torch.tensor([float(over)], device=self.runtime.device), self.env).item())

    def _log_window(self, logger: MetricsLogger, window: dict, lr: float, kl_weight: float, seconds: float) -> None:
        """Log the training loss, CE and KL per target token since the last log, over every process."""
        keys = ("ce_sum", "weighted_kl", "kl", "tokens")
        sums = all_reduce_sum(torch.stack([torch.as_tensor(window[k], dtype=torch.float64, device=self.runtime.device)
                                           for k in keys]), self.env).tolist()
        ce_sum, weighted_kl, kl, tokens = sums
        tokens_or_one = max(tokens, 1.0)
        p = self.progress
        logger.log(p["step"], **{"train/loss": (ce_sum + weighted_kl) / tokens_or_one,
                                 "train/ce": ce_sum / tokens_or_one, "train/kl": kl / tokens_or_one},
                   lr=lr, kl_weight=kl_weight, tokens_per_second=tokens / seconds, epoch=self.epoch_number(),
                   train_seconds=p["train_seconds"])

    def _validate(self, logger: MetricsLogger) -> None:
        """Validate and checkpoint on the main process; every process then shares its decisions."""
        p = self.progress
        if self.env.is_main:
            self._validate_main(logger)
        p.update(broadcast_objects([p], self.env)[0])
        self.schedule.load_state_dict(broadcast_objects([self.schedule.state_dict()], self.env)[0])

    def _validate_main(self, logger: MetricsLogger) -> None:
        cfg, p, runtime = self.cfg, self.progress, self.runtime
        start = time.perf_counter()
        loss = validation_loss(self.model, self.valid_data, self.src_pad, self.tgt_pad, cfg.batching.max_tokens,
                               runtime)
        bleu = bleu_on_split(self.model, self.prepared, cfg.data.valid_split, beam=1, length_penalty=1.0,
                             max_len_a=cfg.eval.max_len_a, max_len_b=cfg.eval.max_len_b,
                             batch_size=cfg.eval.batch_sentences, limit=cfg.eval.valid_bleu_sentences,
                             detok=False, runtime=runtime)["bleu"]
        ppl = math.exp(min(loss, 50.0))
        self.schedule.after_validation(ppl)
        metric = bleu if cfg.train.select == "bleu" else -loss
        improved = p["best"] is None or metric > p["best"]
        p["validated"] = p["step"]
        if improved:
            p["best"], p["best_step"], p["bad"] = metric, p["step"], 0
            atomic_save({"model": self.model.state_dict(), "step": p["step"], "val_bleu": bleu, "val_loss": loss},
                        self.out_dir / "best.pt")
        else:
            p["bad"] += 1
        if cfg.train.patience and p["bad"] >= cfg.train.patience:
            p["done"] = True
        logger.log(p["step"], **{"val/loss": loss, "val/ppl": ppl, "val/bleu": bleu, "epoch": self.epoch_number(),
                                 "train_seconds": p["train_seconds"], "val_seconds": time.perf_counter() - start})
        console.say(f"update {p['step']} epoch {self.epoch_number()}: val ppl {ppl:.2f} greedy BLEU {bleu:.2f}"
                    f"{' (best)' if improved else ''} | lr {self.schedule.lr(max(p['step'], 1)):.2e} | "
                    f"{p['train_seconds']:.0f}s training")
        self._checkpoint()


def run_title(cfg) -> str:
    """The preset and the corpus of a run's config, e.g. ``transformer-cpu on IWSLT'14 de-en``."""
    return f"{cfg['preset']} on {CORPUS_TITLES.get(cfg['dataset'], cfg['dataset'])}"


def finish(trainer: Trainer, data_root: Path) -> dict:
    """Score the selected (or averaged) model on the validation and test splits; write results."""
    cfg, files, runtime = trainer.cfg, RunFiles(trainer.out_dir), trainer.runtime
    average = cfg.train.average_last if cfg.train.average_last > 1 else None
    model = load_model(files, average_last=average).to(runtime.device)
    e = cfg.eval
    splits = {}
    for split in [cfg.data.valid_split, *cfg.data.test_splits]:
        result = bleu_on_split(model, trainer.prepared, split, e.beam, e.length_penalty, e.max_len_a, e.max_len_b,
                               e.batch_sentences, progress=cfg.train.progress, runtime=runtime)
        hyps = result.pop("hypotheses")
        write_lines(trainer.out_dir / f"{split}.hyp.txt", hyps)
        splits[split] = result
        console.say(f"{split}: BLEU {result['bleu']:.2f} (tokenised, lowercased) | "
                    f"SacreBLEU {result['sacrebleu']:.2f}")
    from .plots import plot_curves  # matplotlib, only once there is something to plot

    curves = plot_curves(read_metrics(trainer.out_dir / "metrics.jsonl"), trainer.out_dir / "curves.png",
                         title=run_title(cfg))
    p = trainer.progress
    record = results_record(to_dict(cfg), splits=splits, best_step=p["best_step"], updates=p["step"],
                            epochs=trainer.epoch_number(), complete_epochs=p["epoch"],
                            train_seconds=p["train_seconds"], model=average and f"average of "
                            f"last {average} checkpoints" or "best.pt", curves=curves.name,
                            parameters=sum(t.numel() for t in model.parameters()), runtime=runtime.describe())
    atomic_write_json(trainer.out_dir / "results.json", record)
    return record


def summarize(record: dict, out_dir: Path) -> None:
    """The closing lines on stdout: BLEU per test split, where training stopped, the files written."""
    cfg = record["config"]
    tests = ", ".join(f"{split} BLEU {record['splits'][split]['bleu']:.2f}" for split in cfg["data"]["test_splits"])
    print(f"{run_title(cfg)}: {tests} ({record['model']}, update {record['best_step']}); "
          f"{record['updates']} updates in {record['epochs']} epoch(s), {record['train_seconds']:.0f} s of training")
    splits = [cfg["data"]["valid_split"], *cfg["data"]["test_splits"]]
    console.files_written([out_dir / name for name in ("results.json", record["curves"], "best.pt", "checkpoints",
                                                        "metrics.jsonl", "config.json")]
                          + [out_dir / f"{split}.hyp.txt" for split in splits])

