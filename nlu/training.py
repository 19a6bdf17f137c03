"""Fine-tuning on a GLUE task over several seeds: the work behind ``python -m nlu.train`` (which checks the config
before torch and transformers are imported). BERT's recipe, as ``transformers``' ``run_glue`` has it: AdamW, a linear
warm-up and decay, clipping, ``train.accumulation`` batches per update; the loss is the cross-entropy (STS-B: squared
error) + ``kl.weight * f(update) * KL`` (detached where ``kl.detach``: the BAM authors' code). The dev set is scored
after every epoch and the last update, which is reported (no selection on dev). The files of a run: docs/nlu.md."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List

import torch
from omegaconf import DictConfig

from common import attention
from common.text.batching import epoch_batches
from common.training import Plan, Task, TrainState, seeds_record, train_seeds
from common.utils import atomic_write_json, console, seed_everything
from common.utils.config import note_deviations, to_dict
from common.utils.runtime import DeviceError, Runtime

from .config import RESUMABLE_KEYS, default_out_dir, deviations, run_label
from .data import GlueFormatError
from .model import GlueData, attention_dropout, collate, load_classifier, parameter_groups, task_loss
from .predict import evaluate
from .pretrained import PretrainedError, resolve_model

#: Errors that end a run with a one-line message (exit status 2).
RUN_ERRORS = (GlueFormatError, PretrainedError, DeviceError, ValueError, FileNotFoundError)


class GlueTask(Task):
    """One seed's fine-tuning for :class:`common.training.Engine`: AdamW with a linear warm-up and decay, updates of
    ``train.accumulation`` batches, the task loss (+ the weighted KL, detached where ``kl.detach``), clipping, and
    the dev metrics after every epoch and the last update."""

    saved = ("last",)

    def __init__(self, cfg: DictConfig, data: GlueData, model_dir: Path, seed: int, run_dir: Path, runtime: Runtime):
        self.cfg, self.data, self.seed, self.runtime, self.dir = cfg, data, seed, runtime, run_dir
        seed_everything(seed)
        options = {"normalizer": cfg.attention.name, "normalizer_options": dict(cfg.attention.options)}
        model, missing = load_classifier(model_dir, data.spec, options, attention_dropout(cfg.attention))
        added = [name for name, _ in model.named_parameters() if ".attend." in name]  # the normalizer's own
        self.new_keys = missing + added
        self.model = model.to(runtime.device)
        self.optimizer = torch.optim.AdamW(parameter_groups(self.model, cfg.optim.weight_decay), lr=cfg.optim.lr)
        self.empty_epoch = (f"{data.spec.name} has no training example", "check the train split")
        self.per_epoch = math.ceil(len(data.train) / (cfg.train.batch_size * cfg.train.accumulation))
        self.total = cfg.train.max_updates or self.per_epoch * cfg.train.epochs
        warmup = cfg.optim.warmup_updates
        from transformers import get_linear_schedule_with_warmup

        self.scheduler = get_linear_schedule_with_warmup(
            self.optimizer, math.ceil(cfg.optim.warmup_ratio * self.total) if warmup is None else warmup, self.total)
        self.max_grad_norm = cfg.optim.max_grad_norm
        self.kl = attention.KLSchedule.from_config(cfg.kl)
        self.last = {"loss": torch.tensor(float("nan")), "kl": torch.tensor(0.0)}

    def updates(self, epoch: int) -> List[List[List[int]]]:
        """The updates of ``epoch``, each ``train.accumulation`` batches: a function of the seed and the epoch only,
        so a resumed epoch replays them."""
        train = self.cfg.train
        batches = epoch_batches(self.data.train.lengths, train.batch_size, self.seed, epoch, train.bucket)
        return [batches[i:i + train.accumulation] for i in range(0, len(batches), train.accumulation)]

    def train_step(self, update: List[List[int]], state: TrainState) -> Dict[str, torch.Tensor]:
        """One update over the batches of ``update``: their mean loss and KL."""
        data, kl_weight = self.data, self.kl(state.step)
        losses, kls = [], []
        for indices in update:
            batch = self.runtime.to_device(collate(data.tokenizer, data.train, indices, data.spec.regression))
            labels = batch.pop("labels")
            with self.runtime.autocast(), attention.aux_losses() as aux:
                loss = task_loss(self.model(**batch).logits, labels, data.spec.regression)
                kl = aux.total().to(loss.device)
                if kl_weight > 0 and len(aux):
                    loss = loss + kl_weight * (kl.detach() if self.cfg.kl.detach else kl)
            self.runtime.backward(loss / len(update))
            losses.append(loss.detach())
            kls.append(kl.detach())
        self.last = {"loss": torch.stack(losses).mean(), "kl": torch.stack(kls).mean()}
        return {"train/loss": self.last["loss"], "train/kl": self.last["kl"]}

    def evaluate(self, state: TrainState) -> Dict[str, float]:
        """The dev metrics (``dev/<metric>``), and the last update's loss (the learning curve's)."""
        dev = evaluate(self.model, self.data, self.runtime, self.cfg.train.eval_batch_size)
        return {**{f"dev/{name}": value for name, value in dev.items()}, "loss": float(self.last["loss"])}

    def record(self, state: TrainState) -> dict:
        """The last evaluation's dev scores (and the MC-averaged ones for a stochastic normalizer)."""
        mc = self.cfg.train.mc_samples if attention.is_stochastic(self.cfg.attention.name) else 0
        curve = [{"epoch": row["epoch"], "step": row["step"], "loss": row["loss"],
                  "dev": {key[4:]: value for key, value in row.items() if key.startswith("dev/")}}
                 for row in state.history]
        record = {"seed": self.seed, "updates": state.step, "updates_per_epoch": self.per_epoch,
                  "train_seconds": state.train_seconds, "dev": curve[-1]["dev"], "curve": curve,
                  "new_parameters": self.new_keys}
        if mc:
            record["dev_mc"] = evaluate(self.model, self.data, self.runtime, self.cfg.train.eval_batch_size, mc)
            record["mc_samples"] = mc
        return record


