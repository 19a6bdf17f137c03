"""Training Att2in: the work behind ``python -m captioning.train`` (:mod:`captioning.train` parses the
command line and checks the config before this module, torch and the model are imported).

Recipe of self-critical.pytorch's ``configs/a2i2.yml`` (see ``captioning/configs/att2in.yaml``).
The loss is the mean negative log-likelihood of every caption word and ``<eos>``, plus, for
BAM, ``kl.weight * f(iteration)`` times the KL averaged over decoding steps (BAM Eq. 4).

Outputs in ``<out_dir>`` (default ``runs/captioning/<attention>``): ``checkpoints/step_<epoch>.pt``
after every epoch (model, optimiser, RNG; an interrupted run resumes from the last one),
``best.pt`` (best val CIDEr: weights, config, vocabulary), ``metrics.jsonl`` + TensorBoard
events (``train/loss``, ``train/nll``, ``train/kl``, ``lr``, ``ss_prob`` and ``val/*`` per epoch),
and ``results.json`` (best epoch and its val scores, per-epoch history, config, versions).

``--device``, ``train.precision`` and ``train.compile`` choose where and how it computes
(:mod:`common.utils.runtime`); a checkpoint resumes on any device. Several GPUs::

    torchrun --nproc_per_node 4 -m captioning.train --attention bam-wc

give each process ``train.batch_size`` images of every global batch (``DistributedSampler``,
reshuffled per epoch; it repeats a few images to even out the last batch); only the first
process validates, checkpoints and writes files.

``--demo`` (:func:`write_demo_data`) trains on the synthetic COCO of :mod:`captioning.fixtures`.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Optional

import torch
from omegaconf import DictConfig
from torch import Tensor
from torch.utils.data import DataLoader

from common import attention
from common.features import RegionFeatureStore
from common.utils import (Checkpointer, MetricsLogger, atomic_save, atomic_write_json, console, results_record,
                          seed_everything)
from common.utils.config import check_resumable
from common.utils.distributed import barrier, cleanup, shard_sampler, wrap_model
from common.utils.runtime import Runtime

from .config import build_model, data_path, prepared_dir, run_dir, to_dict
from .data import CaptionCorpus, CaptionDataset, collate
from .evaluate import caption_images
from .metrics import format_scores, score_captions

#: Config keys that may change between a run and its resumption (where files go, speed knobs, length).
RESUMABLE_KEYS = ("data_root", "out_dir", "device", "eval", "train.num_threads", "train.num_workers", "train.epochs",
                  "train.precision", "train.compile")


def caption_nll(log_probs: Tensor, captions: Tensor, pad: int) -> Tensor:
    """Mean ``-log p(w_t | w_<t)`` over the real target words (``captions[..., 1:]`` that are not pad)."""
    targets = captions.reshape(-1, captions.shape[-1])[:, 1:]
    real = targets != pad
    picked = log_probs[real].gather(1, targets[real].unsqueeze(1))  # padded rows (-inf at pad) never touched
    return -picked.mean()


def learning_rate(cfg: DictConfig, epoch: int) -> float:
    """``lr * decay_rate ** ((epoch - decay_start) // decay_every)`` once ``epoch > decay_start``
    (self-critical's ``learning_rate_decay_*``; a negative start turns decay off)."""
    o = cfg.optim
    if o.decay_start < 0 or epoch <= o.decay_start:
        return o.lr
    return o.lr * o.decay_rate ** ((epoch - o.decay_start) // o.decay_every)


def ss_probability(cfg: DictConfig, epoch: int) -> float:
    s = cfg.scheduled_sampling
    if s.start < 0 or epoch <= s.start:
        return 0.0
    return min(s.increase_prob * ((epoch - s.start) // s.increase_every), s.max_prob)


def validate(cfg: DictConfig, model, dataset: CaptionDataset, corpus: CaptionCorpus, progress: bool,
             runtime: Optional[Runtime] = None) -> dict:
    captions = caption_images(model, dataset, corpus.vocab, cfg.eval.beam_size, cfg.eval.max_length,
                              cfg.eval.batch_size, progress, cfg.eval.length_penalty, runtime)
    return score_captions(captions, corpus.references(dataset.images), list(cfg.eval.metrics))


def run(cfg: DictConfig, progress: bool = True, runtime: Optional[Runtime] = None) -> dict:
    """Train (resuming from the last epoch checkpoint of ``out_dir``) and write ``results.json``."""
    runtime = runtime or Runtime.create(cfg.device, cfg.train.precision, cfg.train.compile,
                                        threads=cfg.train.num_threads, distributed=True)
    env = runtime.env
    try:
        return _train(cfg, progress and env.is_main, runtime)
    finally:
        cleanup(env)


def check_run_inputs(cfg: DictConfig) -> None:
    """One error naming every missing input: the region features and, while the captions are not
    prepared, Karpathy's file that ``captioning.prepare`` needs (not the file that it would write)."""
    from common.utils.paths import check_inputs

    from .prepare import KARPATHY_FIX, default_dataset_json

    prepared = prepared_dir(cfg)
    prepare = " ".join(["python -m captioning.prepare", *(["--data-root", cfg.data_root] if cfg.data_root else []),
                        *(["--out", str(prepared)] if cfg.data.prepared else [])])
    karpathy = None if (prepared / "captions.json").is_file() else default_dataset_json(cfg.data_root)
    check_inputs([("read by captioning.prepare", karpathy, f"{KARPATHY_FIX}, then run `{prepare}`"),
                  ("data.features", data_path(cfg, cfg.data.features),
                   "create it with scripts/convert_features.py or scripts/extract_features.py")])


def write_demo_data(cfg: DictConfig) -> None:
    """``--demo``'s inputs: the synthetic COCO of :mod:`captioning.fixtures` (with COCO image 273052's
    boxes, for ``captioning.visualize``) in ``cfg.data_root``, its captions prepared in ``data.prepared``."""
    from .fixtures import write_karpathy_fixture
    from .prepare import prepare

    paths = write_karpathy_fixture(cfg.data_root, include_demo_image=True)
    prepare(paths["dataset"], prepared_dir(cfg))


def _train(cfg: DictConfig, progress: bool, runtime: Runtime) -> dict:
    env = runtime.env
    if "cider" not in cfg.eval.metrics:
        raise ValueError("eval.metrics must include cider: the best checkpoint is chosen by val CIDEr")
    check_run_inputs(cfg)
    out_dir = run_dir(cfg)
    corpus = CaptionCorpus(prepared_dir(cfg))
    store = RegionFeatureStore(data_path(cfg, cfg.data.features))
    vocab = corpus.vocab
    train_set = CaptionDataset(corpus.split("train"), store, vocab, corpus.max_length, cfg.train.seq_per_img)
    val_set = CaptionDataset(corpus.split(cfg.eval.split, cfg.eval.max_images), store, vocab, corpus.max_length,
                             with_captions=False)

    seed_everything(cfg.seed, deterministic=cfg.train.deterministic)
    model = build_model(cfg, vocab, store.feature_dim).to(runtime.device)
    forward = runtime.compile(wrap_model(model, env))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    checkpointer = Checkpointer(out_dir, keep=2)
    config = to_dict(cfg)
    _check_resumable(checkpointer, config)
    state = checkpointer.load_latest(model, optimizer, map_location=runtime.device, scaler=runtime.scaler)
    extra = state["extra"] if state is not None else {"config": config, "best": None, "history": [], "iteration": 0}
    start_epoch = 0 if state is None else state["step"] + 1
    schedule = attention.KLSchedule.from_config(cfg.kl)
    generator = torch.Generator().manual_seed(cfg.seed)
    sampler = shard_sampler(train_set, env, shuffle=True, seed=cfg.seed)
    loader = DataLoader(train_set, batch_size=cfg.train.batch_size, shuffle=sampler is None, sampler=sampler,
                        collate_fn=collate, num_workers=cfg.train.num_workers, generator=generator,
                        persistent_workers=cfg.train.num_workers > 0, pin_memory=runtime.pin_memory)
    start = time.perf_counter()
    with MetricsLogger(out_dir, enabled=env.is_main) as logger:
        for epoch in range(start_epoch, cfg.train.epochs):
            generator.manual_seed(cfg.seed * 1_000_003 + epoch)  # the same shuffles whether resumed or not
            if sampler is not None:
                sampler.set_epoch(epoch)
            epoch_start = time.perf_counter()
            lr, ss_prob = learning_rate(cfg, epoch), ss_probability(cfg, epoch)
            for group in optimizer.param_groups:
                group["lr"] = lr
            sums = train_epoch(cfg, forward, optimizer, loader, schedule, extra, ss_prob, vocab.pad,
                               desc=f"epoch {epoch + 1}/{cfg.train.epochs} batch", progress=progress,
                               runtime=runtime)
            row = {"epoch": epoch, "lr": lr, "ss_prob": ss_prob, **sums}
            last = epoch == cfg.train.epochs - 1
            if env.is_main and (last or (cfg.eval.every > 0 and (epoch + 1) % cfg.eval.every == 0)):
                scores = validate(cfg, model, val_set, corpus, progress, runtime)
                row.update({f"val/{k}": v for k, v in scores.items() if isinstance(v, float)})
                if extra["best"] is None or scores["CIDEr"] > extra["best"]["scores"]["CIDEr"]:
                    extra["best"] = {"epoch": epoch, "scores": scores}
                    atomic_save({"model": model.state_dict(), "config": config, "feature_dim": store.feature_dim,
                                 "vocab": {"tokens": vocab.tokens[len(vocab.specials):],
                                           "specials": list(vocab.specials)},
                                 "epoch": epoch, "scores": scores}, out_dir / "best.pt")
            extra["history"].append(row)
            # training and validation time of every epoch, kept in the checkpoints across resumptions
            extra["train_seconds"] = extra.get("train_seconds", 0.0) + time.perf_counter() - epoch_start
            if env.is_main:
                checkpointer.save(epoch, model, optimizer, extra=extra, scaler=runtime.scaler)
                logger.log(epoch, **{k: v for k, v in row.items() if k != "epoch"})  # after the save: no line twice
            barrier(env)
            if env.is_main:
                console.say(f"epoch {epoch + 1}/{cfg.train.epochs}: train nll {row['train/nll']:.3f}"
                            + (f", val {format_scores(scores)}" if "val/CIDEr" in row else ""))
    if not env.is_main:  # the first process validated and writes the results
        return {}
    results = results_record(config, attention=cfg.attention.name, best_epoch=extra["best"]["epoch"],
                             val=extra["best"]["scores"], history=extra["history"], epochs=cfg.train.epochs,
                             train_seconds=extra.get("train_seconds"),
                             wall_seconds_this_run=time.perf_counter() - start, checkpoint=str(out_dir / "best.pt"),
                             runtime=runtime.describe())
    atomic_write_json(out_dir / "results.json", results)
    return results


def train_epoch(cfg: DictConfig, model, optimizer, loader: DataLoader, schedule: attention.KLSchedule, extra: dict,
                ss_prob: float, pad: int, desc: str, progress: bool, runtime: Optional[Runtime] = None) -> dict:
    """One pass over ``loader``; returns the epoch's mean loss, NLL and KL."""
    runtime = runtime or Runtime(torch.device("cpu"))
    model.train()
    totals = {"train/loss": 0.0, "train/nll": 0.0, "train/kl": 0.0}
    batches = 0
    collect_kl = cfg.kl.weight > 0
    for batch in console.progress(loader, desc=desc, enabled=progress):
        batch = runtime.to_device(batch)
        optimizer.zero_grad(set_to_none=True)
        with runtime.autocast(), attention.aux_losses() if collect_kl else nullcontext() as aux:
            log_probs = model(batch["features"], batch["mask"], batch["captions"], ss_prob)
        nll = caption_nll(log_probs, batch["captions"], pad)
        steps = log_probs.shape[1]
        kl = aux.total() / steps if aux is not None else torch.zeros((), device=nll.device)
        loss = nll + schedule(extra["iteration"]) * kl
        clip_value = cfg.optim.grad_clip_value
        runtime.backward_step(loss, optimizer,
                              clip=lambda: torch.nn.utils.clip_grad_value_(model.parameters(), clip_value))
        extra["iteration"] += 1
        batches += 1
        for key, value in (("train/loss", loss.detach()), ("train/nll", nll.detach()), ("train/kl", kl.detach())):
            totals[key] = totals[key] + value  # on the device: read once, at the end of the epoch
    return {key: float(value) / max(batches, 1) for key, value in totals.items()}


def _check_resumable(checkpointer: Checkpointer, config: dict) -> None:
    """A run directory resumes only with the config that started it."""
    paths = checkpointer.paths()
    if paths:
        saved = torch.load(paths[-1], map_location="cpu", weights_only=False)["extra"]["config"]
        check_resumable(saved, config, RESUMABLE_KEYS, paths[-1].parent.parent)
