"""Fine-tuning LXMERT: the work behind ``python -m vqa.lxmert.train`` (which checks the config before this module,
torch and transformers are imported). Variants (``vqa/configs/lxmert.yaml``): ``softmax``, ``span``, ``entmax``,
``layerdrop``, ``bam``. The loss is LXMERT's ``A * BCE`` on the soft scores of the ``A`` answers + the adaptive-span
penalty + the weighted BAM KL (:func:`common.attention.aux_losses`); spans are clamped to ``[0, 1]`` after every
update; every epoch's end evaluates, with ``layerdrop.<stack>`` layers pruned per stack (every other) where
``model.prune_at_eval``. The files of a run: docs/lxmert.md."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, Optional

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from common import attention
from common.training import Engine, EpochBatches, Plan, Task, TrainState
from common.utils import Checkpointer, atomic_write_json, console, environment, results_record, seed_everything
from common.utils.config import check_resumable, to_dict
from common.utils.runtime import Runtime
from common.utils.updates import full_batches
from vqa.answers import AnswerVocab, answers_of
from vqa.data import data_path
from vqa.evaluation import vqa_accuracy, write_submission

from .config import RESUMABLE_KEYS, default_out_dir
from .data import model_inputs
from .flops import measure_flops
from .model import head_parameters, predict, vqa_loss
from .optim import build_optimizer
from .plots import plot_head_values
from .prepare import (adaptation_of, check_run_inputs, load_data, prepare_model, pretrained_summary,
                      write_run_files)

PACKAGES = ("attention-suite", "torch", "transformers", "torch-optimizer", "entmax", "h5py", "numpy", "omegaconf")


class LxmertTask(Task):
    """LXMERT fine-tuned on VQA for :class:`common.training.Engine`: LXMERT's optimiser and schedule, each epoch's
    batches, the BCE + span penalty + weighted BAM KL, spans clamped and head values logged after the updates,
    and the eval split's accuracy (pruned layers when ``model.prune_at_eval``) at every epoch's end."""

    saved = ("last_bce",)

    def __init__(self, cfg: DictConfig, out_dir: Path, runtime: Runtime, resuming: bool, progress: bool):
        self.cfg, self.runtime, self.progress = cfg, runtime, progress
        check_run_inputs(cfg, resuming)
        self.answers = AnswerVocab.load(out_dir / "answers.json" if resuming else data_path(cfg, cfg.data.answers))
        self.adaptation = adaptation_of(cfg)
        self.train_set, eval_set, self.eval_annotations = load_data(cfg, self.answers)
        self.per_epoch = full_batches(len(self.train_set), cfg.train.batch_size,
                                      f"training questions of data.train_splits {list(cfg.data.train_splits)}")
        # a generator of its own: evaluating draws nothing from the global one (dropout, LayerDrop go on as before)
        self.eval_loader = None if eval_set is None else DataLoader(
            eval_set, batch_size=cfg.train.eval_batch_size, collate_fn=eval_set.collate, pin_memory=runtime.pin_memory,
            num_workers=cfg.train.num_workers, generator=torch.Generator().manual_seed(cfg.seed))
        self.model, self.report = prepare_model(cfg, out_dir, self.answers, resuming)
        self.model.to(runtime.device)
        self.forward = runtime.compile(self.model)
        # AdamW's linear decay spans every epoch
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, self.per_epoch * cfg.train.epochs)
        self.max_grad_norm = cfg.optim.grad_clip or 0.0
        self.kl = attention.KLSchedule.from_config(cfg.kl)
        self.collect = self.adaptation.span is not None or cfg.kl.weight > 0
        self.last_bce: Optional[torch.Tensor] = None  # the BCE of the latest update, reported at evaluations
        self.predictions: Dict[int, str] = {}

    def updates(self, epoch: int) -> EpochBatches:
        """The epoch's full batches, a fixed permutation per seed and epoch (a resumed epoch replays them), loaded
        with a generator of their own (a resumed epoch leaves the training randomness as it was)."""
        order = torch.randperm(len(self.train_set),
                               generator=torch.Generator().manual_seed(self.cfg.seed * 1000 + epoch)).tolist()
        size = self.cfg.train.batch_size
        return EpochBatches([order[i * size:(i + 1) * size] for i in range(len(order) // size)], self.train_set,
                            self.train_set.datasets[0].collate, self.cfg.train.num_workers, self.runtime.pin_memory,
                            lambda: torch.Generator().manual_seed(self.cfg.seed))

    def train_step(self, batch: dict, state: TrainState) -> Dict[str, torch.Tensor]:
        device = self.runtime.device
        target = batch["target"].to(device, non_blocking=True)
        with self.runtime.autocast(), attention.aux_losses(self.collect) as aux:
            logits = self.forward(**model_inputs(batch, device)).question_answering_score
        terms = aux.by_name() if self.collect else {}
        bce = vqa_loss(logits.float(), target)
        span_penalty = terms.get("adaptive_span", torch.zeros((), device=device))
        kl = terms.get("bam_kl", torch.zeros((), device=device))
        loss = bce + span_penalty + self.kl(state.step) * kl
        self.runtime.backward(loss)
        self.last_bce = bce.detach()
        return {"train/loss": loss.detach(), "train/bce": self.last_bce, "train/span_penalty": span_penalty.detach(),
                "train/kl": kl.detach()}

    def initial_values(self) -> Dict[str, float]:
        """The head values (spans, alphas) before the first update: step 0 of their curves."""
        return head_parameters(self.model)

    def after_update(self, state: TrainState) -> Optional[Dict[str, float]]:
        """Spans clamped to ``[0, 1]``; every ``train.log_every`` updates the KL weight, the learning rate and the
        head values, which are also logged at every epoch's end and at the last update."""
        attention.clamp_spans(self.model)
        logged = state.step % self.cfg.train.log_every == 0
        if not (logged or state.batch == self.per_epoch or state.step == self.cfg.train.max_steps):
            return None
        rates = {"train/kl_weight": self.kl(state.step - 1), "train/lr": self.scheduler.get_last_lr()[0]}
        return {**(rates if logged else {}), **head_parameters(self.model)}

    def evaluate(self, state: TrainState) -> Dict:
        """The latest update's BCE and the eval split's accuracy (``eval``: per answer and question type)."""
        metrics = {"train_bce_last": self.last_bce.item()}
        if self.eval_loader is not None:
            ids, logits = predict(self.model, self.eval_loader, self.runtime, self.cfg.model.prune_at_eval,
                                  self.adaptation, self.progress)
            self.predictions = answers_of(ids, logits, self.answers)
            summary = vqa_accuracy(self.eval_annotations, self.predictions).summary()
            metrics.update({"val/accuracy": summary["overall"], "eval": summary})
        console.say(f"epoch {state.epoch + (1 if state.batch else 0)}/{self.cfg.train.epochs} (update {state.step}): "
                    f"train BCE {metrics['train_bce_last']:.4f}" + (
                        f", {self.cfg.data.eval_split} accuracy {metrics['val/accuracy']:.2f}" if "eval" in metrics
                        else ""))
        return metrics


