"""Fine-tuning LXMERT: the work behind ``python -m vqa.lxmert.train`` (:mod:`vqa.lxmert.train` parses the
command line and checks the config before this module, torch, transformers and the model are imported).

Variants (``vqa/configs/lxmert.yaml``): ``softmax``, ``span``, ``entmax``, ``layerdrop``, ``bam``.
The loss is LXMERT's ``A * BCE`` on the soft scores over the ``A`` answers, plus the adaptive-span
penalty and the weighted BAM KL, both collected with :func:`common.attention.aux_losses`; span
fractions are clamped to ``[0, 1]`` after every update. Training data is reshuffled every epoch
(a fixed permutation per ``seed`` and epoch, so a resumed run sees the same batches); LayerDrop
and BAM sampling act in training mode only, and evaluation prunes ``layerdrop.<stack>`` layers per
stack with the every-other rule when ``model.prune_at_eval``.

Everything goes to ``out_dir`` (default ``runs/lxmert/<variant>``): ``config.json``,
``lxmert_config.json``, ``answers.json``, ``pretrained.json`` (what the checkpoint supplied),
``checkpoints/step_<N>.pt`` (atomic, every
``train.checkpoint_every`` updates and at each epoch end; a rerun resumes from the newest),
``metrics.jsonl`` + TensorBoard (losses, learning rate, every head's span and alpha),
``spans.png`` / ``alphas.png`` (the paper's Figures 1 and 3), the eval split's predictions in the
official results format, and ``results.json`` (accuracy per epoch, FLOPs full and pruned, config,
library versions).

``--device``, ``train.precision`` and ``train.compile`` choose where and how it computes
(:mod:`common.utils.runtime`); a checkpoint resumes on any device.

``--demo`` (:func:`write_demo_data`) fine-tunes a tiny LXMERT from random weights on synthetic data.
"""
from __future__ import annotations

import json
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from common import attention
from common.utils import (
    Checkpointer, MetricsLogger, atomic_write_json, atomic_write_text, console, environment, results_record,
    seed_everything,
)
from common.utils.config import check_resumable, to_dict
from common.utils.runtime import Runtime
from vqa.answers import AnswerVocab, answers_of
from vqa.data import VQADataError, VQADataset, data_path, load_split
from vqa.evaluation import vqa_accuracy, write_submission

from .answer_head import load_answer_table, transfer_answer_head
from .config import default_out_dir
from .data import bert_encoder, model_inputs
from .flops import count_flops, dummy_inputs
from .optim import build_optimizer
from .plots import plot_head_values

if TYPE_CHECKING:  # transformers and the model are imported once the command line and config have been checked
    from .adapt import Adaptation

#: keys that may change when a run is resumed (where files go, speed and logging knobs)
RESUMABLE_KEYS = ("data_root", "out_dir", "device", "model.pretrained", "train.max_steps", "train.num_workers",
                  "train.num_threads", "train.eval_batch_size", "train.log_every", "train.checkpoint_every",
                  "train.precision", "train.compile")
PACKAGES = ("attention-suite", "torch", "transformers", "torch-optimizer", "entmax", "h5py", "numpy", "omegaconf")


def write_demo_data(cfg: DictConfig) -> None:
    """``--demo``'s inputs under ``data_root``: the synthetic questions, features and answers of
    :func:`vqa.fixtures.write_demo_data`, and a word-piece vocabulary that ``model.random_init`` covers."""
    from vqa.fixtures import write_demo_data as write_data, write_wordpiece_vocab

    fixture = write_data(cfg.data_root, cfg.model.random_init.visual_feat_dim)
    size = write_wordpiece_vocab(data_path(cfg, cfg.data.vocab), list(fixture.questions.values()))
    if size > cfg.model.random_init.vocab_size:
        raise ValueError(f"model.random_init.vocab_size={cfg.model.random_init.vocab_size} is smaller than the "
                         f"demo's {size} word pieces; set model.random_init.vocab_size={size} or more")


def adaptation_of(cfg: DictConfig) -> Adaptation:
    from .adapt import Adaptation

    return Adaptation.from_dict(to_dict(cfg.model.adaptation))


