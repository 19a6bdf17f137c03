"""Training GATs over several seeds: the work behind ``python -m graphattn.train`` (:mod:`graphattn.train`
parses the command line and checks the config before this module, torch and PyG are imported).

Protocol of the original GAT code (PetarV-/GAT ``execute_cora.py``): full-batch Adam, and after
every epoch the validation loss and accuracy (cross-entropy only, no KL, no dropout). The
patience counter resets whenever validation accuracy *or* loss is at least as good as its
best so far; the weights are snapshotted when *both* are (``val_acc >= best_acc and
val_loss <= best_loss``, the original rule). Training stops after ``patience`` epochs
without improvement and the snapshot is restored for testing.

Each seed writes ``<out_dir>/seed<k>.pt`` (best weights, config, metrics; atomically) and,
through :class:`common.utils.MetricsLogger`, its per-epoch curves to ``<out_dir>/seed<k>/``:
``metrics.jsonl`` (one line per epoch: ``step`` = epoch, ``train/loss`` = CE + weighted KL,
``train/ce``, ``train/acc`` (training mode, with dropout and BAM sampling), ``train/kl`` (the
unweighted KL, combined over layers as ``kl.reduction`` says), ``train/kl_weight``, ``val/loss``, ``val/acc``) and TensorBoard
events (``tensorboard --logdir <out_dir>``). A rerun with the same config reuses the seeds
already done, so an interrupted grid resumes; the curves of an unfinished seed are restarted.
``<out_dir>/results.json`` holds per-seed and mean +- std (sample std, ddof=1) test accuracy,
each seed's training time (kept from the run that trained it; ``train_seconds.total``), the
config and the library versions; ``curves.png`` the learning curves of every seed and
``accuracy.png`` the per-seed accuracies with their mean and spread (:mod:`graphattn.plots`).

The console (:mod:`common.utils.console`) shows a bar per seed that counts epochs up to
``max_epochs`` (``epoch 453 of at most 100000``: early stopping makes the end unknown) with the
validation accuracy, the best so far and the patience left, a line per finished seed, and at
the end the summary and every file written; Ctrl-C stops with
``interrupted at ...; re-run the same command to resume`` (exit status 130).

``--loader neighbor`` (``loader.*`` keys) trains on PyG ``NeighborLoader`` mini-batches instead of the
whole graph, also under ``torchrun`` (one share of every global batch per process), and evaluates by exact
layer-wise inference (:mod:`graphattn.minibatch`); the patience rule is the same, per epoch.

``--device`` (default ``auto``: CUDA when available) and ``train.precision`` / ``train.compile``
choose where and how the model computes (:mod:`common.utils.runtime`); the whole graph lives on
the device. A seed trained on one device is reused on another.
"""
from __future__ import annotations

import math
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from common import attention
from common.utils import (MetricsLogger, atomic_save, atomic_write_json, console, read_metrics, results_record,
                          seed_everything)
from common.utils.config import check_resumable
from common.utils.distributed import all_reduce_sum, broadcast_objects, cleanup, wrap_model
from common.utils.runtime import DeviceError, Runtime

from . import minibatch
from .config import to_dict

if TYPE_CHECKING:  # PyG and the model are imported once the command line and config have been checked
    from torch_geometric.data import Data

    from .models import GAT


def build_model(cfg: DictConfig, num_features: int, num_classes: int) -> GAT:
    """The GAT described by ``cfg.model`` and ``cfg.attention``."""
    from .models import GAT

    return GAT(num_features, num_classes, attention=cfg.attention.name,
               attention_options=dict(cfg.attention.options), **cfg.model)


def prepare_features(data: Data, cfg: DictConfig) -> torch.Tensor:
    """``data.x`` as a sparse CSR matrix when ``train.sparse_features`` (same maths, faster)."""
    if not cfg.train.sparse_features:
        return data.x
    with warnings.catch_warnings():  # "sparse CSR support is in beta": we only use stable ops
        warnings.simplefilter("ignore", UserWarning)
        return data.x.to_sparse_csr()


