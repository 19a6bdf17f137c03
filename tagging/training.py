"""Training taggers over several seeds: the work behind ``python -m tagging.train`` (:mod:`tagging.train`
parses the command line and checks the config before torch is imported).

Protocol of the authors' code (``pdufter/convatt``): RMSprop (lr 1e-3), batches of 32 chunks in a
fresh random order every epoch, the cross-entropy over real words; after every epoch the dev
accuracy over all words; training stops after ``train.patience`` epochs without a better one
(at most ``train.max_epochs``) and the best epoch's weights are tested. In the first epoch the dev
accuracy is also measured every ``train.curve_every`` updates (the paper's Figure 2).

Files under ``<out_dir>``: ``seed<k>/`` with ``metrics.jsonl`` (+ TensorBoard events: ``step`` =
update, ``dev/acc``, ``train/loss``), ``checkpoints/step_<update>.pt`` (the newest resumable state,
through :class:`common.utils.Checkpointer`: written at each epoch's end and on Ctrl-C, at the current update)
and ``best.pt`` (weights, vocabulary and config of the best epoch); ``seed<k>.json`` once a seed is done;
``results.json`` (per seed and mean +- std (ddof=1) of the dev and test accuracy over all / OOV /
ambiguous words, the learning speed, the config and versions) and ``curves.png``. Re-running the same
command reuses finished seeds and resumes an unfinished one exactly where it stopped (same batches, same RNG state).
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from common import attention
from common.utils import (MetricsLogger, atomic_save, atomic_write_json, console, default_data_root, results_record,
                          seed_everything)
from common.utils.checkpoint import Checkpointer
from common.utils.config import to_dict
from common.utils.runs import finished_seed, mean_std, open_run_dir
from common.utils.runtime import DeviceError, Runtime
from common.utils.updates import check_updates

from common.text.batching import bucketed_order

from .data import (Batch, Chunk, Treebank, TreebankError, Vocabulary, batches, length_sorted_order,
                   load_treebank)
from .metrics import accuracies
from .model import Tagger, variant_label

#: Errors that end a run with a one-line message (exit status 2).
RUN_ERRORS = (TreebankError, DeviceError, ValueError, FileNotFoundError)
#: Keys that may differ when a run resumes (they do not change what is computed).
RESUMABLE_KEYS = ("device", "out_dir", "data_root", "seeds", "train.num_threads")


def default_out_dir(cfg: DictConfig) -> Path:
    if cfg.out_dir:
        return Path(cfg.out_dir)
    name = cfg.variant if cfg.attention.name == "softmax" else f"{cfg.variant}-{cfg.attention.name}"
    return Path("runs") / "tagging" / Path(str(cfg.treebank)).name / name


def build_model(cfg: DictConfig, vocab: Vocabulary) -> Tagger:
    options = {"normalizer": cfg.attention.name, "normalizer_options": dict(cfg.attention.options)}
    return Tagger(len(vocab.words), len(vocab.chars), len(vocab.tags), cfg.variant, max_len=cfg.data.max_len,
                  attention=options, **cfg.model)


@torch.no_grad()
def predict(model: Tagger, chunks: List[Chunk], runtime: Runtime, mc_samples: int = 0, batch_size: int = 256
            ) -> List[Batch]:
    """Each eval batch with ``tags`` replaced by the predicted tags (the MC mean over ``mc_samples`` sampled
    passes when given, else the eval-mode forward)."""
    model.eval()
    out = []
    sampling = attention.mc_sampling(model) if mc_samples else nullcontext()
    with sampling, runtime.autocast():
        for batch in batches(chunks, batch_size, length_sorted_order(chunks, batch_size)):
            batch = batch.to(runtime.device)
            if mc_samples:
                probs = sum(model(batch.words, batch.chars, batch.char_index, batch.mask).float().softmax(-1)
                            for _ in range(mc_samples))
            else:
                probs = model(batch.words, batch.chars, batch.char_index, batch.mask)
            out.append((batch, probs.argmax(-1)))
    return out


def evaluate(model: Tagger, chunks: List[Chunk], runtime: Runtime, mc_samples: int = 0) -> Dict[str, float]:
    """Accuracy (%) over all, OOV and ambiguous words."""
    return accuracies(predict(model, chunks, runtime, mc_samples))


def dev_accuracy(model: Tagger, chunks: List[Chunk], runtime: Runtime) -> float:
    return evaluate(model, chunks, runtime)["all"]


def updates_to_reach(curve: List[dict], fraction: float = 0.99) -> Optional[int]:
    """The first update whose dev accuracy is at least ``fraction`` of the best on ``curve``."""
    best = max(point["dev_acc"] for point in curve)
    return next((point["step"] for point in curve if point["dev_acc"] >= fraction * best), None)


class SeedRun:
    """One seed: model, optimiser and the resumable training state under ``<out_dir>/seed<k>``."""

    def __init__(self, cfg: DictConfig, treebank: Treebank, seed: int, out_dir: Path, runtime: Runtime):
        self.cfg, self.treebank, self.seed, self.runtime = cfg, treebank, seed, runtime
        self.dir = out_dir / f"seed{seed}"
        seed_everything(seed)
        self.model = build_model(cfg, treebank.vocab).to(runtime.device)
        # Keras 2's RMSprop: rho 0.9, epsilon 1e-7 (torch's defaults are 0.99 and 1e-8)
        self.optimizer = torch.optim.RMSprop(self.model.parameters(), lr=cfg.optim.lr, alpha=0.9, eps=1e-7)
        self.schedule = attention.KLSchedule.from_config(cfg.kl)
        check_updates(len(treebank.chunks["train"]), f"{treebank.name} has no training sentence",
                      "train on a treebank with some")
        self.per_epoch = len(self.order(0))
        self.state = {"epoch": 0, "batch": 0, "step": 0, "best_acc": -1.0, "best_epoch": None, "bad_epochs": 0,
                      "curve": [], "train_seconds": 0.0, "loss": float("nan"), "done": False}
        self.checkpointer = Checkpointer(self.dir, keep=1)
        saved = self.checkpointer.load_latest(self.model, self.optimizer, map_location=runtime.device)
        if saved is not None:
            self.state = saved["extra"]
            console.say(f"seed {seed}: resuming from update {self.state['step']} (epoch {self.state['epoch'] + 1})")

    def order(self, epoch: int) -> List[List[int]]:
        """The batches of ``epoch``: a function of the seed and the epoch only, so a resumed epoch replays them."""
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        train = self.treebank.chunks["train"]
        if self.cfg.train.bucket:
            return bucketed_order([len(c.words) for c in train], self.cfg.train.batch_size, generator)
        perm = torch.randperm(len(train), generator=generator).tolist()
        return [perm[i:i + self.cfg.train.batch_size] for i in range(0, len(perm), self.cfg.train.batch_size)]

    def last_update(self) -> int:
        """The update at which training ends at the latest: where patience runs out unless dev accuracy improves,
        or ``train.max_epochs``."""
        s, train = self.state, self.cfg.train
        return self.per_epoch * min(train.max_epochs, s["epoch"] + train.patience - s["bad_epochs"])

    def save(self) -> Path:
        """The resumable state (model, optimiser, training state, RNG) at the current update."""
        return self.checkpointer.save(self.state["step"], self.model, self.optimizer, extra=self.state)

    def save_best(self) -> None:
        atomic_save({"model": self.model.state_dict(), "vocab": self.treebank.vocab.state(),
                     "config": to_dict(self.cfg), "seed": self.seed, "epoch": self.state["epoch"]},
                    self.dir / "best.pt")

    def train_step(self, batch: Batch) -> float:
        self.model.train()
        batch = batch.to(self.runtime.device)
        kl_weight = self.schedule(self.state["step"])
        collect = kl_weight > 0
        with self.runtime.autocast(), attention.aux_losses() if collect else nullcontext() as aux:
            logits = self.model(batch.words, batch.chars, batch.char_index, batch.mask)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.tags.flatten(), ignore_index=-100)
            if collect:
                loss = loss + kl_weight * aux.total().to(loss.device)
        self.optimizer.zero_grad(set_to_none=True)
        self.runtime.backward_step(loss, self.optimizer)
        return float(loss.detach())

    def run(self, bar, logger: MetricsLogger) -> None:
        """Train until early stopping; Ctrl-C checkpoints the current update and re-raises."""
        cfg, s, dev = self.cfg, self.state, self.treebank.chunks["dev"]
        tick = time.perf_counter()
        try:
            while not s["done"]:
                order = self.order(s["epoch"])[s["batch"]:]
                for batch in batches(self.treebank.chunks["train"], cfg.train.batch_size, order):
                    with console.finish_first(f"update {s['step'] + 1}"):
                        s["loss"] = loss = self.train_step(batch)
                        s["batch"] += 1
                        s["step"] += 1
                        if s["epoch"] == 0 and s["step"] % cfg.train.curve_every == 0 and s["batch"] < self.per_epoch:
                            acc = dev_accuracy(self.model, dev, self.runtime)
                            s["curve"].append({"step": s["step"], "epoch": s["step"] / self.per_epoch, "dev_acc": acc,
                                               "epoch_end": False})
                            logger.log(s["step"], **{"dev/acc": acc, "train/loss": loss})
                        bar.update()  # in the block: a Ctrl-C held until its end names this update as done
                with console.finish_first("the end of the epoch"):
                    self._end_epoch(logger, s["loss"])  # the epoch's last loss, also after a resume at its end
                    s["train_seconds"] += time.perf_counter() - tick
                    tick = time.perf_counter()
                    self.save()
                bar.set_postfix(dev=f"{s['curve'][-1]['dev_acc']:.2f}", best=f"{s['best_acc']:.2f}",
                                patience=f"{cfg.train.patience - s['bad_epochs']}")
                bar.set_bound(self.last_update())
        except KeyboardInterrupt as interrupt:
            if not isinstance(interrupt, console.InterruptedMidway):  # a second Ctrl-C may leave a half update
                s["train_seconds"] += time.perf_counter() - tick
                console.say(f"seed {self.seed}: update {s['step']} saved to {self.save()}")
            raise

    def _end_epoch(self, logger: MetricsLogger, loss: float) -> None:
        cfg, s = self.cfg, self.state
        acc = dev_accuracy(self.model, self.treebank.chunks["dev"], self.runtime)
        s["curve"].append({"step": s["step"], "epoch": s["epoch"] + 1, "dev_acc": acc, "epoch_end": True})
        logger.log(s["step"], **{"dev/acc": acc, "train/loss": loss, "epoch": s["epoch"] + 1})
        if acc > s["best_acc"]:
            s["best_acc"], s["best_epoch"], s["bad_epochs"] = acc, s["epoch"] + 1, 0
            self.save_best()
        else:
            s["bad_epochs"] += 1
        s["epoch"] += 1
        s["batch"] = 0
        s["done"] = s["bad_epochs"] >= cfg.train.patience or s["epoch"] >= cfg.train.max_epochs

    def result(self) -> dict:
        """Dev and test accuracies of the best epoch's weights, and the learning-speed numbers."""
        best = torch.load(self.dir / "best.pt", map_location=self.runtime.device, weights_only=False)
        self.model.load_state_dict(best["model"])
        stochastic = any(getattr(m, "stochastic", False) for m in self.model.modules())
        mc = self.cfg.train.mc_samples if stochastic else 0
        s = self.state
        epoch_points = [p for p in s["curve"] if p["epoch_end"]]
        return {"seed": self.seed, "best_epoch": s["best_epoch"], "epochs": s["epoch"], "updates": s["step"],
                "updates_per_epoch": self.per_epoch, "train_seconds": s["train_seconds"],
                "dev": evaluate(self.model, self.treebank.chunks["dev"], self.runtime, mc),
                "test": evaluate(self.model, self.treebank.chunks["test"], self.runtime, mc),
                "dev_acc_after_1_epoch": epoch_points[0]["dev_acc"],
                "updates_to_99pct": updates_to_reach(s["curve"]), "curve": s["curve"], "mc_samples": mc}