def check_run_inputs(cfg: DictConfig, resuming: bool) -> None:
    """One error naming every input file of the run that is missing (answers, word pieces, the splits'
    questions, annotations and features, pretrained weights, answer table), each with its fix.
    A resumed run takes the answers and every weight from its own directory."""
    from common.utils.paths import check_inputs
    from vqa.answers import ANSWERS_FIX
    from vqa.data import split_inputs

    from .answer_head import ANSWER_TABLE_FIX
    from .data import VOCAB_FIX
    from .model import PRETRAINED_FIX

    pretrained = not resuming and cfg.model.random_init is None
    splits = dict.fromkeys([*cfg.data.train_splits, *([cfg.data.eval_split] if cfg.data.eval_split else [])])
    check_inputs([
        ("data.answers", None if resuming else data_path(cfg, cfg.data.answers), ANSWERS_FIX),
        ("data.vocab", data_path(cfg, cfg.data.vocab), VOCAB_FIX),
        *(entry for name in splits for entry in split_inputs(cfg, name)),
        ("model.pretrained", data_path(cfg, cfg.model.pretrained) / "config.json" if pretrained else None,
         PRETRAINED_FIX),
        ("model.answer_table", data_path(cfg, cfg.model.answer_table) if pretrained else None, ANSWER_TABLE_FIX),
    ])


def prepare_model(cfg: DictConfig, out_dir: Path, answers: AnswerVocab, resuming: bool):
    """The adapted model and its load report (None when resuming or randomly initialised)."""
    from transformers import LxmertConfig

    from .model import build_vqa_model, load_vqa_model

    adaptation = adaptation_of(cfg)
    if resuming:  # the checkpoint holds every weight; the pretrained directory is not needed
        config = LxmertConfig.from_dict(json.loads((out_dir / "lxmert_config.json").read_text()))
        return build_vqa_model(config, len(answers), adaptation), None
    if cfg.model.random_init is not None:
        model = build_vqa_model(LxmertConfig(**to_dict(cfg.model.random_init)), len(answers), adaptation)
        return model, None
    pretrained = data_path(cfg, cfg.model.pretrained)
    model, report = load_vqa_model(pretrained, len(answers), adaptation)
    if cfg.model.answer_table:
        table = load_answer_table(data_path(cfg, cfg.model.answer_table))
        report.answers_from_pretraining, _ = transfer_answer_head(model, pretrained, table, answers.answers)
    return model, report


@torch.no_grad()
def predict(model, loader: DataLoader, runtime: Runtime, prune: bool, adaptation: Adaptation,
            progress: bool = True) -> Tuple[List[int], torch.Tensor]:
    """Question ids and answer logits of every question in ``loader`` (eval mode, pruned if asked)."""
    from .adapt import pruned_layers

    model.eval()
    ids, logits = [], []
    context = pruned_layers(model, adaptation.layerdrop) if prune and adaptation.layerdrop.active else nullcontext()
    with context, runtime.autocast():
        for batch in console.progress(loader, desc="eval batch", enabled=progress):
            logits.append(model(**model_inputs(batch, runtime.device)).question_answering_score.float().cpu())
            ids += batch["question_id"].tolist()
    return ids, torch.cat(logits)


def measure_flops(model, cfg: DictConfig, adaptation: Adaptation, device: torch.device) -> Dict[str, int]:
    """FLOPs of one question with ``data.max_words`` word pieces and ``data.max_regions`` regions."""
    inputs = {k: v.to(device) for k, v in dummy_inputs(model.config, 1, cfg.data.max_words,
                                                       cfg.data.max_regions).items()}
    flops = {"full": count_flops(model, inputs)}
    if adaptation.layerdrop.active:
        flops["pruned"] = count_flops(model, inputs, adaptation.layerdrop)
    return flops


def _own_generator(seed: int) -> torch.Generator:
    """A DataLoader's own generator: iterating it then draws nothing from the global generator, so
    evaluation and a resumed epoch leave the training randomness (dropout, LayerDrop) as it was."""
    return torch.Generator().manual_seed(seed)


