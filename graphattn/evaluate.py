"""Re-evaluate GAT checkpoints; optionally estimate uncertainty with Monte Carlo samples.

    python -m graphattn.evaluate runs/gat/Cora/bam-wc/seed0.pt [--mc-samples 20]
    python -m graphattn.evaluate runs/gat/Cora/bam-wc            # every seed*.pt in the directory

Without ``--mc-samples`` the model runs in eval mode (BAM: the posterior mean, i.e. softmax)
and the test accuracy must match the one stored at training time. With ``--mc-samples N`` the
test nodes are predicted N times with attention sampling on (and dropout, unless
``--no-mc-dropout``) and the report adds the MC accuracy, PAvPU (the BAM paper's t-test
version and the entropy-threshold version) and the expected calibration error.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
from omegaconf import OmegaConf

from common import attention
from common.metrics import expected_calibration_error, mean_probabilities, pavpu_entropy, pavpu_ttest
from common.utils import atomic_write_json, results_record, seed_everything
from common.utils.cli import add_runtime_options, runtime_from
from common.utils.runtime import DeviceError, Runtime

from .data import PlanetoidDataError, load_planetoid
from .train import build_model, evaluate_split, prepare_features, summarize


def evaluate_checkpoint(
    path: Path,
    data_root: Optional[str] = None,
    mc_samples: int = 0,
    mc_dropout: bool = True,
    p_threshold: float = 0.05,
    entropy_threshold: Optional[float] = None,
    seed: int = 0,
    data_cache: Optional[Dict] = None,
    runtime: Optional[Runtime] = None,
) -> Dict:
    """Metrics of one ``seed<k>.pt`` checkpoint on its dataset's test split.

    ``entropy_threshold`` defaults to half the maximum entropy, ``log(num_classes) / 2``.
    ``data_cache`` (a dict) keeps loaded datasets between calls. The model runs on
    ``runtime.device`` (default: the CPU), wherever the checkpoint was written.
    """
    runtime = runtime or Runtime(torch.device("cpu"))
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    cfg = OmegaConf.create(checkpoint["config"])
    data_cache = {} if data_cache is None else data_cache
    if cfg.dataset not in data_cache:
        root = data_root if data_root is not None else cfg.data_root
        data_cache[cfg.dataset] = load_planetoid(cfg.dataset, root).to(runtime.device)
    data = data_cache[cfg.dataset]
    model = build_model(cfg, data.num_features, data.num_classes)
    model.load_state_dict(checkpoint["model_state"])
    model.to(runtime.device)
    x = prepare_features(data, cfg)
    result = {"checkpoint": str(path), "dataset": cfg.dataset, "attention": cfg.attention.name,
              "seed": checkpoint["metrics"]["seed"],
              "test": evaluate_split(model, x, data.edge_index, data.y, data.test_mask, runtime),
              "stored_test_acc": checkpoint["metrics"]["test"]["acc"]}
    if mc_samples:
        if mc_samples < 2:
            raise ValueError("--mc-samples needs at least 2 samples for the t-test")
        seed_everything(seed)
        model.eval()
        with torch.no_grad(), attention.mc_sampling(model, dropout=mc_dropout), runtime.autocast():
            logits = torch.stack([model(x, data.edge_index)[data.test_mask].float() for _ in range(mc_samples)])
        logits = logits.cpu()
        targets = data.y[data.test_mask].cpu()
        probs = mean_probabilities(logits)
        threshold = entropy_threshold if entropy_threshold is not None else math.log(data.num_classes) / 2
        result["mc"] = {
            "samples": mc_samples, "dropout": mc_dropout,
            "acc": float((probs.argmax(-1) == targets).double().mean()),
            "pavpu_ttest": pavpu_ttest(logits, targets, p_threshold), "p_threshold": p_threshold,
            "pavpu_entropy": pavpu_entropy(logits, targets, threshold), "entropy_threshold": threshold,
            "ece": expected_calibration_error(probs, targets),
        }
    return result


def checkpoints_in(path: Path) -> List[Path]:
    """``path`` itself, or the ``seed*.pt`` files of a run directory (sorted by seed)."""
    if path.is_dir():
        found = sorted(path.glob("seed*.pt"), key=lambda p: int(p.stem[4:]))
        if not found:
            raise FileNotFoundError(f"no seed*.pt checkpoints in {path}; pass a checkpoint or a "
                                    f"python -m graphattn.train output directory")
        return found
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return [path]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphattn.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a seed<k>.pt file or a directory of them")
    parser.add_argument("--data-root", help="directory holding planetoid/ (default: the one used in training)")
    parser.add_argument("--mc-samples", type=int, default=0, help="Monte Carlo samples for uncertainty (0: none)")
    parser.add_argument("--no-mc-dropout", action="store_true",
                        help="sample attention only (default: also keep dropout on, MC dropout)")
    parser.add_argument("--p-threshold", type=float, default=0.05, help="t-test PAvPU: uncertain if p > this")
    parser.add_argument("--entropy-threshold", type=float, help="entropy PAvPU threshold in nats "
                                                                "(default log(classes)/2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Monte Carlo sampling")
    parser.add_argument("--out", type=Path, help="write the report JSON here")
    add_runtime_options(parser)
    args = parser.parse_args(argv)
    try:
        runtime = runtime_from(args)
        paths = checkpoints_in(args.checkpoint)
        reports, data_cache = [], {}
        for path in paths:
            report = evaluate_checkpoint(path, args.data_root, args.mc_samples, not args.no_mc_dropout,
                                         args.p_threshold, args.entropy_threshold, args.seed, data_cache, runtime)
            reports.append(report)
            mc = report.get("mc")
            print(f"{path}: test acc {100 * report['test']['acc']:.2f}"
                  + (f" | MC acc {100 * mc['acc']:.2f} PAvPU(t-test) {100 * mc['pavpu_ttest']:.2f} "
                     f"PAvPU(entropy) {100 * mc['pavpu_entropy']:.2f} ECE {100 * mc['ece']:.2f}" if mc else ""))
    except (FileNotFoundError, PlanetoidDataError, DeviceError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = {"test_acc": summarize([r["test"]["acc"] for r in reports])}
    if args.mc_samples:
        for key in ("acc", "pavpu_ttest", "pavpu_entropy", "ece"):
            summary[f"mc_{key}"] = summarize([r["mc"][key] for r in reports])
    if len(reports) > 1:
        print("mean +- std over checkpoints: " + ", ".join(f"{k} {v['mean']:.2f} +- {v['std']:.2f}"
                                                           for k, v in summary.items()))
    if args.out:
        atomic_write_json(args.out, results_record({"mc_samples": args.mc_samples,
                                                    "mc_dropout": not args.no_mc_dropout,
                                                    "p_threshold": args.p_threshold,
                                                    "entropy_threshold": args.entropy_threshold},
                                                   summary=summary, checkpoints=reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