def run(cfg: DictConfig, progress: bool = True) -> dict:
    """Train ``cfg.seeds`` seeds (reusing finished ones), write ``results.json`` and the curves; the record."""
    runtime = Runtime.create(cfg.device, cfg.train.precision, threads=cfg.train.num_threads)
    data_root = default_data_root(cfg.data_root)
    treebank = load_treebank(data_root, cfg.treebank, cfg.data.max_len, cfg.data.max_word_chars,
                             cfg.data.vocab_fraction, cfg.data.vocab_splits)
    out_dir = open_run_dir(default_out_dir(cfg), to_dict(cfg), RESUMABLE_KEYS)
    label = variant_label(cfg.variant, cfg.attention.name)
    seeds = list(range(cfg.first_seed, cfg.first_seed + cfg.seeds))
    console.say(f"{treebank.name} {label}: {len(treebank.chunks['train'])} training chunks, "
                f"{len(treebank.vocab.words)} words, {len(treebank.vocab.chars)} characters, on {runtime.device}")
    per_seed = []
    for seed in seeds:
        record = finished_seed(out_dir, seed)
        if record is not None:
            per_seed.append(record)
            console.say(f"seed {seed}: done before (test accuracy {record['test']['all']:.2f})")
            continue
        seed_run = SeedRun(cfg, treebank, seed, out_dir, runtime)
        s = seed_run.state
        bar = console.progress(desc=f"seed {seed} update", bound=seed_run.last_update(), enabled=progress,
                               initial=s["step"], unit="update")
        with bar, MetricsLogger(seed_run.dir) as logger:
            seed_run.run(bar, logger)
        record = seed_run.result()
        atomic_write_json(out_dir / f"seed{seed}.json", record)
        per_seed.append(record)
        console.say(f"seed {seed}: test accuracy {record['test']['all']:.2f} (OOV {record['test']['oov']:.2f}, "
                    f"ambiguous {record['test']['ambiguous']:.2f}), best epoch {record['best_epoch']} of "
                    f"{record['epochs']}, {record['train_seconds']:.0f} s")
    summary = {split: {metric: mean_std([r[split][metric] for r in per_seed]) for metric in per_seed[0][split]}
               for split in ("dev", "test")}
    record = results_record(to_dict(cfg), treebank=treebank.name, variant=cfg.variant, label=label,
                            normalizer=cfg.attention.name, seeds=seeds, counts=treebank.counts(),
                            runtime=runtime.describe(), **summary,
                            dev_acc_after_1_epoch=mean_std([r["dev_acc_after_1_epoch"] for r in per_seed]),
                            updates_to_99pct=mean_std([r["updates_to_99pct"] for r in per_seed]),
                            train_seconds={"per_seed": [r["train_seconds"] for r in per_seed],
                                           "total": sum(r["train_seconds"] for r in per_seed)},
                            per_seed=per_seed)
    from .plots import plot_curves

    record["plots"] = [str(plot_curves(per_seed, label, treebank.name, out_dir / "curves.png"))]
    atomic_write_json(out_dir / "results.json", record)
    return record