def _batches(size: int, batch_size: int, seed: int, epoch: int) -> List[List[int]]:
    """The epoch's shuffled batches (full batches only), fixed by ``seed`` and ``epoch``."""
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(size // batch_size)]


def run(cfg: DictConfig, progress: bool = True) -> Dict:
    """Train (or resume) the run described by ``cfg``; returns its results record."""
    from common.utils.updates import full_batches

    from .model import head_parameters, vqa_loss

    runtime = Runtime.create(cfg.device, cfg.train.precision, cfg.train.compile, threads=cfg.train.num_threads)
    device = runtime.device
    seed_everything(cfg.seed, deterministic=cfg.train.deterministic)
    out_dir = default_out_dir(cfg)
    checkpointer = Checkpointer(out_dir, keep=2)
    resuming = bool(checkpointer.paths())
    config = to_dict(cfg)
    if resuming:
        saved = json.loads((out_dir / "config.json").read_text())
        check_resumable(saved, config, RESUMABLE_KEYS, out_dir)
    check_run_inputs(cfg, resuming)
    answers = AnswerVocab.load(out_dir / "answers.json" if resuming else data_path(cfg, cfg.data.answers))
    adaptation = adaptation_of(cfg)
    encode = bert_encoder(data_path(cfg, cfg.data.vocab), cfg.data.max_words)
    train_parts = [load_split(cfg, name) for name in cfg.data.train_splits]
    if any(annotations is None for _, annotations, _ in train_parts):
        raise VQADataError(f"data.train_splits {list(cfg.data.train_splits)} includes a split without annotations")
    train_set = torch.utils.data.ConcatDataset([
        VQADataset(qs, anns, store, answers, encode, pad_id=0, max_regions=cfg.data.max_regions)
        for qs, anns, store in train_parts])
    steps_per_epoch = full_batches(len(train_set), cfg.train.batch_size,
                                   f"training questions of data.train_splits {list(cfg.data.train_splits)}")
    collate = train_set.datasets[0].collate
    eval_loader = eval_annotations = None
    if cfg.data.eval_split:
        qs, eval_annotations, store = load_split(cfg, cfg.data.eval_split)
        if eval_annotations is None:
            raise VQADataError(f"data.eval_split={cfg.data.eval_split!r} has no annotations to score; evaluate it "
                               f"with python -m vqa.lxmert.evaluate --split {cfg.data.eval_split} after training")
        eval_set = VQADataset(qs, eval_annotations, store, answers, encode, 0, cfg.data.max_regions)
        eval_loader = DataLoader(eval_set, cfg.train.eval_batch_size, collate_fn=eval_set.collate,
                                 num_workers=cfg.train.num_workers, generator=_own_generator(cfg.seed),
                                 pin_memory=runtime.pin_memory)

    model, report = prepare_model(cfg, out_dir, answers, resuming)
    model.to(device)
    forward = runtime.compile(model)
    schedule_steps = steps_per_epoch * cfg.train.epochs  # AdamW's linear decay spans every epoch
    total_steps = min(schedule_steps, cfg.train.max_steps) if cfg.train.max_steps else schedule_steps
    optimizer, scheduler = build_optimizer(model, cfg.optim, schedule_steps)
    if not resuming:
        atomic_write_json(out_dir / "config.json", config)
        atomic_write_json(out_dir / "lxmert_config.json", model.config.to_dict())
        answers.save(out_dir / "answers.json")
        if report is not None:
            atomic_write_json(out_dir / "pretrained.json", asdict(report))
    state = checkpointer.load_latest(model, optimizer, scheduler, map_location=device, scaler=runtime.scaler)
    step = 0 if state is None else state["step"]
    history: List[Dict] = [] if state is None else state["extra"]["history"]
    # training time up to the resumed checkpoint, kept across resumptions
    train_seconds = 0.0 if state is None else state["extra"].get("train_seconds", 0.0)
    schedule = attention.KLSchedule.from_config(cfg.kl)
    collect = adaptation.span is not None or cfg.kl.weight > 0
    _drop_metrics_after(out_dir / "metrics.jsonl", step)  # logged by an interrupted attempt past its checkpoint
    logger = MetricsLogger(out_dir)
    if step == 0:
        logger.log(0, **head_parameters(model))
    start = tick = time.perf_counter()
    predictions = {}
    clip = (lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)) \
        if cfg.optim.grad_clip else None
    try:
        while step < total_steps:
            epoch, skip = divmod(step, steps_per_epoch)
            batches = _batches(len(train_set), cfg.train.batch_size, cfg.seed, epoch)[skip:]
            batches = batches[:total_steps - step]
            loader = DataLoader(train_set, batch_sampler=batches, collate_fn=collate, num_workers=cfg.train.num_workers,
                                generator=_own_generator(cfg.seed), pin_memory=runtime.pin_memory)
            model.train()
            bar = console.progress(loader, desc=f"epoch {epoch + 1}/{cfg.train.epochs} update", initial=skip,
                                   total=min(steps_per_epoch, skip + total_steps - step), enabled=progress)
            for batch in bar:
                optimizer.zero_grad(set_to_none=True)
                target = batch["target"].to(device, non_blocking=True)
                with runtime.autocast(), attention.aux_losses() if collect else nullcontext() as aux:
                    logits = forward(**model_inputs(batch, device)).question_answering_score
                terms = aux.by_name() if collect else {}
                bce = vqa_loss(logits.float(), target)
                kl_weight = schedule(step)
                span_penalty = terms.get("adaptive_span", torch.zeros((), device=device))
                kl = terms.get("bam_kl", torch.zeros((), device=device))
                loss = bce + span_penalty + kl_weight * kl
                runtime.backward_step(loss, optimizer, clip)
                scheduler.step()
                attention.clamp_spans(model)
                step += 1
                if step % cfg.train.log_every == 0:
                    logger.log(step, **{"train/loss": loss.item(), "train/bce": bce.item(),
                                        "train/span_penalty": span_penalty.item(), "train/kl": kl.item(),
                                        "train/kl_weight": kl_weight, "train/lr": scheduler.get_last_lr()[0]},
                               **head_parameters(model))
                    bar.set_postfix(bce=f"{bce.item():.3f}")  # a read per update would synchronise the host
                epoch_end = step % steps_per_epoch == 0 or step == total_steps
                if epoch_end:
                    row = {"epoch": epoch, "step": step, "train_bce_last": bce.item()}
                    logger.log(step, **head_parameters(model))
                    if eval_loader is not None:
                        ids, eval_logits = predict(model, eval_loader, runtime, cfg.model.prune_at_eval,
                                                   adaptation, progress)
                        predictions = answers_of(ids, eval_logits, answers)
                        row["eval"] = vqa_accuracy(eval_annotations, predictions).summary()
                        logger.log(step, **{"val/accuracy": row["eval"]["overall"]})
                        model.train()
                    history.append(row)
                    console.say(f"epoch {epoch + 1}/{cfg.train.epochs} (update {step}): train BCE {bce.item():.4f}"
                                + (f", {cfg.data.eval_split} accuracy {row['eval']['overall']:.2f}"
                                   if "eval" in row else ""))
                if epoch_end or step % cfg.train.checkpoint_every == 0:
                    train_seconds, tick = train_seconds + time.perf_counter() - tick, time.perf_counter()
                    checkpointer.save(step, model, optimizer, scheduler,
                                      extra={"history": history, "train_seconds": train_seconds},
                                      scaler=runtime.scaler)
            bar.close()
    finally:
        logger.close()
    plots = {kind: plot_head_values(out_dir / "metrics.jsonl", kind, out_dir / f"{kind}s.png")
             for kind in ("span", "alpha")}
    if predictions:
        write_submission(out_dir / f"{cfg.data.eval_split}_predictions.json", predictions)
    results = results_record(
        config, variant=cfg.variant, adaptation=adaptation.to_dict(), steps=step, epochs=history,
        final_eval=history[-1].get("eval") if history else None,
        flops_per_question=measure_flops(model, cfg, adaptation, device),
        parameters=sum(p.numel() for p in model.parameters()),
        pretrained=_load_summary(out_dir / "pretrained.json"),
        plots={k: str(v) for k, v in plots.items() if v is not None},
        train_seconds=train_seconds, wall_seconds_this_run=time.perf_counter() - start, runtime=runtime.describe(),
        checkpoint=str(checkpointer.paths()[-1]) if checkpointer.paths() else None)
    results["environment"]["packages"].update(_versions())
    atomic_write_json(out_dir / "results.json", results)
    return results


def _drop_metrics_after(path: Path, step: int) -> None:
    """Keep the ``metrics.jsonl`` records up to ``step``, the resumed checkpoint's (at a fresh start: none)."""
    if not path.is_file():
        return
    records = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in records if step and json.loads(line)["step"] <= step]
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def _load_summary(path: Path) -> Optional[Dict]:
    """What the first run of this ``out_dir`` loaded from the pretrained checkpoint (None: random start)."""
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    return {"checkpoint": report["checkpoint"], "tensors_loaded": report["loaded"],
            "unused_pretraining_heads": len(report["unused"]), "new": report["initialised"],
            "answers_from_pretraining": report["answers_from_pretraining"]}


def _versions() -> Dict[str, Optional[str]]:
    return environment(PACKAGES)["packages"]
