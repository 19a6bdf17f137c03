"""Training GATs over several seeds: the work behind ``python -m graphattn.train`` (which checks the config
before this module, torch and PyG are imported). :class:`GATTask` is the original GAT code's protocol (PetarV-/GAT
``execute_cora.py``): full-batch Adam; after every epoch the validation loss and accuracy; ``patience`` epochs
without either improving stop it, and the last epoch that improved both is tested (``--loader neighbor``:
:mod:`graphattn.minibatch`). Checkpoints only on Ctrl-C and at the end (Cora's epochs take 10 ms). The files of a
run: docs/graphattn.md."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from common import attention
from common.training import Plan, Task, TrainState, seeds_record, train_seeds
from common.utils import atomic_save, atomic_write_json, seed_everything
from common.utils.config import note_deviations
from common.utils.distributed import cleanup, global_count, main_first, share_of_mean, wrap_model
from common.utils.runs import mean_std
from common.utils.runtime import DeviceError, Runtime

from . import layerwise, minibatch
from .config import RESUMABLE_KEYS, default_out_dir, deviations, to_dict
from .models import build_model, prepare_features, split_metrics

if TYPE_CHECKING:
    from torch_geometric.data import Data


class GATTask(Task):
    """One seed of a GAT for the :class:`~common.training.Engine`: Adam; an epoch is one update on the whole graph
    or one per sampled batch (:class:`~graphattn.minibatch.NeighborBatches`, under ``torchrun`` too); CE + the
    epoch's KL weight x the BAM KL; the validation loss and accuracy after every epoch, judged by :meth:`judge`."""

    saved = ("best",)

    def __init__(self, cfg: DictConfig, data: Data, seed: int, run_dir: Path, runtime: Runtime):
        self.cfg, self.data, self.seed, self.dir, self.runtime = cfg, data, seed, run_dir, runtime
        self.env = runtime.env
        seed_everything(seed, deterministic=cfg.train.deterministic)
        self.model = build_model(cfg, data.num_features, data.num_classes).to(runtime.device)
        if cfg.kl.weight <= 0:
            attention.freeze_priors(self.model)
        self.forward = runtime.compile(wrap_model(self.model, self.env))
        self.batches = None  # the whole graph
        if cfg.loader.kind == "neighbor":
            cpu = data if data.x.device.type == "cpu" else data.clone().cpu()  # the sampler runs on the CPU
            self.batches = minibatch.NeighborBatches(cpu, cfg.loader.num_neighbors, cfg.loader.batch_size, self.env,
                                                     seed, cfg.loader.num_workers)
            self.eval_loader = layerwise.inference_loader(cpu, cfg.loader.eval_batch_size, cfg.loader.num_workers)
        self.x = data.x if self.batches else prepare_features(data, cfg)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.optim.lr,
                                          weight_decay=cfg.optim.weight_decay)
        self.schedule = attention.KLSchedule.from_config(cfg.kl)
        self.best = {"acc": -math.inf, "loss": math.inf, "weights": None}  # the rule's two bests, the snapshot

    def kl_weight(self, epoch: int) -> float:
        return self.schedule(epoch) if self.cfg.kl.weight > 0 else 0.0

    def updates(self, epoch: int) -> Sequence[Optional[Data]]:
        """The whole graph once, or this process's share of each sampled batch of ``epoch``."""
        return self.batches.epoch(epoch) if self.batches else [None]

    def train_step(self, update: Optional[Data], state: TrainState) -> Dict[str, torch.Tensor]:
        """CE + weighted KL of the training nodes (a batch's seeds) and backward; the whole graph logs its values,
        a sampled batch their sums over its seeds (:meth:`window_values` makes the epoch's means)."""
        if self.batches:
            batch = update.to(self.runtime.device)
            x, edge_index, rows, y = batch.x, batch.edge_index, slice(batch.batch_size), batch.y[:batch.batch_size]
        else:
            x, edge_index, rows = self.x, self.data.edge_index, self.data.train_mask
            y = self.data.y[rows]
        collect = self.cfg.kl.weight > 0  # without a collector the BAM layers skip the KL entirely
        with self.runtime.autocast(), attention.aux_losses(collect) as aux:
            logits = self.forward(x, edge_index)[rows].float()
        kl = self.model.kl(aux, self.cfg.kl.reduction) if collect else torch.zeros((), device=logits.device)
        correct, kl_weight = logits.detach().argmax(-1) == y, self.kl_weight(state.epoch)
        if not self.batches:
            ce = F.cross_entropy(logits, y)
            loss = ce + kl_weight * kl
            self.runtime.backward(loss)
            return {"train/loss": loss, "train/ce": ce, "train/acc": correct.float().mean(), "train/kl": kl}
        count = global_count(y.numel(), self.env, self.runtime.device)
        self.runtime.backward(share_of_mean(F.cross_entropy(logits, y, reduction="sum"), count, self.env.world_size)
                              + kl_weight * kl)
        return {"ce": F.cross_entropy(logits.detach(), y, reduction="sum"), "correct": correct.sum(),
                "seeds": y.numel(), "kl": kl}

    def window_values(self, sums: Dict[str, float], updates: int, state: TrainState) -> Dict[str, float]:
        """The epoch's training values and KL weight; of sampled batches, the CE and accuracy over every
        process's seeds and the KL over updates."""
        kl_weight = self.kl_weight(state.epoch)
        if self.batches:
            ce, kl, seeds = sums["ce"] / max(sums["seeds"], 1), sums["kl"] / max(updates, 1), max(sums["seeds"], 1)
            sums, updates = {"train/loss": ce + kl_weight * kl, "train/ce": ce, "train/acc": sums["correct"] / seeds,
                             "train/kl": kl}, 1
        return {**super().window_values(sums, updates, state), "train/kl_weight": kl_weight}

    @torch.no_grad()
    def predict(self) -> torch.Tensor:
        """Eval-mode logits of every node (with sampled batches: layer-wise over full neighbourhoods)."""
        self.model.eval()
        with self.runtime.autocast():
            if self.batches:
                return self.model.inference(self.x, self.eval_loader, self.env)
            return self.forward(self.x, self.data.edge_index)

    def evaluate(self, state: TrainState) -> Dict[str, float]:
        val = split_metrics(self.predict(), self.data.y, self.data.val_mask)
        return {"val/loss": val["loss"], "val/acc": val["acc"]}

    def judge(self, metrics, state: TrainState):
        """The original GAT rule: the patience resets when the validation accuracy or loss is at least as good as
        its best so far; the weights are kept when both are (then the accuracy is the best score)."""
        acc, loss, best = metrics["val/acc"], metrics["val/loss"], self.best
        if not (acc >= best["acc"] or loss <= best["loss"]):
            return False, None
        snapshot = acc >= best["acc"] and loss <= best["loss"]
        if snapshot:  # on every process: each tests the snapshot at the end
            best["weights"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        best["acc"], best["loss"] = max(best["acc"], acc), min(best["loss"], loss)
        return True, acc if snapshot else None

    def progress_postfix(self, state: TrainState) -> Dict[str, str]:
        patience = self.cfg.train.patience
        return {"val_acc": f"{state.history[-1]['val/acc']:.3f}", "best_val_acc": f"{self.best['acc']:.3f}",
                "patience_left": f"{patience - state.bad}/{patience}"}

    def record(self, state: TrainState) -> dict:
        """The snapshot's validation and test metrics, and its epoch (``best_epoch``, from 0); the main process
        writes ``seed<k>.pt`` beside the run directory ``seed<k>/``: the snapshot's weights, the config, the
        metrics and the per-epoch history."""
        self.model.load_state_dict(self.best["weights"])
        logits, data = self.predict(), self.data
        metrics = {"seed": self.seed, "epochs": state.epoch, "best_epoch": state.best_step // len(self.updates(0)) - 1,
                   "train_seconds": state.train_seconds, "val": split_metrics(logits, data.y, data.val_mask),
                   "test": split_metrics(logits, data.y, data.test_mask)}
        if self.env.is_main:
            atomic_save({"model_state": self.best["weights"], "config": to_dict(self.cfg), "metrics": metrics,
                         "history": state.history}, self.dir.with_suffix(".pt"))
        return metrics


def plan_of(cfg: DictConfig) -> Plan:
    """The original GAT's: an evaluation per epoch, checkpoints only at the end and on Ctrl-C."""
    return Plan(max_epochs=cfg.train.max_epochs, patience=cfg.train.patience, checkpoint_epochs=False,
                checkpoint_evals=False)


def run(cfg: DictConfig, progress: bool = True, data: Optional[Data] = None) -> Optional[Dict]:
    """Train every seed of ``cfg`` (reusing finished seeds) and write ``results.json``; returns its contents.
    Under ``torchrun`` (``loader.kind=neighbor`` only) every process trains each seed on its share of the
    batches; the main process alone writes checkpoints, curves and results (the others return None)."""
    runtime = Runtime.from_config(cfg, distributed=True)
    env, out_dir, start, differs = runtime.env, default_out_dir(cfg), time.perf_counter(), deviations(cfg)
    note_deviations(f"preset={cfg.preset}", differs, enabled=env.is_main)
    try:
        if cfg.loader.kind == "neighbor":  # fail before loading anything
            minibatch.check_fanouts(cfg.loader.num_neighbors, num_layers=2)
            minibatch.require_sampler()
        elif env.distributed:
            raise ValueError(f"full-batch training runs in one process, not {env.world_size}: "
                             f"use --loader neighbor under torchrun")
        if data is None:
            from .data import load_dataset

            with main_first(env):  # the others would read the cache while it is written
                data = load_dataset(cfg.dataset, cfg.data_root)
        data = data.to(runtime.device)
        per_seed = train_seeds(out_dir, to_dict(cfg), RESUMABLE_KEYS, range(cfg.first_seed, cfg.first_seed + cfg.seeds),
                               runtime, lambda seed, run_dir: GATTask(cfg, data, seed, run_dir, runtime), plan_of(cfg),
                               _seed_line, progress, desc=f"{cfg.dataset} {cfg.attention.name} seeds")
    finally:
        cleanup(env)
    if not env.is_main:
        return None
    from .plots import plot_run

    accuracy = {split: [100 * m[split]["acc"] for m in per_seed] for split in ("test", "val")}
    results = seeds_record(
        to_dict(cfg), per_seed, dataset=cfg.dataset, attention=cfg.attention.name, preset=cfg.preset,
        preset_deviations=differs, epochs=[m["epochs"] for m in per_seed],
        **{f"{split}_acc": {**mean_std(values), "per_seed": values} for split, values in accuracy.items()},
        runtime=runtime.describe(), wall_seconds_this_run=time.perf_counter() - start,
        checkpoints=[str(out_dir / f"seed{m['seed']}.pt") for m in per_seed])
    results["plots"] = [str(path) for path in plot_run(out_dir, results, per_seed)]
    atomic_write_json(out_dir / "results.json", results)
    return results


def _seed_line(metrics: Dict) -> str:
    """``test acc 83.10%, val 81.20%, best epoch 120 of 221, 20.3 s`` for the log."""
    return (f"test acc {100 * metrics['test']['acc']:.2f}%, val {100 * metrics['val']['acc']:.2f}%, best epoch "
            f"{metrics['best_epoch'] + 1} of {metrics['epochs']}, {metrics['train_seconds']:.1f} s")


#: What a run can raise that the CLI reports in one line (PlanetoidDataError is a FileNotFoundError).
RUN_ERRORS = (FileNotFoundError, DeviceError, minibatch.SamplerMissing, ValueError)
