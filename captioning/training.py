"""Training Att2in: the work behind ``python -m captioning.train`` (which checks the config before this module
is imported). self-critical.pytorch's ``configs/a2i2.yml`` recipe (``captioning/configs/att2in.yaml``): the mean
NLL of every caption word and ``<eos>`` + for BAM ``kl.weight * f(iteration)`` times the KL averaged over decoding
steps. Under ``torchrun`` each process takes ``train.batch_size`` images of every global batch
(``DistributedSampler``); only the first one validates and writes files. The files of a run: docs/captioning.md."""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import torch
from omegaconf import DictConfig
from torch import Tensor

from common import attention
from common.features import RegionFeatureStore
from common.training import Engine, EpochBatches, Plan, Task, TrainState
from common.utils import atomic_save, atomic_write_json, console, results_record, seed_everything
from common.utils.distributed import cleanup, shard_sampler, wrap_model
from common.utils.runs import open_run_dir
from common.utils.runtime import Runtime

from .config import RESUMABLE_KEYS, build_model, data_path, prepared_dir, run_dir, to_dict
from .data import CaptionCorpus, CaptionDataset, collate
from .evaluate import caption_images
from .metrics import format_scores, score_captions
from .models import caption_nll
from .run_inputs import check_run_inputs
from .schedule import learning_rate, ss_probability


class CaptioningTask(Task):
    """Att2in for :class:`common.training.Engine`: Adam at the epoch's learning rate, the epoch's scheduled-sampling
    probability, the NLL + weighted KL, gradients clipped by value, and the beam-search validation of the main
    process, whose CIDEr keeps ``best.pt``; a history row per epoch."""

    sum_dtype = torch.float32  # the epoch means as this loop logged them before the engine
    saved = ("history", "best")

    def __init__(self, cfg: DictConfig, runtime: Runtime, progress: bool):
        self.cfg, self.runtime, self.env, self.progress, self.dir = cfg, runtime, runtime.env, progress, run_dir(cfg)
        self.corpus = corpus = CaptionCorpus(prepared_dir(cfg))
        self.store = RegionFeatureStore(data_path(cfg, cfg.data.features))
        self.train_set = CaptionDataset(corpus.split("train"), self.store, corpus.vocab, corpus.max_length,
                                        cfg.train.seq_per_img)
        self.val_set = CaptionDataset(corpus.split(cfg.eval.split, cfg.eval.max_images), self.store, corpus.vocab,
                                      corpus.max_length, with_captions=False)
        seed_everything(cfg.seed, deterministic=cfg.train.deterministic)
        self.model = build_model(cfg, corpus.vocab, self.store.feature_dim).to(runtime.device)
        if cfg.kl.weight <= 0:
            attention.freeze_priors(self.model)
        self.forward = runtime.compile(wrap_model(self.model, self.env))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.clip = lambda: torch.nn.utils.clip_grad_value_(self.model.parameters(), cfg.optim.grad_clip_value)
        self.kl = attention.KLSchedule.from_config(cfg.kl)
        self.sampler = shard_sampler(self.train_set, self.env, shuffle=True, seed=cfg.seed)
        self.ss_prob = 0.0  # the epoch's, set before each update
        self.scores: Optional[dict] = None  # the last validation's
        self.history: List[dict] = []  # a row per epoch: its means, lr, ss_prob and val scores when validated
        self.best: Optional[dict] = None  # the best epoch and its val scores

    def _generator(self, epoch: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)

    def updates(self, epoch: int) -> EpochBatches:
        """The batches of ``epoch`` (this process's shard under torchrun), drawn as a shuffling DataLoader draws them
        from the epoch's generator: its workers' base seed, then the order."""
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
            order = list(self.sampler)
        else:
            generator = self._generator(epoch)
            torch.empty((), dtype=torch.int64).random_(generator=generator)  # the base seed that the loader draws
            order = torch.randperm(len(self.train_set), generator=generator).tolist()
        size = self.cfg.train.batch_size
        return EpochBatches([order[i:i + size] for i in range(0, len(order), size)], self.train_set, collate,
                            self.cfg.train.num_workers, self.runtime.pin_memory,
                            lambda: self._generator(epoch))  # nothing from torch's global RNG

    def before_update(self, state: TrainState) -> None:
        """The epoch's learning rate and scheduled-sampling probability."""
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.cfg, state.epoch)
        self.ss_prob = ss_probability(self.cfg, state.epoch)

    def train_step(self, batch: dict, state: TrainState) -> Dict[str, Tensor]:
        batch = self.runtime.to_device(batch)
        with self.runtime.autocast(), attention.aux_losses(self.cfg.kl.weight > 0) as aux:
            log_probs = self.forward(batch["features"], batch["mask"], batch["captions"], self.ss_prob)
        nll = caption_nll(log_probs, batch["captions"], self.corpus.vocab.pad)
        kl = aux.total() / log_probs.shape[1] if aux is not None else torch.zeros((), device=nll.device)
        loss = nll + self.kl(state.step) * kl
        self.runtime.backward(loss)
        return {"train/loss": loss.detach(), "train/nll": nll.detach(), "train/kl": kl.detach()}

    def epoch_values(self, sums: Dict[str, float], updates: int, state: TrainState) -> Dict[str, float]:
        """The epoch's mean losses, learning rate and scheduled-sampling probability, kept as its history row."""
        row = {"epoch": state.epoch, "lr": learning_rate(self.cfg, state.epoch),
               "ss_prob": ss_probability(self.cfg, state.epoch), **self.window_values(sums, updates, state)}
        self.history.append(row)
        if self.env.is_main:
            console.say(f"epoch {state.epoch + 1}/{self.cfg.train.epochs}: train nll {row['train/nll']:.3f}")
        return {key: value for key, value in row.items() if key != "epoch"}

    def evaluate(self, state: TrainState) -> Dict[str, float]:
        """The val scores of the beam-search captions (main process), added to the epoch's history row."""
        if not self.env.is_main:
            return {}
        e = self.cfg.eval
        captions = caption_images(self.model, self.val_set, self.corpus.vocab, e.beam_size, e.max_length, e.batch_size,
                                  self.progress, e.length_penalty, self.runtime)
        self.scores = score_captions(captions, self.corpus.references(self.val_set.images), list(e.metrics))
        metrics = {f"val/{key}": value for key, value in self.scores.items() if isinstance(value, float)}
        self.history[-1].update(metrics)
        console.say(f"epoch {state.epoch}/{self.cfg.train.epochs}: val {format_scores(self.scores)}")
        return metrics

    def score(self, metrics) -> float:
        return metrics["val/CIDEr"]

    def on_best(self, state: TrainState) -> None:
        """Keep the epoch and its scores, and write ``best.pt`` (what ``captioning.evaluate`` loads)."""
        vocab, self.best = self.corpus.vocab, {"epoch": state.epoch - 1, "scores": self.scores}
        atomic_save({"model": self.model.state_dict(), "config": to_dict(self.cfg),
                     "feature_dim": self.store.feature_dim, **self.best,
                     "vocab": {"tokens": vocab.tokens[len(vocab.specials):], "specials": list(vocab.specials)}},
                    self.dir / "best.pt")