def runtime_of(cfg: DictConfig) -> Runtime:
    """Device, precision and compilation of a run (``--device``, ``train.precision``, ``train.compile``)."""
    return Runtime.create(cfg.device, cfg.train.precision, cfg.train.compile, threads=cfg.train.num_threads,
                          distributed=True)


def split_metrics(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> Dict[str, float]:
    """Cross-entropy and accuracy of ``logits`` on the nodes of ``mask``."""
    logits = logits[mask].float()
    return {"loss": float(F.cross_entropy(logits, y[mask])),
            "acc": float((logits.argmax(-1) == y[mask]).float().mean())}


@torch.no_grad()
def evaluate_split(model: GAT, x, edge_index, y, mask, runtime: Optional[Runtime] = None) -> Dict[str, float]:
    """Cross-entropy and accuracy on ``mask`` with the model in eval mode (posterior mean)."""
    model.eval()
    with runtime.autocast() if runtime is not None else nullcontext():
        logits = model(x, edge_index)
    return split_metrics(logits, y, mask)


class FullBatch:
    """The whole graph in every step (the paper's transductive protocol): one step per epoch."""

    def __init__(self, cfg: DictConfig, data: Data, forward, runtime: Runtime):
        self.x, self.data, self.forward, self.runtime = prepare_features(data, cfg), data, forward, runtime

    def train_epoch(self, model: GAT, optimizer, kl_weight: float, cfg: DictConfig, epoch: int) -> Dict[str, float]:
        mask, y, collect = self.data.train_mask, self.data.y, cfg.kl.weight > 0
        optimizer.zero_grad(set_to_none=True)
        with self.runtime.autocast(), attention.aux_losses() if collect else nullcontext() as aux:
            # without a collector the BAM layers skip the KL entirely
            logits = self.forward(self.x, self.data.edge_index)[mask].float()
        kl = model.kl(aux, cfg.kl.reduction) if collect else torch.zeros((), device=logits.device)
        ce = F.cross_entropy(logits, y[mask])
        loss = ce + kl_weight * kl
        self.runtime.backward_step(loss, optimizer)
        return {"train/loss": loss.item(), "train/ce": ce.item(),
                "train/acc": (logits.argmax(-1) == y[mask]).float().mean().item(), "train/kl": kl.item()}

    @torch.no_grad()
    def predict(self, model: GAT) -> torch.Tensor:
        """Eval-mode logits of every node."""
        model.eval()
        with self.runtime.autocast():
            return self.forward(self.x, self.data.edge_index)


class NeighborBatches:
    """Mini-batches of seed nodes with sampled neighbourhoods (:mod:`graphattn.minibatch`); under
    ``torchrun`` each process takes its share of every global batch and evaluation is shared too."""

    def __init__(self, cfg: DictConfig, data: Data, forward, runtime: Runtime, seed: int):
        self.data, self.forward, self.runtime, self.env = data, forward, runtime, runtime.env
        fanouts = minibatch.check_fanouts(cfg.loader.num_neighbors, num_layers=2)
        cpu_data = data.cpu() if data.x.device.type != "cpu" else data  # the sampler runs on the CPU
        self.loader = minibatch.train_loader(cpu_data, fanouts, cfg.loader.batch_size, self.env, seed,
                                             cfg.loader.num_workers)
        self.eval_loader = minibatch.inference_loader(cpu_data, cfg.loader.eval_batch_size, cfg.loader.num_workers)

    def train_epoch(self, model: GAT, optimizer, kl_weight: float, cfg: DictConfig, epoch: int) -> Dict[str, float]:
        """One pass over the training nodes; the metrics are means over every process's seed nodes."""
        self.loader.batch_sampler.set_epoch(epoch)
        device, collect = self.runtime.device, cfg.kl.weight > 0
        totals = torch.zeros(5, dtype=torch.float64, device=device)  # CE sum, correct, seeds, KL sum, steps
        for batch in self.loader:
            batch = batch.to(device)
            seeds, y = batch.batch_size, batch.y[:batch.batch_size]
            count = minibatch.global_count(seeds, self.env, device)
            optimizer.zero_grad(set_to_none=True)
            with self.runtime.autocast(), attention.aux_losses() if collect else nullcontext() as aux:
                logits = self.forward(batch.x, batch.edge_index)[:seeds].float()
            kl = model.kl(aux, cfg.kl.reduction) if collect else torch.zeros((), device=device)
            loss = minibatch.seed_loss(logits, y, count, self.env) + kl_weight * kl
            self.runtime.backward_step(loss, optimizer)
            with torch.no_grad():
                totals += torch.stack([F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(-1) == y).sum(),
                                       torch.tensor(seeds, device=device), kl, torch.ones((), device=device)]
                                      ).double()
        ce_sum, correct, seen, kl_sum, steps = all_reduce_sum(totals, self.env).tolist()
        ce, kl = ce_sum / max(seen, 1), kl_sum / max(steps, 1)
        return {"train/loss": ce + kl_weight * kl, "train/ce": ce, "train/acc": correct / max(seen, 1),
                "train/kl": kl}

    @torch.no_grad()
    def predict(self, model: GAT) -> torch.Tensor:
        """Eval-mode logits of every node, by layer-wise inference over full neighbourhoods."""
        with self.runtime.autocast():
            return model.inference(self.data.x, self.eval_loader, self.env)