def run(cfg: DictConfig, progress: bool = True) -> dict:
    """Fine-tune ``cfg.seeds`` seeds (reusing finished ones) and write ``results.json``; the record."""
    runtime = Runtime.from_config(cfg)
    model_dir = resolve_model(str(cfg.model))
    data = GlueData.load(cfg, model_dir)
    out_dir, label, differs = default_out_dir(cfg), run_label(cfg), deviations(cfg)
    console.say(f"{data.spec.name} {label}: {len(data.train)} training and {len(data.dev)} dev examples, "
                f"{model_dir.name}, on {runtime.device}")
    note_deviations(f"--preset {cfg.preset}", differs)
    per_seed = train_seeds(out_dir, to_dict(cfg), RESUMABLE_KEYS, range(cfg.first_seed, cfg.first_seed + cfg.seeds),
                           runtime, lambda seed, run_dir: GlueTask(cfg, data, model_dir, seed, run_dir, runtime),
                           lambda task: Plan(max_epochs=math.ceil(task.total / task.per_epoch), max_updates=task.total,
                                             log_every=10, checkpoint_every=cfg.train.checkpoint_every),
                           lambda record: "dev " + ", ".join(f"{key} {v:.2f}" for key, v in record["dev"].items())
                           + f", {record['train_seconds']:.0f} s", progress,
                           desc=f"{data.spec.name} {label} seeds")
    record = seeds_record(to_dict(cfg), per_seed, ("dev", "dev_mc"), task=data.spec.name, model=str(model_dir),
                          normalizer=cfg.attention.name, preset=cfg.preset, preset_deviations=differs, label=label,
                          main_metric=data.spec.main_metric, runtime=runtime.describe(),
                          examples={"train": len(data.train), "dev": len(data.dev)})
    atomic_write_json(out_dir / "results.json", record)
    return record
