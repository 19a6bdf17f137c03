"""Training taggers over several seeds: the work behind ``python -m tagging.train`` (which checks the config
before torch is imported). The protocol of the authors' code (``pdufter/convatt``): RMSprop, batches of 32 chunks
in a fresh order every epoch, the dev accuracy after every epoch, ``train.patience`` epochs without a better one
stop it and the best epoch is tested; in the first epoch the dev accuracy every ``train.curve_every`` updates too
(the paper's Figure 2). The files of a run: docs/tagging.md."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from common import attention
from common.text.batching import epoch_batches
from common.training import Plan, Task, TrainState, seeds_record, train_seeds
from common.utils import atomic_save, atomic_write_json, console, default_data_root, seed_everything
from common.utils.config import note_deviations, to_dict
from common.utils.runtime import DeviceError, Runtime

from .config import RESUMABLE_KEYS, default_out_dir, deviations
from .data import Treebank, TreebankError, batches, load_treebank
from .metrics import updates_to_reach
from .model import variant_label
from .predict import build_model, dev_accuracy, evaluate

#: Errors that end a run with a one-line message (exit status 2).
RUN_ERRORS = (TreebankError, DeviceError, ValueError, FileNotFoundError)


class TaggingTask(Task):
    """One seed of the tagger for :class:`common.training.Engine`: RMSprop, an epoch's batches, the cross-entropy
    (+ weighted KL), the dev accuracy at every epoch's end (the best one's weights kept) and every
    ``train.curve_every`` updates of the first epoch."""

    saved = ("curve",)

    def __init__(self, cfg: DictConfig, treebank: Treebank, seed: int, run_dir: Path, runtime: Runtime):
        self.cfg, self.treebank, self.seed, self.runtime, self.dir = cfg, treebank, seed, runtime, run_dir
        seed_everything(seed)
        self.model = build_model(cfg, treebank.vocab).to(runtime.device)
        # Keras 2's RMSprop: rho 0.9, epsilon 1e-7 (torch's defaults are 0.99 and 1e-8)
        self.optimizer = torch.optim.RMSprop(self.model.parameters(), lr=cfg.optim.lr, alpha=0.9, eps=1e-7)
        self.kl = attention.KLSchedule.from_config(cfg.kl)
        self.empty_epoch = (f"{treebank.name} has no training sentence", "train on a treebank with some")
        self.curve: List[dict] = []  # the first epoch's points between its ends
        self.per_epoch = len(self.updates(0))

    def updates(self, epoch: int) -> List[List[int]]:
        """The batches of ``epoch``: a function of the seed and the epoch only, so a resumed epoch replays them."""
        lengths = [len(chunk.words) for chunk in self.treebank.chunks["train"]]
        return epoch_batches(lengths, self.cfg.train.batch_size, self.seed, epoch, self.cfg.train.bucket)

    def train_step(self, update: List[int], state: TrainState) -> Dict[str, torch.Tensor]:
        (batch,) = batches(self.treebank.chunks["train"], self.cfg.train.batch_size, [update])
        batch = batch.to(self.runtime.device)
        kl_weight = self.kl(state.step)
        with self.runtime.autocast(), attention.aux_losses(kl_weight > 0) as aux:
            logits = self.model(batch.words, batch.chars, batch.char_index, batch.mask)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.tags.flatten(), ignore_index=-100)
            if kl_weight > 0:
                loss = loss + kl_weight * aux.total().to(loss.device)
        self.runtime.backward(loss)
        return {"train/loss": loss.detach()}

    def after_update(self, state: TrainState) -> Optional[Dict[str, float]]:
        """The learning curve inside the first epoch (the paper's Figure 2)."""
        if state.epoch or state.step % self.cfg.train.curve_every or state.batch == self.per_epoch:
            return None
        acc = dev_accuracy(self.model, self.treebank.chunks["dev"], self.runtime)
        self.curve.append({"step": state.step, "epoch": state.step / self.per_epoch, "dev_acc": acc,
                           "epoch_end": False})
        return {"dev/acc": acc}

    def evaluate(self, state: TrainState) -> Dict[str, float]:
        return {"dev_acc": dev_accuracy(self.model, self.treebank.chunks["dev"], self.runtime)}

    def score(self, metrics) -> float:
        return metrics["dev_acc"]

    def on_best(self, state: TrainState) -> None:
        atomic_save({"model": self.model.state_dict(), "vocab": self.treebank.vocab.state(),
                     "config": to_dict(self.cfg), "seed": self.seed, "epoch": state.epoch}, self.dir / "best.pt")

    def record(self, state: TrainState) -> dict:
        """Dev and test accuracies of the best epoch's weights, and the learning-speed numbers."""
        best = torch.load(self.dir / "best.pt", map_location=self.runtime.device, weights_only=False)
        self.model.load_state_dict(best["model"])
        mc = self.cfg.train.mc_samples if attention.is_stochastic(self.cfg.attention.name) else 0
        ends = [{"step": row["step"], "epoch": row["epoch"], "dev_acc": row["dev_acc"], "epoch_end": True}
                for row in state.history]
        curve = sorted(self.curve + ends, key=lambda point: point["step"])
        chunks = self.treebank.chunks
        return {"seed": self.seed, "best_epoch": state.best_step // self.per_epoch, "epochs": state.epoch,
                "updates": state.step, "updates_per_epoch": self.per_epoch, "train_seconds": state.train_seconds,
                "dev": evaluate(self.model, chunks["dev"], self.runtime, mc),
                "test": evaluate(self.model, chunks["test"], self.runtime, mc),
                "dev_acc_after_1_epoch": ends[0]["dev_acc"], "updates_to_99pct": updates_to_reach(curve),
                "curve": curve, "mc_samples": mc}


def run(cfg: DictConfig, progress: bool = True) -> dict:
    """Train ``cfg.seeds`` seeds (reusing finished ones), write ``results.json`` and the curves; the record."""
    runtime = Runtime.from_config(cfg)
    treebank = load_treebank(default_data_root(cfg.data_root), cfg.treebank, cfg.data.max_len, cfg.data.max_word_chars,
                             cfg.data.vocab_fraction, cfg.data.vocab_splits)
    out_dir, label, differs = default_out_dir(cfg), variant_label(cfg.variant, cfg.attention.name), deviations(cfg)
    console.say(f"{treebank.name} {label}: {len(treebank.chunks['train'])} training chunks, "
                f"{len(treebank.vocab.words)} words, {len(treebank.vocab.chars)} characters, on {runtime.device}")
    note_deviations(f"--preset {cfg.preset}", differs)
    per_seed = train_seeds(out_dir, to_dict(cfg), RESUMABLE_KEYS, range(cfg.first_seed, cfg.first_seed + cfg.seeds),
                           runtime, lambda seed, run_dir: TaggingTask(cfg, treebank, seed, run_dir, runtime),
                           Plan(max_epochs=cfg.train.max_epochs, patience=cfg.train.patience), _seed_line, progress,
                           desc=f"{treebank.name} {label} seeds")
    from .plots import plot_curves

    record = seeds_record(to_dict(cfg), per_seed, ("dev", "test", "dev_acc_after_1_epoch", "updates_to_99pct"),
                          treebank=treebank.name, variant=cfg.variant, label=label, normalizer=cfg.attention.name,
                          preset=cfg.preset, preset_deviations=differs, counts=treebank.counts(),
                          runtime=runtime.describe(),
                          plots=[str(plot_curves(per_seed, label, treebank.name, out_dir / "curves.png"))])
    atomic_write_json(out_dir / "results.json", record)
    return record


def _seed_line(record: dict) -> str:
    test = record["test"]
    return (f"test accuracy {test['all']:.2f} (OOV {test['oov']:.2f}, ambiguous {test['ambiguous']:.2f}), best epoch "
            f"{record['best_epoch']} of {record['epochs']}, {record['train_seconds']:.0f} s")
