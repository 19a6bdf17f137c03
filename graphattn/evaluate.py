"""Re-evaluate GAT checkpoints; optionally estimate uncertainty with Monte Carlo samples.

    python -m graphattn.evaluate runs/gat/Cora/bam-wc/seed0.pt [--mc-samples 20]
    python -m graphattn.evaluate runs/gat/Cora/bam-wc            # every seed*.pt in the directory

Without ``--mc-samples`` the model runs in eval mode (BAM: the posterior mean, i.e. softmax)
and the test accuracy must match the one stored at training time. With ``--mc-samples N`` the
test nodes are predicted N times with attention sampling on (and dropout, unless
``--no-mc-dropout``) and the report adds the MC accuracy, PAvPU (the BAM paper's t-test
version and the entropy-threshold version) and the expected calibration error.

A ``seed<k>.pt`` is written when its seed's training ends, so every checkpoint scored is a finished seed; the
seeds of the run (its config's ``seeds`` from ``first_seed``) that have none are named as unfinished, on the
terminal and in the report (``finished`` per checkpoint, ``unfinished_seeds``).

The report goes to ``<run>/evaluation[_seed<k>][_mc<N>].json`` (or ``--out``) and the
reliability diagram of the test predictions of every checkpoint together (MC-mean
probabilities with ``--mc-samples``, else the eval-mode ones) next to it as
``..._reliability.png``. What the numbers mean is printed with them:

* **ECE** (expected calibration error, %): the gap between confidence (the top class's
  probability) and accuracy, averaged over 15 equal-width confidence bins weighted by their
  share of nodes; 0 is calibrated. Confidence below accuracy is *underconfidence*.
* **PAvPU** (%): the share of test nodes that are accurate and certain or inaccurate and
  uncertain. *t-test*: a node is uncertain when a paired t-test between its two top classes'
  MC logits cannot reject equal means (p > ``--p-threshold``, 0.05). *entropy*: uncertain when
  the entropy of its MC-mean prediction exceeds ``--entropy-threshold`` nats (default half the
  maximum, ``log(classes) / 2``: 0.97 nats on Cora's 7 classes). When (nearly) every node is
  uncertain, PAvPU(entropy) is the error rate.

A GAT trained with dropout 0.6 on its inputs and attention coefficients is underconfident
under MC dropout: each sample drops most of a node's neighbourhood, so the averaged
prediction is much flatter than the accuracy warrants (high ECE, and most nodes above the
entropy threshold). ``--no-mc-dropout`` samples the attention only.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from common import attention, metrics
from common.utils import atomic_write_json, console
from common.utils.cli import add_runtime_options, runtime_from

if TYPE_CHECKING:  # torch, PyG and the model are imported once the command line has been checked
    from common.utils.runtime import Runtime


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
    predictions: Optional[List] = None,
) -> Dict:
    """Metrics of one ``seed<k>.pt`` checkpoint on its dataset's test split.

    ``entropy_threshold`` defaults to half the maximum entropy, ``log(num_classes) / 2``.
    ``data_cache`` (a dict) keeps loaded datasets between calls. The model runs on
    ``runtime.device`` (default: the CPU), wherever the checkpoint was written.
    ``predictions`` (a list), if given, receives ``(probabilities [N, C], targets [N])`` of the
    test nodes: the MC mean with ``mc_samples``, else the eval-mode softmax.
    """
    import torch

    from common.utils import seed_everything
    from common.utils.runtime import Runtime

    from .models import build_model, evaluate_split, prepare_features

    runtime = runtime or Runtime(torch.device("cpu"))
    checkpoint = load_checkpoint(path)
    cfg = OmegaConf.create(checkpoint["config"])
    data_cache = {} if data_cache is None else data_cache
    if cfg.dataset not in data_cache:
        root = data_root if data_root is not None else cfg.data_root
        from .data import load_dataset

        data_cache[cfg.dataset] = load_dataset(cfg.dataset, root).to(runtime.device)
    data = data_cache[cfg.dataset]
    model = build_model(cfg, data.num_features, data.num_classes)
    model.load_state_dict(checkpoint["model_state"])
    model.to(runtime.device)
    x = prepare_features(data, cfg)
    result = {"checkpoint": str(path), "dataset": cfg.dataset, "attention": cfg.attention.name,
              "seed": checkpoint["metrics"]["seed"],
              "test": evaluate_split(model, x, data.edge_index, data.y, data.test_mask, runtime),
              "stored_test_acc": checkpoint["metrics"]["test"]["acc"]}
    targets = data.y[data.test_mask].cpu()
    if not mc_samples and predictions is not None:
        model.eval()
        with torch.no_grad(), runtime.autocast():
            logits = model(x, data.edge_index)[data.test_mask].float().cpu()
        predictions.append((logits.softmax(-1), targets))
    if mc_samples:
        if mc_samples < 2:
            raise ValueError("--mc-samples needs at least 2 samples for the t-test")
        seed_everything(seed)
        model.eval()
        with torch.no_grad(), attention.mc_sampling(model, dropout=mc_dropout), runtime.autocast():
            logits = torch.stack([model(x, data.edge_index)[data.test_mask].float() for _ in range(mc_samples)])
        logits = logits.cpu()
        probs = metrics.mean_probabilities(logits)
        threshold = entropy_threshold if entropy_threshold is not None else math.log(data.num_classes) / 2
        result["mc"] = {
            "samples": mc_samples, "dropout": mc_dropout, "dropout_p": cfg.model.dropout if mc_dropout else 0.0,
            "acc": float((probs.argmax(-1) == targets).double().mean()),
            "mean_confidence": float(probs.max(-1).values.double().mean()),
            "pavpu_ttest": metrics.pavpu_ttest(logits, targets, p_threshold), "p_threshold": p_threshold,
            "uncertain_ttest": float(metrics.ttest_uncertain(logits, p_threshold).double().mean()),
            "pavpu_entropy": metrics.pavpu_entropy(logits, targets, threshold), "entropy_threshold": threshold,
            "uncertain_entropy": float((metrics.predictive_entropy(probs) > threshold).double().mean()),
            "ece": metrics.expected_calibration_error(probs, targets),
        }
        if predictions is not None:
            predictions.append((probs, targets))
    return result


def load_checkpoint(path: Path) -> Dict:
    """A ``seed<k>.pt`` written by ``graphattn.train``; a clear error for any other file."""
    hint = f"pass a seed<k>.pt checkpoint or the python -m graphattn.train output directory ({path.parent})"
    if path.suffix != ".pt":
        raise ValueError(f"{path} is not a checkpoint: {hint}")
    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # unpickling errors of a truncated or foreign file
        raise ValueError(f"{path} is not a readable checkpoint ({type(err).__name__}): {hint}") from err
    if not isinstance(checkpoint, dict) or not {"model_state", "config", "metrics"} <= set(checkpoint):
        raise ValueError(f"{path} is not a graphattn.train seed checkpoint: {hint}")
    return checkpoint


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


def report_paths(target: Path, mc_samples: int, out: Optional[Path] = None) -> tuple[Path, Path]:
    """The report JSON and reliability PNG: ``out`` if given, else ``evaluation[_seed<k>][_mc<N>]``
    in the run directory (that of ``target`` when it is a checkpoint)."""
    if out is None:
        stem = "evaluation" + ("" if target.is_dir() else f"_{target.stem}") + (f"_mc{mc_samples}" if mc_samples else "")
        out = (target if target.is_dir() else target.parent) / f"{stem}.json"
    return out, out.with_name(f"{out.stem}_reliability.png")


def explain(summary: Dict, reports: List[Dict], mc_samples: int, pooled_confidence: float) -> List[str]:
    """What the printed metrics mean, with this evaluation's numbers (see the module docstring)."""
    acc = summary["mc_acc"]["mean"] if mc_samples else summary["test_acc"]["mean"]
    source = f"MC-mean ({mc_samples} samples)" if mc_samples else "eval-mode"
    ece = summary["mc_ece" if mc_samples else "ece"]["mean"]
    lines = [f"ECE {ece:.2f}: the confidence-accuracy gap over 15 confidence bins (0 = calibrated); "
             f"mean confidence of the {source} predictions {100 * pooled_confidence:.1f}% vs accuracy {acc:.1f}%"
             + (" (underconfident)" if 100 * pooled_confidence < acc - 1 else
                " (overconfident)" if 100 * pooled_confidence > acc + 1 else "") + "."]
    if mc_samples:
        mc = reports[0]["mc"]
        lines.append(
            "PAvPU: the share of nodes accurate-and-certain or inaccurate-and-uncertain. Uncertain: t-test, "
            f"p > {mc['p_threshold']} between the top-2 classes' MC logits ({summary['uncertain_ttest']['mean']:.1f}% "
            f"of nodes); entropy, above {mc['entropy_threshold']:.3f} nats ({summary['uncertain_entropy']['mean']:.1f}% "
            "of nodes; when nearly all are, PAvPU(entropy) is the error rate).")
        if mc["dropout_p"]:
            lines.append(f"MC dropout keeps the training dropout on (p = {mc['dropout_p']} here), which flattens "
                         "the averaged predictions: --no-mc-dropout samples the attention only.")
    return lines


