"""A few MCAN and LXMERT training updates and an evaluation on the VQA fixture, on any device and
precision (shared by the mixed-precision tests and the CUDA tests)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from common.utils import read_metrics
from common.utils.runtime import Runtime
from vqa import evaluate as vqa_evaluate
from vqa import train as vqa_train
from vqa.data import QuestionEncoder, VQADataset, data_path, load_split
from vqa.lxmert import evaluate as lxmert_evaluate
from vqa.lxmert import train as lxmert_train
from vqa.lxmert.data import bert_encoder
from vqa.lxmert.model import predict as lxmert_predict
from vqa.lxmert.prepare import adaptation_of
from vqa.predict import predict_logits

from .helpers import TINY

MCAN_SMALL = [f"model.{k}={v}" for k, v in TINY.items()] + ["model.dropout=0", "train.batch_size=10",
                                                           "train.eval_batch_size=25", "train.log_every=1"]
LXMERT_TINY = ("model.random_init={vocab_size: 48, hidden_size: 32, num_attention_heads: 2, intermediate_size: 64, "
               "l_layers: 2, x_layers: 1, r_layers: 1, visual_feat_dim: 16, hidden_dropout_prob: 0, "
               "attention_probs_dropout_prob: 0}")


def _bce(logits: torch.Tensor, loader: DataLoader) -> float:
    targets = torch.cat([batch["target"] for batch in loader])
    return float(F.binary_cross_entropy_with_logits(logits, targets))


def mcan_probe(root: Path, work: Path, device: str = "cpu", precision: str = "fp32", extra=()) -> dict:
    """Per-update BCE of one epoch of BAM-WC MCAN (no dropout), then the val BCE through vqa.evaluate."""
    out = work / f"mcan-{device.replace(':', '')}-{precision}"
    args = ["--data-root", str(root), "--out", str(out), "--attention", "bam-wc", "--no-progress", "--device", device,
            "--epochs", "1", "kl.weight=0.1", "kl.schedule=constant", f"train.precision={precision}", *MCAN_SMALL,
            *extra]
    assert vqa_train.main(args) == 0
    cfg, vocab, answers, model, _ = vqa_evaluate.load_run(out)
    runtime = Runtime(torch.device(device), precision)
    questions, annotations, store = load_split(cfg, "val")
    dataset = VQADataset(questions, annotations, store, answers, QuestionEncoder(vocab, cfg.data.max_question_len),
                         vocab.pad, cfg.data.max_regions)
    loader = DataLoader(dataset, 25, collate_fn=dataset.collate)
    _, logits = predict_logits(model.to(runtime.device), loader, runtime, progress=False)
    return {"losses": [m["train/bce"] for m in read_metrics(out / "metrics.jsonl") if "train/bce" in m],
            "eval": _bce(logits, loader), "out": out}


def lxmert_probe(root: Path, work: Path, device: str = "cpu", precision: str = "fp32", variant: str = "bam",
                 extra=()) -> dict:
    """Per-update BCE of a few updates of a tiny random LXMERT, then the val BCE of its evaluation."""
    out = work / f"lxmert-{variant}-{device.replace(':', '')}-{precision}"
    args = ["--variant", variant, "--data-root", str(root), "--out", str(out), "--no-progress", "--device", device,
            "data.answers=vqa/mcan/answer_dict.json", "data.vocab=vocab.txt", LXMERT_TINY, "train.batch_size=8",
            "train.log_every=1", "train.epochs=1", "optim.name=adamw", "optim.lr=1e-3", "kl.weight=0.1",
            f"train.precision={precision}", *extra]
    assert lxmert_train.main(args) == 0
    runtime = Runtime(torch.device(device), precision)
    cfg, answers, model, _ = lxmert_evaluate.load_run(out)
    model.to(runtime.device)
    questions, annotations, store = load_split(cfg, "val")
    dataset = VQADataset(questions, annotations, store, answers, bert_encoder(data_path(cfg, cfg.data.vocab),
                                                                              cfg.data.max_words), 0,
                         cfg.data.max_regions)
    loader = DataLoader(dataset, 16, collate_fn=dataset.collate)
    _, logits = lxmert_predict(model, loader, runtime, prune=False, adaptation=adaptation_of(cfg), progress=False)
    return {"losses": [m["train/bce"] for m in read_metrics(out / "metrics.jsonl") if "train/bce" in m],
            "eval": _bce(logits, loader), "out": out,
            "results": json.loads((out / "results.json").read_text())}
