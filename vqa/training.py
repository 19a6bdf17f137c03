"""Training MCAN: the work behind ``python -m vqa.train`` (which checks the config before this module, torch and
the model are imported). The protocol of ``MILVLG/mcan-vqa`` (``core/exec.py``): BCE summed over the batch and the
answers on MCAN's soft scores (+ the weighted BAM KL), MCAN's Adam and learning rate (:mod:`vqa.mcan.optim`); after
every epoch a checkpoint and, where ``data.eval_split`` has annotations, its accuracy. The files: docs/vqa.md."""
from __future__ import annotations

import time
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.utils.data import BatchSampler, DistributedSampler

from common import attention
from common.training import Engine, EpochBatches, Plan, Task, TrainState
from common.utils import Checkpointer, atomic_write_json, console, results_record, seed_everything
from common.utils.distributed import all_reduce_mean, cleanup, shard_sampler, wrap_model
from common.utils.runtime import Runtime

from .answers import answers_of
from .config import default_out_dir, to_dict
from .evaluation import vqa_accuracy, write_submission
from .mcan.optim import build_optimizer
from .predict import build_model, predict_logits
from .run_inputs import load_run_data, save_run, word_vectors

#: The keys of an evaluation row that ``results.json`` keeps for each epoch.
EPOCH_KEYS = ("train_bce_per_question", "train_kl", "seconds", "lr", "eval")


class MCANTask(Task):
    """MCAN for :class:`common.training.Engine`: Adam with MCAN's warm-up and decay per update, the summed BCE
    (+ weighted KL) of each epoch's shuffled batches, and after each epoch the eval split's accuracy."""

    def __init__(self, cfg: DictConfig, runtime: Runtime, progress: bool):
        self.cfg, self.runtime, self.progress, env = cfg, runtime, progress, runtime.env
        self.dir = out_dir = default_out_dir(cfg)
        fresh = not Checkpointer(out_dir).paths()  # a resumed model gets its embeddings from the checkpoint
        vocab, self.answers, self.train_set, self.eval_loader, self.eval_annotations = load_run_data(
            cfg, out_dir, runtime, fresh)
        self.predictions: Dict[int, str] = {}  # the last evaluation's
        vectors = word_vectors(cfg, vocab, env) if cfg.data.glove and fresh else None
        self.model = build_model(cfg, len(vocab), len(self.answers), vectors).to(env.device)
        self.collect_kl = cfg.kl.weight > 0
        if not self.collect_kl:
            attention.freeze_priors(self.model)
        steps_per_epoch = max(1, len(self.train_set) // (cfg.train.batch_size * env.world_size))
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, steps_per_epoch)
        self.max_grad_norm = cfg.optim.grad_clip or 0.0
        self.net = runtime.compile(wrap_model(self.model, env))
        self.kl = attention.KLSchedule.from_config(cfg.kl)
        # One process reads the same permutation as the shards of N processes put together, so a
        # run on N processes with batch B sees the global batches of one process with batch N * B.
        self.sampler = shard_sampler(self.train_set, env, shuffle=True, seed=cfg.seed) or DistributedSampler(
            self.train_set, num_replicas=1, rank=0, shuffle=True, seed=cfg.seed)
        if env.is_main:
            save_run(cfg, out_dir, vocab, self.answers)

    def updates(self, epoch: int) -> EpochBatches:
        """This process's batches of ``epoch`` (its shard of the seed's permutation), the last partial one dropped."""
        self.sampler.set_epoch(epoch)
        return EpochBatches(list(BatchSampler(self.sampler, self.cfg.train.batch_size, drop_last=True)),
                            self.train_set, self.train_set.datasets[0].collate, self.cfg.train.num_workers,
                            self.runtime.pin_memory)

    def train_step(self, batch: Dict, state: TrainState) -> Dict[str, torch.Tensor]:
        batch, runtime = self.runtime.to_device(batch), self.runtime
        with runtime.autocast(), attention.aux_losses(self.collect_kl) as aux:
            logits = self.net(batch["question_tokens"], batch["question_mask"], batch["features"], batch["region_mask"])
        kl, kl_weight = (aux.total(), self.kl(state.step)) if self.collect_kl else \
            (torch.zeros((), device=runtime.device), 0.0)
        bce = F.binary_cross_entropy_with_logits(logits.float(), batch["target"], reduction="sum")
        # DDP averages gradients over processes: scale the summed BCE so the update is that of
        # the BCE summed over the global batch, as MCAN's single-process loss.
        runtime.backward(bce * runtime.env.world_size + kl_weight * kl)
        self.last = {"train/bce": bce.detach() / batch["target"].shape[0], "train/kl": kl.detach(),
                     "train/kl_weight": kl_weight}
        return {"bce": bce.detach(), "kl": kl.detach() * batch["target"].shape[0]}

    def after_update(self, state: TrainState) -> Optional[Dict[str, float]]:
        """Every ``train.log_every`` updates: that update's BCE per question and KL (means over the processes),
        its KL weight and the learning rate."""
        if state.step % self.cfg.train.log_every:
            return None
        env = self.runtime.env
        return {"train/bce": all_reduce_mean(self.last["train/bce"], env),
                "train/kl": all_reduce_mean(self.last["train/kl"], env),
                "train/kl_weight": self.last["train/kl_weight"], "train/lr": self.scheduler.get_last_lr()[0]}

    def epoch_values(self, sums: Dict[str, float], updates: int, state: TrainState) -> Dict[str, float]:
        """The epoch's BCE per question, KL weighted by batch size, and seconds of training."""
        questions = updates * self.cfg.train.batch_size
        self.trained = {"train_bce_per_question": sums["bce"] / questions, "train_kl": sums["kl"] / questions,
                        "seconds": state.train_seconds - sum(row["seconds"] for row in state.history)}
        return self.trained

    def evaluate(self, state: TrainState) -> Dict:
        """The learning rate and, on the main process where the eval split has annotations, its accuracy (``eval``;
        ``val/*`` for the log) and predictions; the main process prints the epoch's line."""
        metrics = {"lr": self.scheduler.get_last_lr()[0]}
        if self.eval_loader is not None:
            ids, logits = predict_logits(self.model, self.eval_loader, self.runtime, progress=self.progress,
                                         desc="eval")
            self.predictions = answers_of(ids, logits, self.answers)
            metrics["eval"] = accuracy = vqa_accuracy(self.eval_annotations, self.predictions).summary()
            metrics.update({"val/accuracy": accuracy["overall"],
                            **{f"val/{k}": v for k, v in accuracy["per_answer_type"].items()}})
        if self.runtime.env.is_main:
            console.say(f"epoch {state.epoch}/{self.cfg.train.epochs}: train BCE/question "
                        f"{self.trained['train_bce_per_question']:.4f}, {self.trained['seconds']:.0f} s"
                        + (f", {self.cfg.data.eval_split} accuracy {metrics['eval']['overall']:.2f}"
                           if "eval" in metrics else ""))
        return metrics


