"""Two Att2in training epochs and a teacher-forced validation NLL, on any device and precision
(shared by the mixed-precision tests and the CUDA tests)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import DataLoader

from captioning import training
from captioning.config import data_path, load_config, prepared_dir
from captioning.data import CaptionCorpus, CaptionDataset, collate
from captioning.evaluate import load_checkpoint
from common.features import RegionFeatureStore
from common.utils import seed_everything
from common.utils.runtime import Runtime


def train_probe(root: Path, work: Path, overrides, device: str = "cpu", precision: str = "fp32",
                epochs: int = 2, extra=()) -> dict:
    """Per-epoch training loss of BAM-WC Att2in (no dropout), then the validation NLL of best.pt."""
    out = work / f"{device.replace(':', '')}-{precision}"
    cfg = load_config("bam-wc", [*overrides(root, out), f"train.epochs={epochs}", "eval.every=0", "eval.split=val",
                                 "eval.metrics=[cider]", "kl.warmup=0", "kl.schedule=constant", "kl.weight=0.5",
                                 *extra])
    runtime = Runtime(torch.device(device), precision)
    results = training.run(cfg, progress=False, runtime=runtime)
    return {"losses": [row["train/loss"] for row in results["history"]],
            "eval": validation_nll(out / "best.pt", cfg, runtime), "results": results, "out": out, "cfg": cfg}


@torch.no_grad()
def validation_nll(checkpoint: Path, cfg, runtime: Runtime) -> float:
    """Mean NLL per word of the validation captions under the checkpoint's model (eval mode)."""
    model, _, vocab = load_checkpoint(checkpoint)
    model.to(runtime.device).eval()
    corpus = CaptionCorpus(prepared_dir(cfg))
    store = RegionFeatureStore(data_path(cfg, cfg.data.features))
    dataset = CaptionDataset(corpus.split("val"), store, vocab, corpus.max_length, seq_per_img=1)
    seed_everything(0)  # the caption drawn per image
    total, batches = 0.0, 0
    for batch in DataLoader(dataset, batch_size=5, collate_fn=collate, generator=torch.Generator().manual_seed(0)):
        batch = runtime.to_device(batch)
        with runtime.autocast():
            log_probs = model(batch["features"], batch["mask"], batch["captions"])
        total += float(training.caption_nll(log_probs.float(), batch["captions"], vocab.pad))
        batches += 1
    return total / batches
