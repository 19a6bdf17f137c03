"""Training MCAN: the work behind ``python -m vqa.train`` (:mod:`vqa.train` parses the command line and
checks the config before this module, torch and the model are imported).

Protocol of ``MILVLG/mcan-vqa`` (``core/exec.py``): BCE summed over the batch and the answers
on MCAN's soft scores (plus the weighted BAM KL), Adam (0.9, 0.98, eps 1e-9), lr warm-up
``1/4, 2/4, 3/4`` of the base rate over the first three epochs (per update), then times
``decay_rate`` from each epoch in ``decay_epochs``. After every epoch the model is evaluated
on ``data.eval_split`` (official accuracy) when that split has annotations.

Everything goes to ``out_dir`` (default ``runs/vqa/mcan/<attention>``): ``config.json``,
``question_vocab.json``, ``answers.json``, ``checkpoints/step_<epoch>.pt`` (atomic; a rerun
resumes after the last finished epoch), ``metrics.jsonl`` + TensorBoard, the eval split's
predictions in the official results format and ``results.json`` (accuracy per epoch, overall
and per answer type, wall time, config and library versions).

``--device``, ``train.precision`` and ``train.compile`` choose where and how it computes
(:mod:`common.utils.runtime`); a checkpoint resumes on any device.
"""
from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.utils.data import DataLoader, DistributedSampler

from common import attention
from common.text import Vocabulary
from common.utils import (
    Checkpointer, MetricsLogger, atomic_write_json, console, results_record, seed_everything,
)
from common.utils.config import check_resumable
from common.utils.distributed import DistEnv, all_reduce_mean, cleanup, shard_sampler, wrap_model
from common.utils.paths import check_inputs
from common.utils.runtime import Runtime

from .answers import ANSWERS_FIX, AnswerVocab, answers_of
from .config import default_out_dir, to_dict
from .data import (GLOVE_FIX, QuestionEncoder, VQADataError, VQADataset, build_question_vocab, data_path, load_glove,
                   load_split, split_inputs)
from .evaluation import vqa_accuracy, write_submission

if TYPE_CHECKING:  # the model is imported once the command line and config have been checked
    from .mcan import MCAN

#: Config keys that may change between a run and its resumption (where files go, speed knobs).
RESUMABLE_KEYS = ("data_root", "out_dir", "device", "train.epochs", "train.num_workers", "train.num_threads",
                  "train.eval_batch_size", "train.log_every", "train.precision", "train.compile")

def build_model(cfg: DictConfig, vocab_size: int, num_answers: int,
                word_vectors: Optional[torch.Tensor] = None) -> MCAN:
    from .mcan import MCAN, MCANConfig

    config = MCANConfig(vocab_size=vocab_size, num_answers=num_answers, attention=cfg.attention.name,
                        attention_options=dict(cfg.attention.options), **cfg.model)
    return MCAN(config, word_vectors)


def lr_factor(update: int, steps_per_epoch: int, warmup_epochs: int, decay_epochs: Sequence[int],
              decay_rate: float) -> float:
    """MCAN's learning-rate multiplier for the ``update``-th update (1-based).

    Warm-up (``WarmupOptimizer.rate``): ``k / (warmup_epochs + 1)`` while
    ``update <= k * steps_per_epoch`` for ``k = 1 .. warmup_epochs``; then
    ``decay_rate ** #{e in decay_epochs : e <= epoch}`` with ``epoch = (update - 1) // steps_per_epoch``.
    """
    warm = 1.0
    for k in range(1, warmup_epochs + 1):
        if update <= int(steps_per_epoch * k):
            warm = k / (warmup_epochs + 1)
            break
    epoch = (update - 1) // steps_per_epoch
    return warm * decay_rate ** sum(1 for e in decay_epochs if e <= epoch)


def model_inputs(batch: Dict) -> tuple:
    return batch["question_tokens"], batch["question_mask"], batch["features"], batch["region_mask"]