def run(cfg: DictConfig, progress: bool = True) -> Dict:
    """Train (or resume) the run described by ``cfg``; returns the results record."""
    runtime = Runtime.from_config(cfg, distributed=True)
    env = runtime.env
    seed_everything(cfg.seed + env.rank, deterministic=cfg.train.deterministic)
    task, start = MCANTask(cfg, runtime, progress), time.perf_counter()
    try:
        state = Engine(runtime, task.dir, Plan(max_epochs=cfg.train.epochs, keep=2), desc="MCAN update",
                       progress=progress).fit(task)
    finally:
        del task.net  # DDP goes before its process group
        cleanup(env)
    if task.predictions and env.is_main:
        write_submission(task.dir / f"{cfg.data.eval_split}_predictions.json", task.predictions)
    epochs = [{"epoch": row["epoch"] - 1, **{key: row[key] for key in EPOCH_KEYS if key in row}}
              for row in state.history]
    train_seconds = state.train_seconds  # every epoch's, resumed ones included
    checkpoints = Checkpointer(task.dir).paths()
    questions = state.step * cfg.train.batch_size * env.world_size
    results = results_record(
        to_dict(cfg), attention=cfg.attention.name, epochs=epochs,
        final_eval=epochs[-1].get("eval") if epochs else None,
        questions_per_second_train=questions / train_seconds if train_seconds else None, train_seconds=train_seconds,
        wall_seconds_this_run=time.perf_counter() - start, world_size=env.world_size, runtime=runtime.describe(),
        checkpoint=str(checkpoints[-1]) if checkpoints else None)
    if env.is_main:
        atomic_write_json(task.dir / "results.json", results)
    return results
