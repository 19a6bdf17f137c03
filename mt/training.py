"""Training a translation model: the work behind ``python -m mt.train`` (which checks the config before this
module is imported). The loss is the label-smoothed cross-entropy per target token (+ the weighted BAM KL), under
Adam, an inverse-square-root or plateau-halving learning rate (:mod:`mt.schedule`) and clipping; every
``train.eval_every`` updates a validation (perplexity, greedy BLEU) keeps ``best.pt``, and the end scores it with
beam search (:mod:`mt.results`). Under ``torchrun`` an update is the mean token loss over a round of
``world_size * batching.update_freq`` token batches, so N processes follow one with ``update_freq`` N times larger
(docs/mt.md)."""
from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from common import attention
from common.training import Engine, Plan, Task, TrainState
from common.utils import atomic_save, console, seed_everything
from common.utils.distributed import barrier, global_count, main_first, round_robin, share_of_mean, wrap_model
from common.utils.runtime import Runtime
from common.utils.updates import check_updates

from .batching import Batch, collate, token_batches
from .config import RESUMABLE_KEYS, to_dict
from .data import ensure_prepared, load_split
from .results import epochs, finish, run_title
from .run import RunFiles, new_model
from .schedule import LRSchedule
from .validation import validate

#: With ``train.compile=reduce-overhead`` batch lengths are rounded up to a multiple of this: fewer shapes, each
#: recorded once as a CUDA graph.
LENGTH_MULTIPLE = 16


def batch_loss(model, batch: Batch, pad: int, label_smoothing: float, kl_weight: float,
               total_tokens: Optional[int] = None, replicas: int = 1) -> Dict[str, torch.Tensor]:
    """Label-smoothed CE (+ weighted KL) of ``batch``, as its share of an update's mean token loss: alone
    (``total_tokens`` None) the mean per target token; in a round of ``replicas`` data-parallel batches of
    ``total_tokens`` target tokens, :func:`~common.utils.distributed.share_of_mean` of its sums."""
    with attention.aux_losses() as aux:
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
    tokens = batch.tgt_out.ne(pad).sum()
    ce_sum = F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=pad,
                             label_smoothing=label_smoothing, reduction="sum")
    kl = aux.total()
    loss = share_of_mean(ce_sum + kl_weight * kl * tokens, tokens if total_tokens is None else total_tokens, replicas)
    return {"loss": loss, "ce_sum": ce_sum, "kl": kl, "tokens": tokens}