def add_feature_noise(features: torch.Tensor, region_mask: torch.Tensor, std: float,
                      generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``features + std * eps`` on the real regions, ``eps ~ N(0, 1)`` (BAM Table 2 "noisy");
    padded regions stay exact zeros."""
    if std == 0:
        return features
    noise = torch.randn(features.shape, generator=generator, dtype=features.dtype, device="cpu").to(features.device)
    return features + std * noise * region_mask.unsqueeze(-1)


@torch.no_grad()
def predict_logits(model: MCAN, loader: DataLoader, runtime: Runtime, noise_std: float = 0.0, seed: int = 0,
                   progress: bool = True, desc: str = "predict") -> Tuple[List[int], torch.Tensor]:
    """Question ids and answer logits ``[N, A]`` of every question in ``loader`` (eval mode)."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    ids, logits = [], []
    for batch in console.progress(loader, desc=f"{desc} batch", enabled=progress):
        batch = runtime.to_device(batch)
        features = add_feature_noise(batch["features"], batch["region_mask"], noise_std, generator)
        with runtime.autocast():
            out = model(batch["question_tokens"], batch["question_mask"], features, batch["region_mask"])
        logits.append(out.float().cpu())
        ids += batch["question_id"].tolist()
    return ids, torch.cat(logits)


def prepare_run(cfg: DictConfig, out_dir: Path, train_questions: Sequence[dict]) -> Tuple[Vocabulary, AnswerVocab]:
    """The question vocabulary and answers of the run: built on a fresh run (:func:`save_run` writes
    them), reloaded from ``out_dir`` on resumption so that ids never change."""
    config_path = out_dir / "config.json"
    if config_path.exists():
        saved = json.loads(config_path.read_text(encoding="utf-8"))
        check_resumable(saved, to_dict(cfg), RESUMABLE_KEYS, out_dir)
        return Vocabulary.load(out_dir / "question_vocab.json"), AnswerVocab.load(out_dir / "answers.json")
    answers = AnswerVocab.load(data_path(cfg, cfg.data.answers))
    return build_question_vocab(train_questions, cfg.data.min_word_count), answers


def check_run_inputs(cfg: DictConfig, resuming: bool, fresh: bool) -> None:
    """One error naming every input file of the run that is missing (answers, the splits' questions,
    annotations and features, GloVe), each with its config key and fix. A resumed run (``config.json``
    written) takes its answers from its own directory, and one with a checkpoint (not ``fresh``) its embeddings."""
    splits = dict.fromkeys([*cfg.data.train_splits, *([cfg.data.eval_split] if cfg.data.eval_split else [])])
    check_inputs([
        ("data.answers", None if resuming else data_path(cfg, cfg.data.answers), ANSWERS_FIX),
        *(entry for name in splits for entry in split_inputs(cfg, name)),
        ("data.glove", data_path(cfg, cfg.data.glove) if fresh else None, GLOVE_FIX),
    ])


def save_run(cfg: DictConfig, out_dir: Path, vocab: Vocabulary, answers: AnswerVocab) -> None:
    """``config.json``, ``question_vocab.json`` and ``answers.json`` of a fresh run, written once
    everything that can fail before training has passed (a failed start leaves no run folder)."""
    if not (out_dir / "config.json").exists():
        vocab.save(out_dir / "question_vocab.json")
        answers.save(out_dir / "answers.json")
        atomic_write_json(out_dir / "config.json", to_dict(cfg))


def word_vectors(cfg: DictConfig, vocab: Vocabulary, env: DistEnv) -> torch.Tensor:
    """GloVe vectors for ``vocab`` from ``data.glove``, checked against ``model.word_dim``."""
    vectors, coverage = load_glove(data_path(cfg, cfg.data.glove), vocab)
    if vectors.shape[1] != cfg.model.word_dim:
        raise VQADataError(f"{cfg.data.glove}: vectors have {vectors.shape[1]} dimensions but "
                           f"model.word_dim={cfg.model.word_dim}; set model.word_dim={vectors.shape[1]}")
    if env.is_main:
        console.say(f"GloVe: vectors for {100 * coverage:.1f}% of {len(vocab)} question words")
    return vectors


def evaluate_epoch(model: MCAN, loader: DataLoader, annotations: List[dict], answers: AnswerVocab,
                   runtime: Runtime, progress: bool) -> Tuple[Dict, Dict[int, str]]:
    ids, logits = predict_logits(model, loader, runtime, progress=progress, desc="eval")
    predictions = answers_of(ids, logits, answers)
    return vqa_accuracy(annotations, predictions).summary(), predictions


def train_epoch(ddp_model, loader: DataLoader, optimizer, scheduler, schedule: attention.KLSchedule,
                collect_kl: bool, update: int, cfg: DictConfig, runtime: Runtime, logger: MetricsLogger,
                progress: bool, desc: str) -> Tuple[Dict[str, float], int]:
    """One pass over ``loader``: summed BCE (+ weighted KL) per batch, Adam and scheduler steps.

    Returns this process's sums (``bce``, ``kl`` weighted by batch size, ``n`` questions) and the
    update count after the epoch. The losses are summed on the device and read back only at the
    ``log_every`` updates and at the end (a read per update would synchronise the host with the GPU).
    """
    ddp_model.train()
    env, device = runtime.env, runtime.device
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # summed BCE, summed size-weighted KL
    sums = {"n": 0}
    bar = console.progress(loader, desc=f"{desc} batch", enabled=progress)
    clip = (lambda: torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), cfg.optim.grad_clip)) \
        if cfg.optim.grad_clip else None
    for batch in bar:
        batch = runtime.to_device(batch)
        runtime.begin_step()
        optimizer.zero_grad(set_to_none=True)
        with runtime.autocast(), attention.aux_losses() if collect_kl else nullcontext() as aux:
            logits = ddp_model(*model_inputs(batch))
        kl, kl_weight = (aux.total(), schedule(update)) if collect_kl else (torch.zeros((), device=device), 0.0)
        bce = F.binary_cross_entropy_with_logits(logits.float(), batch["target"], reduction="sum")
        # DDP averages gradients over processes: scale the summed BCE so the update is that of
        # the BCE summed over the global batch, as MCAN's single-process loss.
        loss = bce * env.world_size + kl_weight * kl
        runtime.backward_step(loss, optimizer, clip)
        scheduler.step()
        update += 1
        size = batch["target"].shape[0]
        totals += torch.stack([bce.detach(), kl.detach() * size]).double()
        sums["n"] += size
        if update % cfg.train.log_every == 0:
            logger.log(update, **{"train/bce": all_reduce_mean(bce.detach() / size, env),
                                  "train/kl": all_reduce_mean(kl.detach(), env), "train/kl_weight": kl_weight,
                                  "train/lr": scheduler.get_last_lr()[0]})
            bar.set_postfix(bce=f"{bce.item() / size:.3f}")
    bar.close()
    sums["bce"], sums["kl"] = totals.tolist()
    return sums, update