@console.interruptible
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphattn.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a python -m graphattn.train output directory or one of its "
                                                      "seed<k>.pt files")
    parser.add_argument("--data-root", help="directory holding planetoid/ (default: the one used in training)")
    parser.add_argument("--mc-samples", type=int, default=0, help="Monte Carlo samples for uncertainty (0: none)")
    parser.add_argument("--no-mc-dropout", action="store_true",
                        help="sample attention only (default: also keep dropout on, MC dropout)")
    parser.add_argument("--p-threshold", type=float, default=0.05, help="t-test PAvPU: uncertain if p > this")
    parser.add_argument("--entropy-threshold", type=float, help="entropy PAvPU threshold in nats "
                                                                "(default log(classes)/2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Monte Carlo sampling")
    parser.add_argument("--out", type=Path, help="the report JSON (default: evaluation[_seed<k>][_mc<N>].json in "
                                                 "the run directory; the reliability PNG goes next to it)")
    add_runtime_options(parser)
    args = parser.parse_args(argv)
    # the command line is valid: now torch, PyG and the model
    import torch

    from common.utils import results_record
    from common.utils.runs import ScoredSeed, mean_std, planned_seeds, print_unfinished, unfinished_seeds
    from common.utils.runtime import DeviceError

    try:
        if args.mc_samples < 0:
            raise ValueError(f"--mc-samples {args.mc_samples}: expected 0 (none) or at least 2")
        runtime = runtime_from(args)
        paths = checkpoints_in(args.checkpoint)
        reports, scored, data_cache, predictions = [], [], {}, []
        for path in console.progress(paths, desc="checkpoint", unit="checkpoint"):
            report = evaluate_checkpoint(path, args.data_root, args.mc_samples, not args.no_mc_dropout,
                                         args.p_threshold, args.entropy_threshold, args.seed, data_cache, runtime,
                                         predictions)
            scored.append(ScoredSeed(report["seed"], path, finished=True))  # a seed<k>.pt is a finished seed
            reports.append({**report, **scored[-1].record()})
            mc = report.get("mc")
            console.say(f"{path}: test acc {100 * report['test']['acc']:.2f}"
                        + (f" | MC acc {100 * mc['acc']:.2f} PAvPU(t-test) {100 * mc['pavpu_ttest']:.2f} "
                           f"PAvPU(entropy) {100 * mc['pavpu_entropy']:.2f} ECE {100 * mc['ece']:.2f}" if mc else ""))
    except (FileNotFoundError, DeviceError, ValueError) as err:  # PlanetoidDataError is a FileNotFoundError
        return console.fail(err)
    planned = planned_seeds(load_checkpoint(paths[0])["config"]) if args.checkpoint.is_dir() else []
    probs = torch.cat([p for p, _ in predictions])
    targets = torch.cat([t for _, t in predictions])
    out, figure = report_paths(args.checkpoint, args.mc_samples, args.out)
    title = (f"{reports[0]['dataset']} {reports[0]['attention']}: {len(reports)} checkpoint(s), "
             + (f"MC x{args.mc_samples}" if args.mc_samples else "eval mode"))
    bins = metrics.plot_reliability(probs, targets, figure, title=title)
    summary = {"test_acc": mean_std(100 * r["test"]["acc"] for r in reports)}  # in percent, as every summary
    if args.mc_samples:
        for key in ("acc", "pavpu_ttest", "pavpu_entropy", "ece", "uncertain_ttest", "uncertain_entropy"):
            summary[key if key.startswith("uncertain") else f"mc_{key}"] = mean_std(100 * r["mc"][key] for r in reports)
    else:
        summary["ece"] = mean_std(100 * metrics.expected_calibration_error(p, t) for p, t in predictions)
    print(("mean +- std over checkpoints: " if len(reports) > 1 else "")
          + ", ".join(f"{k} {v['mean']:.2f}" + (f" +- {v['std']:.2f}" if len(reports) > 1 else "")
                      for k, v in summary.items()))
    mean_confidence = float(bins.confidence @ bins.count / bins.count.sum())
    for line in explain(summary, reports, args.mc_samples, mean_confidence):
        print(line)
    atomic_write_json(out, results_record({"mc_samples": args.mc_samples, "mc_dropout": not args.no_mc_dropout,
                                           "p_threshold": args.p_threshold,
                                           "entropy_threshold": args.entropy_threshold},
                                          summary=summary, checkpoints=reports,
                                          unfinished_seeds=unfinished_seeds(scored, planned),
                                          reliability={"figure": str(figure), "ece_pooled": bins.ece,
                                                       "mean_confidence_pooled": mean_confidence,
                                                       "bins": {"count": bins.count.tolist(),
                                                                "confidence": bins.confidence.tolist(),
                                                                "accuracy": bins.accuracy.tolist()}}))
    print_unfinished(scored, planned, "python -m graphattn.train")
    console.files_written([out, figure])
    return 0


if __name__ == "__main__":
    sys.exit(main())