def train_seed(cfg: DictConfig, data: Data, seed: int, progress: bool = True,
               logger: Optional[MetricsLogger] = None, runtime: Optional[Runtime] = None) -> Dict:
    """Train one model from ``seed`` with early stopping; returns its checkpoint dict.

    ``data`` lives on ``runtime.device`` (default: the CPU in fp32). ``logger`` (if given)
    receives the per-epoch metrics, which the checkpoint's ``history`` also holds.
    ``loader.kind`` chooses full-batch steps (:class:`FullBatch`) or sampled mini-batches
    (:class:`NeighborBatches`; under ``torchrun`` the model is wrapped in DistributedDataParallel).
    """
    runtime = runtime or Runtime(torch.device("cpu"))
    seed_everything(seed, deterministic=cfg.train.deterministic)
    model = build_model(cfg, data.num_features, data.num_classes).to(runtime.device)
    forward = runtime.compile(wrap_model(model, runtime.env))
    steps = NeighborBatches(cfg, data, forward, runtime, seed) if cfg.loader.kind == "neighbor" \
        else FullBatch(cfg, data, forward, runtime)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    schedule = attention.KLSchedule.from_config(cfg.kl)

    best_acc, best_loss = -math.inf, math.inf
    best_state, best_epoch, waited, history = None, 0, 0, []
    # Patience cannot run out before max_epochs <= patience: then the end is known; else only its bound, the
    # epoch at which patience runs out unless validation improves (capped by max_epochs).
    known = cfg.train.max_epochs <= cfg.train.patience
    bar = console.progress(total=cfg.train.max_epochs if known else None, bound=cfg.train.patience,
                           desc=f"seed {seed} epoch", enabled=progress, unit="epoch")
    start = time.perf_counter()
    for epoch in range(cfg.train.max_epochs):
        model.train()
        kl_weight = schedule(epoch) if cfg.kl.weight > 0 else 0.0
        row = steps.train_epoch(model, optimizer, kl_weight, cfg, epoch)
        val = split_metrics(steps.predict(model), data.y, data.val_mask)
        row.update({"train/kl_weight": kl_weight, "val/loss": val["loss"], "val/acc": val["acc"]})
        history.append({"epoch": epoch, **row})
        if logger is not None:
            logger.log(epoch, **row)
        if val["acc"] >= best_acc or val["loss"] <= best_loss:
            if val["acc"] >= best_acc and val["loss"] <= best_loss:
                best_epoch = epoch
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            best_acc, best_loss = max(best_acc, val["acc"]), min(best_loss, val["loss"])
            waited = 0
        else:
            waited += 1
            if waited == cfg.train.patience:
                break
        bar.set_postfix(val_acc=f"{val['acc']:.3f}", best_val_acc=f"{best_acc:.3f}",
                        patience_left=f"{cfg.train.patience - waited}/{cfg.train.patience}")
        bar.set_bound(min(cfg.train.max_epochs, epoch + 1 + cfg.train.patience - waited))
        bar.update()
    bar.close()

    model.load_state_dict(best_state)
    logits = steps.predict(model)
    metrics = {
        "seed": seed, "epochs": epoch + 1, "best_epoch": best_epoch, "train_seconds": time.perf_counter() - start,
        "val": split_metrics(logits, data.y, data.val_mask), "test": split_metrics(logits, data.y, data.test_mask),
    }
    return {"model_state": best_state, "config": to_dict(cfg), "metrics": metrics, "history": history}