def run(cfg: DictConfig, progress: bool = True) -> Dict:
    """Train (or resume) the run described by ``cfg``; returns the results record."""
    from common.utils.updates import full_batches

    runtime = Runtime.create(cfg.device, cfg.train.precision, cfg.train.compile, threads=cfg.train.num_threads,
                             distributed=True)
    env = runtime.env
    seed_everything(cfg.seed + env.rank, deterministic=cfg.train.deterministic)
    out_dir = default_out_dir(cfg)
    checkpointer = Checkpointer(out_dir, keep=2)
    fresh = not checkpointer.paths()  # a resumed model gets its embeddings from the checkpoint
    check_run_inputs(cfg, resuming=(out_dir / "config.json").exists(), fresh=fresh)

    train_parts = [load_split(cfg, name) for name in cfg.data.train_splits]
    if any(annotations is None for _, annotations, _ in train_parts):
        raise VQADataError(f"data.train_splits {list(cfg.data.train_splits)} includes a split without annotations")
    # MCAN drops each process's last partial batch (drop_last below)
    full_batches(sum(len(qs) for qs, _, _ in train_parts), cfg.train.batch_size,
                 f"training questions of data.train_splits {list(cfg.data.train_splits)}", env.world_size)
    vocab, answers = prepare_run(cfg, out_dir, [q for qs, _, _ in train_parts for q in qs])
    encode = QuestionEncoder(vocab, cfg.data.max_question_len)
    question_len = cfg.data.max_question_len if runtime.fixed_shapes else None  # one shape: one CUDA graph
    train_set = torch.utils.data.ConcatDataset([
        VQADataset(qs, anns, store, answers, encode, pad_id=vocab.pad, max_regions=cfg.data.max_regions,
                   question_len=question_len)
        for qs, anns, store in train_parts])
    collate = train_set.datasets[0].collate
    eval_loader, eval_annotations = None, None
    if cfg.data.eval_split and env.is_main:
        qs, eval_annotations, store = load_split(cfg, cfg.data.eval_split)
        if eval_annotations is not None:
            eval_set = VQADataset(qs, eval_annotations, store, answers, encode, vocab.pad, cfg.data.max_regions,
                                  question_len)
            eval_loader = DataLoader(eval_set, cfg.train.eval_batch_size, collate_fn=eval_set.collate,
                                     num_workers=cfg.train.num_workers, pin_memory=runtime.pin_memory)

    vectors = word_vectors(cfg, vocab, env) if cfg.data.glove and fresh else None
    model = build_model(cfg, len(vocab), len(answers), vectors).to(env.device)
    collect_kl = cfg.kl.weight > 0
    if not collect_kl:  # BAM's contextual prior only feeds the KL: frozen, so DDP waits on no unused parameter
        for module in model.modules():
            if isinstance(module, attention.ContextualPrior):
                module.requires_grad_(False)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps)
    steps_per_epoch = max(1, len(train_set) // (cfg.train.batch_size * env.world_size))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(
        step + 1, steps_per_epoch, cfg.optim.warmup_epochs, list(cfg.optim.decay_epochs), cfg.optim.decay_rate))
    state = checkpointer.load_latest(model, optimizer, scheduler, map_location=env.device, scaler=runtime.scaler)
    start_epoch = 0 if state is None else state["step"] + 1
    history: List[Dict] = [] if state is None else state["extra"]["history"]
    ddp_model = runtime.compile(wrap_model(model, env))
    schedule = attention.KLSchedule.from_config(cfg.kl)
    # One process reads the same permutation as the shards of N processes put together, so a
    # run on N processes with batch B sees the global batches of one process with batch N * B.
    sampler = shard_sampler(train_set, env, shuffle=True, seed=cfg.seed) or DistributedSampler(
        train_set, num_replicas=1, rank=0, shuffle=True, seed=cfg.seed)
    if env.is_main:
        save_run(cfg, out_dir, vocab, answers)
    logger = MetricsLogger(out_dir, enabled=env.is_main)
    start, trained_questions, train_seconds = time.perf_counter(), 0, 0.0
    predictions: Dict[int, str] = {}
    update = start_epoch * steps_per_epoch
    try:
        for epoch in range(start_epoch, cfg.train.epochs):
            sampler.set_epoch(epoch)
            loader = DataLoader(train_set, cfg.train.batch_size, sampler=sampler, collate_fn=collate,
                                num_workers=cfg.train.num_workers, drop_last=True, pin_memory=runtime.pin_memory)
            epoch_start = time.perf_counter()
            sums, update = train_epoch(ddp_model, loader, optimizer, scheduler, schedule, collect_kl, update, cfg,
                                       runtime, logger, progress and env.is_main,
                                       f"epoch {epoch + 1}/{cfg.train.epochs}")
            seconds = time.perf_counter() - epoch_start
            trained_questions += sums["n"] * env.world_size
            train_seconds += seconds
            row = {"epoch": epoch, "train_bce_per_question": sums["bce"] / max(sums["n"], 1),
                   "train_kl": sums["kl"] / max(sums["n"], 1), "seconds": seconds,
                   "lr": scheduler.get_last_lr()[0]}
            if eval_loader is not None:
                accuracy, predictions = evaluate_epoch(model, eval_loader, eval_annotations, answers, runtime,
                                                       progress)
                row["eval"] = accuracy
                logger.log(update, **{"val/accuracy": accuracy["overall"],
                                      **{f"val/{k}": v for k, v in accuracy["per_answer_type"].items()}})
            history.append(row)
            if env.is_main:
                checkpointer.save(epoch, model, optimizer, scheduler, extra={"history": history}, scaler=runtime.scaler)
                console.say(f"epoch {epoch + 1}/{cfg.train.epochs}: train BCE/question "
                            f"{row['train_bce_per_question']:.4f}, {seconds:.0f} s"
                            + (f", {cfg.data.eval_split} accuracy {row['eval']['overall']:.2f}"
                               if "eval" in row else ""))
    finally:
        logger.close()
        del ddp_model
        cleanup(env)
    if predictions and env.is_main:
        write_submission(out_dir / f"{cfg.data.eval_split}_predictions.json", predictions)
    results = results_record(
        to_dict(cfg), attention=cfg.attention.name, epochs=history,
        final_eval=history[-1].get("eval") if history else None,
        questions_per_second_train=trained_questions / train_seconds if train_seconds else None,
        train_seconds=sum(row["seconds"] for row in history),  # every epoch's, resumed ones included
        wall_seconds_this_run=time.perf_counter() - start, world_size=env.world_size, runtime=runtime.describe(),
        checkpoint=str(checkpointer.paths()[-1]) if checkpointer.paths() else None)
    if env.is_main:
        atomic_write_json(out_dir / "results.json", results)
    return results