def run(cfg: DictConfig, progress: bool = True) -> Dict:
    """Train (or resume) the run described by ``cfg``; returns its results record."""
    runtime = Runtime.from_config(cfg)
    seed_everything(cfg.seed, deterministic=cfg.train.deterministic)
    out_dir, config = default_out_dir(cfg), to_dict(cfg)
    checkpoints = Checkpointer(out_dir).paths()
    if checkpoints:
        check_resumable(json.loads((out_dir / "config.json").read_text()), config, RESUMABLE_KEYS, out_dir)
    task = LxmertTask(cfg, out_dir, runtime, bool(checkpoints), progress)
    if not checkpoints:
        write_run_files(out_dir, config, task.model, task.answers, task.report)
    start = time.perf_counter()
    plan = Plan(max_epochs=cfg.train.epochs, max_updates=cfg.train.max_steps, log_every=cfg.train.log_every,
                checkpoint_every=cfg.train.checkpoint_every, keep=2)
    state = Engine(runtime, out_dir, plan, desc=f"LXMERT {cfg.variant} update", progress=progress).fit(task)
    plots = {kind: plot_head_values(out_dir / "metrics.jsonl", kind, out_dir / f"{kind}s.png")
             for kind in ("span", "alpha")}
    if task.predictions:
        write_submission(out_dir / f"{cfg.data.eval_split}_predictions.json", task.predictions)
    epochs = [{"epoch": row["epoch"] - 1, **{k: row[k] for k in ("step", "train_bce_last", "eval") if k in row}}
              for row in state.history]  # epochs counted from 0
    flops = measure_flops(task.model, cfg, task.adaptation, runtime.device)
    results = results_record(
        config, variant=cfg.variant, adaptation=task.adaptation.to_dict(), steps=state.step, epochs=epochs,
        final_eval=epochs[-1].get("eval"), flops_per_question=flops,
        parameters=sum(p.numel() for p in task.model.parameters()),
        pretrained=pretrained_summary(out_dir / "pretrained.json"),
        plots={k: str(v) for k, v in plots.items() if v is not None}, train_seconds=state.train_seconds,
        wall_seconds_this_run=time.perf_counter() - start, runtime=runtime.describe(),
        checkpoint=str(Checkpointer(out_dir).paths()[-1]))
    results["environment"]["packages"].update(environment(PACKAGES)["packages"])
    atomic_write_json(out_dir / "results.json", results)
    return results