def summarize(values: Sequence[float]) -> Dict[str, float]:
    """Mean and sample standard deviation (ddof=1; 0 for one value), in percent."""
    arr = np.asarray(values, dtype=float) * 100
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0}


def default_out_dir(cfg: DictConfig) -> Path:
    return Path(cfg.out_dir) if cfg.out_dir else Path("runs") / "gat" / cfg.dataset / cfg.attention.name


#: Config keys that may differ between the seeds of one output directory (where files go, how many
#: seeds, where and how fast they compute).
RESUMABLE_KEYS = ("data_root", "out_dir", "seeds", "first_seed", "device", "train.num_threads", "train.compile",
                  "loader.num_workers", "loader.eval_batch_size")


def run(cfg: DictConfig, progress: bool = True, data: Optional[Data] = None) -> Optional[Dict]:
    """Train every seed of ``cfg`` (reusing finished seeds) and write ``results.json``; returns its contents.

    Under ``torchrun`` (``loader.kind=neighbor`` only) every process trains each seed on its share of
    the batches; the main process alone writes checkpoints, curves and results (the others return None)."""
    runtime = runtime_of(cfg)
    try:
        return _run(cfg, runtime, progress, data)
    finally:
        cleanup(runtime.env)


def _run(cfg: DictConfig, runtime: Runtime, progress: bool, data: Optional[Data]) -> Optional[Dict]:
    env = runtime.env
    if cfg.loader.kind == "neighbor":  # fail before loading anything
        minibatch.check_fanouts(cfg.loader.num_neighbors, num_layers=2)
        minibatch.require_sampler()
    elif env.distributed:
        raise ValueError(f"full-batch training runs in one process, not {env.world_size}: "
                         f"use --loader neighbor under torchrun")
    out_dir = default_out_dir(cfg)
    if data is None:
        from .data import load_dataset

        data = load_dataset(cfg.dataset, cfg.data_root)
    data = data.to(runtime.device)
    config = to_dict(cfg)
    seeds = list(range(cfg.first_seed, cfg.first_seed + cfg.seeds))
    per_seed: List[Dict] = []
    start = time.perf_counter()
    progress = progress and env.is_main
    for seed in (bar := console.progress(seeds, desc=f"{cfg.dataset} {cfg.attention.name} seeds",
                                         enabled=progress, unit="seed", smooth_eta=True)):
        path = out_dir / f"seed{seed}.pt"
        if broadcast_objects([path.exists()], env)[0]:
            done = torch.load(path, map_location="cpu", weights_only=False)
            check_resumable(_with_old_defaults(done["config"]), config, RESUMABLE_KEYS, path)
            per_seed.append(done["metrics"])
            if env.is_main:
                console.say(seed_line(done["metrics"], reused=True))
            bar.skip()  # reused: no part of the ETA of the seeds left
            continue
        log_dir = out_dir / f"seed{seed}"
        if env.is_main:
            _clear_curves(log_dir)  # an interrupted earlier attempt at this seed
        with MetricsLogger(log_dir, enabled=env.is_main) as logger:
            checkpoint = train_seed(cfg, data, seed, progress, logger, runtime)
        if env.is_main:
            atomic_save(checkpoint, path)
            console.say(seed_line(checkpoint["metrics"]))
        per_seed.append(checkpoint["metrics"])
    train_seconds = [m.get("train_seconds") for m in per_seed]
    results = results_record(
        config,
        dataset=cfg.dataset, attention=cfg.attention.name, seeds=seeds,
        test_acc={**summarize([m["test"]["acc"] for m in per_seed]),
                  "per_seed": [100 * m["test"]["acc"] for m in per_seed]},
        val_acc={**summarize([m["val"]["acc"] for m in per_seed]),
                 "per_seed": [100 * m["val"]["acc"] for m in per_seed]},
        epochs=[m["epochs"] for m in per_seed],
        runtime=runtime.describe(),
        # each seed's own training time, kept from the run that trained it (None: trained before it was recorded)
        train_seconds={"per_seed": train_seconds,
                       "total": sum(t for t in train_seconds if t is not None)},
        wall_seconds_this_run=time.perf_counter() - start,
        checkpoints=[str(out_dir / f"seed{s}.pt") for s in seeds],
    )
    if not env.is_main:
        return None
    results["plots"] = [str(path) for path in _plot(out_dir, results, per_seed)]
    atomic_write_json(out_dir / "results.json", results)
    return results