class TranslationTask(Task):
    """One translation run for :class:`common.training.Engine`: Adam, an epoch's rounds of token batches, the
    token-weighted loss under the LR and KL schedules, span clamping, and validation on the main process with
    ``best.pt`` kept by ``train.select``."""

    sum_dtype = torch.float32  # the logged sums in float32, as before the engine: the same training logs
    saved = ("schedule", "logged_seconds")

    def __init__(self, cfg: DictConfig, out_dir: Path, data_root: Path, runtime: Runtime):
        self.cfg, self.dir, self.runtime, self.env = cfg, out_dir, runtime, runtime.env
        seed_everything(cfg.seed)
        with main_first(self.env):  # the main process tokenises and caches; the others then read the cache
            self.prepared = ensure_prepared(cfg.dataset, data_root, cfg.prepared_dir, cfg.data.num_merges,
                                            progress=lambda m: print(m, file=sys.stderr))
        self.src_pad, self.tgt_pad = self.prepared.src_vocab.pad, self.prepared.tgt_vocab.pad
        self.train_data = load_split(self.prepared, cfg.data.train_split, cfg.data.max_len)
        # every pair lands in a batch (token_batches refuses a pair over the budget): no pair, no update
        within = f" with both sides within data.max_len={cfg.data.max_len} BPE units" if cfg.data.max_len else ""
        check_updates(len(self.train_data), f"data.train_split {cfg.data.train_split!r} has no pair{within}",
                      "raise data.max_len (null keeps every pair)" if within else
                      "prepare a dataset with training pairs")
        self.valid_data = load_split(self.prepared, cfg.data.valid_split)
        if self.env.is_main:
            RunFiles.write(out_dir, to_dict(cfg), self.prepared, RESUMABLE_KEYS)
        barrier(self.env)
        self.model = new_model(to_dict(cfg), self.prepared.src_vocab, self.prepared.tgt_vocab).to(runtime.device)
        self.ddp = wrap_model(self.model, self.env)  # the model itself when there is one process
        self.forward = runtime.compile(self.ddp)
        o, s = cfg.optim, cfg.schedule
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                                          weight_decay=o.weight_decay)
        self.schedule = LRSchedule(self.optimizer, s.kind, o.lr, s.warmup, s.plateau_factor, s.plateau_start)
        self.kl = attention.KLSchedule.from_config(cfg.kl)
        self.max_grad_norm = o.clip_norm
        self.logged_seconds = 0.0  # the training seconds at the last log

    def updates(self, epoch: int) -> List[Tuple[List[List[int]], List[int]]]:
        """The rounds of ``epoch``: this process's token batches of each (``batching.update_freq`` of the round's
        ``world_size`` times as many) and the round's last batch, the fallback of a process left without one."""
        b = self.cfg.batching
        batches = token_batches(self.train_data.src_lengths, self.train_data.tgt_lengths, b.max_tokens,
                                b.max_sentences, shuffle=True, seed=self.cfg.seed, epoch=epoch)
        return [(mine, batches[end - 1]) for end, mine in round_robin(batches, self.env, per_process=b.update_freq)]

    def collate(self, indices: List[int]) -> Batch:
        return collate(self.train_data.src, self.train_data.tgt, indices, self.src_pad, self.tgt_pad,
                       LENGTH_MULTIPLE if self.runtime.fixed_shapes else 1)

    def before_update(self, state: TrainState) -> None:
        """Set the learning rate of the coming update."""
        self.schedule.before_update(state.step + 1)

    def train_step(self, update: Tuple[List[List[int]], List[int]], state: TrainState) -> Dict[str, torch.Tensor]:
        """Gradients accumulated over this process's batches of the round (DDP synchronises on the last one only);
        a process left without a batch runs the fallback batch weighted zero, so that DDP's all-reduce still meets
        and no pair counts twice. The sums of CE, KL and target tokens, to log per token."""
        runtime, env = self.runtime, self.env
        mine, fallback = update
        kl_weight = self.kl(state.step + 1)
        batches = [self.collate(indices) for indices in mine]
        tokens = sum(int(batch.tgt_out.ne(self.tgt_pad).sum()) for batch in batches)
        total = global_count(tokens, env, runtime.device)
        weight = 1.0
        if not batches:
            batches, weight = [self.collate(fallback)], 0.0
        sums: Dict[str, torch.Tensor] = {}
        for i, batch in enumerate(batches):
            synchronised = i == len(batches) - 1 or not env.distributed
            with nullcontext() if synchronised else self.ddp.no_sync():
                with runtime.autocast():
                    out = batch_loss(self.forward, runtime.to_device(batch), self.tgt_pad,
                                     self.cfg.optim.label_smoothing, kl_weight, total, env.world_size)
                out = {key: value * weight for key, value in out.items()}
                runtime.backward(out["loss"])
            kl, n = out["kl"].detach(), out["tokens"].detach()
            values = {"ce_sum": out["ce_sum"].detach(), "weighted_kl": kl_weight * kl * n, "kl": kl * n, "tokens": n}
            sums = {key: sums[key] + value if key in sums else value for key, value in values.items()}
        return sums

    def after_update(self, state: TrainState) -> None:
        attention.clamp_spans(self.model)

    def window_values(self, sums: Dict[str, float], updates: int, state: TrainState) -> Dict[str, float]:
        """The training loss, CE and KL per target token of the window (over every process), the learning rate,
        the KL weight and the target tokens per second of training since the last window."""
        seconds, self.logged_seconds = state.train_seconds - self.logged_seconds, state.train_seconds
        return {**self.epoch_values(sums, updates, state), "lr": self.schedule.lr(state.step),
                "kl_weight": self.kl(state.step), "tokens_per_second": sums["tokens"] / seconds,
                "epoch": state.epoch + 1}

    def epoch_values(self, sums: Dict[str, float], updates: int, state: TrainState) -> Dict[str, float]:
        """The training loss, CE and KL per target token."""
        tokens = max(sums["tokens"], 1.0)
        return {"train/loss": (sums["ce_sum"] + sums["weighted_kl"]) / tokens, "train/ce": sums["ce_sum"] / tokens,
                "train/kl": sums["kl"] / tokens}

    def evaluate(self, state: TrainState) -> Dict[str, float]:
        """Validation perplexity and greedy BLEU, on the main process."""
        if not self.env.is_main:
            return {}
        start = time.perf_counter()
        metrics = validate(self.model, self.prepared, self.valid_data, self.cfg, self.runtime)
        return {**metrics, "train_seconds": state.train_seconds, "val_seconds": time.perf_counter() - start}

    def score(self, metrics) -> float:
        return metrics["val/bleu"] if self.cfg.train.select == "bleu" else -metrics["val/loss"]

    def judge(self, metrics, state: TrainState) -> Tuple[bool, Optional[float]]:
        """The plateau schedule sees the validation (on every process); the best so far resets the patience."""
        self.schedule.after_validation(metrics["val/ppl"])
        resets, best = super().judge(metrics, state)
        if self.env.is_main:
            console.say(f"update {state.step} epoch {epochs(state)}: val ppl {metrics['val/ppl']:.2f} greedy BLEU "
                        f"{metrics['val/bleu']:.2f}{' (best)' if resets else ''} | lr "
                        f"{self.schedule.lr(max(state.step, 1)):.2e} | {state.train_seconds:.0f}s training")
        return resets, best

    def on_best(self, state: TrainState) -> None:
        row = state.history[-1]
        atomic_save({"model": self.model.state_dict(), "step": state.step, "val_bleu": row["val/bleu"],
                     "val_loss": row["val/loss"]}, self.dir / "best.pt")


def train(cfg: DictConfig, out_dir: Path, data_root: Path, runtime: Runtime) -> Optional[dict]:
    """Train (resuming from the newest checkpoint) until ``max_steps``, ``max_epochs``, ``max_minutes`` or the
    patience runs out, the last update validated; then score it (:func:`~mt.results.finish`): the record on the
    main process, None on the others."""
    t = cfg.train
    task = TranslationTask(cfg, out_dir, data_root, runtime)
    plan = Plan(max_epochs=t.max_epochs, max_updates=t.max_steps, max_minutes=t.max_minutes, patience=t.patience,
                eval_every=t.eval_every, checkpoint_epochs=False, log_every=t.log_every, keep=t.keep_checkpoints)
    state = Engine(runtime, out_dir, plan, progress=t.progress, label=run_title(cfg)).fit(task)
    return finish(cfg, out_dir, task.prepared, state, runtime) if runtime.env.is_main else None
