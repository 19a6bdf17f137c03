"""A few translation updates and a validation through ``mt.train``'s CLI, on any device and precision
(shared by the mixed-precision tests and the CUDA tests)."""
from __future__ import annotations

from pathlib import Path

from common.utils import read_metrics
from mt import train

TINY = {
    "lstm": ["--preset", "lstm-cpu", "model.emb_dim=32", "model.enc_hidden=32", "model.dec_hidden=32",
             "model.attn_hidden=32", "model.normalizer=bam-wc", "kl.weight=0.5"],
    "transformer": ["--preset", "transformer-cpu", "model.dim=32", "model.heads=2", "model.ffn_dim=64",
                    "model.enc_layers=2", "model.dec_layers=2", "schedule.warmup=2",
                    "model.encoder_attention={normalizer: bam-wc, cross_layer: {kind: evolving, alpha: 0.5, beta: 0.5}}",
                    "kl.weight=0.5"],
}


def train_probe(root: Path, work: Path, arch: str = "lstm", device: str = "cpu", precision: str = "fp32",
                steps: int = 6, extra=()) -> dict:
    """Per-update training CE of ``steps`` updates (no dropout), then the validation loss."""
    out = work / f"{arch}-{device.replace(':', '')}-{precision}"
    args = [*TINY[arch], "--out", str(out), "--data-root", str(root), "--device", device, "--no-progress",
            f"prepared_dir={work / 'prep'}", "batching.max_tokens=120", "data.num_merges=40", "model.dropout=0",
            f"train.max_steps={steps}", f"train.eval_every={steps}", "train.log_every=1", "train.patience=0",
            f"train.precision={precision}", "eval.valid_bleu_sentences=4", "eval.beam=1", "eval.batch_sentences=6",
            *extra]
    assert train.main(args) == 0
    metrics = read_metrics(out / "metrics.jsonl")
    return {"losses": [m["train/ce"] for m in metrics if "train/ce" in m],
            "eval": [m["val/loss"] for m in metrics if "val/loss" in m][-1], "out": out}