def run(cfg: DictConfig, progress: bool = True, runtime: Optional[Runtime] = None) -> dict:
    """Train (resuming where the run in ``out_dir`` stopped) and write ``results.json``; its record ({} on all
    but the first process)."""
    check_run_inputs(cfg)
    runtime = runtime or Runtime.from_config(cfg, distributed=True)
    start, main = time.perf_counter(), runtime.env.is_main
    try:
        task = CaptioningTask(cfg, runtime, progress and main)
        if main:
            open_run_dir(task.dir, to_dict(cfg), RESUMABLE_KEYS)
        # validation every eval.every epochs (0: only after the last one, which is always validated)
        plan = Plan(max_epochs=cfg.train.epochs, eval_epochs=cfg.eval.every or cfg.train.epochs, keep=2)
        state = Engine(runtime, task.dir, plan, progress=progress, label=cfg.attention.name).fit(task)
    finally:
        cleanup(runtime.env)
    if not main:  # the first process validated and writes the results
        return {}
    results = results_record(to_dict(cfg), attention=cfg.attention.name, best_epoch=task.best["epoch"],
                             val=task.best["scores"], history=task.history, epochs=cfg.train.epochs,
                             train_seconds=state.train_seconds, wall_seconds_this_run=time.perf_counter() - start,
                             checkpoint=str(task.dir / "best.pt"), runtime=runtime.describe())
    atomic_write_json(task.dir / "results.json", results)
    return results