def _plot(out_dir: Path, results: Dict, per_seed: List[Dict]) -> List[Path]:
    """``curves.png`` (per-seed learning curves) and ``accuracy.png`` (seed spread); see :mod:`.plots`."""
    from .plots import plot_run

    curves = {m["seed"]: out_dir / f"seed{m['seed']}" / "metrics.jsonl" for m in per_seed}
    histories = {seed: read_metrics(path) for seed, path in curves.items() if path.is_file()}
    return plot_run(out_dir, results, histories, {m["seed"]: m["best_epoch"] for m in per_seed})


def seed_line(metrics: Dict, reused: bool = False) -> str:
    """``seed 3: test acc 83.10% (val 81.20%), best epoch 120 of 221, 20.3 s`` for the log."""
    seconds = metrics.get("train_seconds")
    return (f"seed {metrics['seed']}: test acc {100 * metrics['test']['acc']:.2f}% "
            f"(val {100 * metrics['val']['acc']:.2f}%), best epoch {metrics['best_epoch'] + 1} of {metrics['epochs']}"
            + (f", {seconds:.1f} s" if seconds is not None else "") + (" (reused)" if reused else ""))


def _clear_curves(log_dir: Path) -> None:
    """Remove the metrics a :class:`MetricsLogger` left in ``log_dir`` (it appends otherwise)."""
    if log_dir.is_dir():
        for file in [log_dir / "metrics.jsonl", *log_dir.glob("events.out.tfevents.*")]:
            file.unlink(missing_ok=True)


def _with_old_defaults(config: Dict) -> Dict:
    """A seed's saved config with the keys added since, at the values such seeds ran with."""
    return {"preset": None, **config, "train": {"precision": "fp32", **config["train"]},
            "model": {"per_head_input_dropout": False, "attention_bias": False, **config["model"]},
            "kl": {"reduction": "layer_sum", **config["kl"]},
            "loader": config.get("loader", {"kind": "full", "num_neighbors": [10, 10], "batch_size": 512,
                                            "eval_batch_size": 4096, "num_workers": 0})}


#: What a run can raise that the CLI reports in one line (PlanetoidDataError is a FileNotFoundError).
RUN_ERRORS = (FileNotFoundError, DeviceError, minibatch.SamplerMissing, ValueError)
