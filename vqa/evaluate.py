"""Evaluate a trained MCAN run: official accuracy on clean and noisy features, and Monte Carlo
uncertainty (PAvPU, ECE, reliability plot).

    python -m vqa.evaluate runs/vqa/mcan/bam-wc --noise-std 1.0 --mc-samples 20

* Clean: the model in eval mode (BAM: the posterior mean, i.e. softmax); official accuracy
  (``--rules``: today's evaluator or the pre-2021 one, :mod:`vqa.evaluation`), overall / per
  answer type / per question type, and the predictions in the official results
  format (``<split>_results.json``; for a test split, the file to submit).
* ``--noise-std s``: the same with ``N(0, s^2)`` added to every real region feature (BAM Table 2
  "noisy"; the noise is seeded, identical for every model).
* ``--mc-samples S``: S forward passes with attention sampling on (and dropout, unless
  ``--no-mc-dropout``; the BAM paper uses dropout alone for softmax and both for BAM). The
  prediction is the argmax of the mean sigmoid score; it is "accurate" when it equals the
  annotators' most frequent answer (``multiple_choice_answer``) and "uncertain" when the paired
  t-test between the two top answers' scores over the S samples has p > ``--p-threshold``
  (BAM App. C.2.1). PAvPU = (accurate & certain + inaccurate & uncertain) / N. ECE and the
  reliability diagram use the mean score of the predicted answer as its confidence.

The report goes to ``<run>/eval_<split>.json`` (or ``--out``), the plots beside it. It names the checkpoint
scored (the newest) and, where training has not finished (no ``results.json`` in the run), says so and marks the
report (``finished``, ``unfinished_seeds``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Sequence

from omegaconf import OmegaConf

from common import attention, metrics
from common.text import Vocabulary
from common.utils import atomic_write_json, console
from common.utils.cli import add_runtime_options, runtime_from
from common.utils.paths import check_inputs

from .answers import AnswerVocab, answers_of, prep_answer
from .evaluation import RULES, format_answer_types, vqa_accuracy, write_submission

if TYPE_CHECKING:  # torch, the data and the model are imported once the command line has been checked
    import torch
    from torch.utils.data import DataLoader

    from common.utils.runtime import Runtime


def load_run(run_dir: Path, data_root: Optional[str] = None):
    """The config, question vocabulary, answers and newest weights of a ``vqa.train`` run, and their update."""
    from common.utils import Checkpointer

    from .predict import build_model

    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} does not exist; pass the output directory of python -m vqa.train")
    cfg = OmegaConf.create(json.loads(config_path.read_text(encoding="utf-8")))
    if data_root is not None:
        cfg.data_root = data_root
    vocab, answers = Vocabulary.load(run_dir / "question_vocab.json"), AnswerVocab.load(run_dir / "answers.json")
    model = build_model(cfg, len(vocab), len(answers))
    state = Checkpointer(run_dir).load_latest(model)
    if state is None:
        raise FileNotFoundError(f"{run_dir / 'checkpoints'} holds no checkpoint; train first")
    return cfg, vocab, answers, model, state["step"]


def mc_uncertainty(model, loader: DataLoader, answers: AnswerVocab, annotations: Dict[int, dict], samples: int,
                   dropout: bool, noise_std: float, seed: int, p_threshold: float, runtime: Runtime,
                   progress: bool = True) -> Dict:
    """Monte Carlo predictions, accuracy, PAvPU and the confidences for calibration (module doc)."""
    import torch

    from .predict import add_feature_noise

    if samples < 2:
        raise ValueError("--mc-samples needs at least 2 samples for the t-test")
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    predictions: Dict[int, str] = {}
    confidence, correct, uncertain = [], [], []
    with attention.mc_sampling(model, dropout=dropout), torch.no_grad():
        for batch in console.progress(loader, desc=f"MC x{samples} batch", enabled=progress):
            batch = runtime.to_device(batch)
            features = add_feature_noise(batch["features"], batch["region_mask"], noise_std, generator)
            with runtime.autocast():
                scores = torch.stack([torch.sigmoid(model(batch["question_tokens"], batch["question_mask"], features,
                                                          batch["region_mask"]).float()) for _ in range(samples)])
            scores = scores.cpu()
            mean = scores.mean(0)
            top = mean.argmax(-1)
            ids = batch["question_id"].tolist()
            predictions.update(answers_of(ids, mean, answers))
            labels = [answers.index(prep_answer(annotations[q]["multiple_choice_answer"])) for q in ids]
            correct.append(torch.tensor([label == int(t) for label, t in zip(labels, top)]))
            confidence.append(mean.gather(1, top.unsqueeze(1)).squeeze(1).double())
            uncertain.append(metrics.ttest_uncertain(scores, p_threshold))
    correct_t, uncertain_t, confidence_t = torch.cat(correct), torch.cat(uncertain), torch.cat(confidence)
    pavpu = float(((correct_t & ~uncertain_t) | (~correct_t & uncertain_t)).double().mean())
    return {"predictions": predictions, "pavpu": pavpu, "uncertain_fraction": float(uncertain_t.double().mean()),
            "label_accuracy": float(correct_t.double().mean()), "confidence": confidence_t, "correct": correct_t}


def confidence_view(confidence: torch.Tensor, correct: torch.Tensor):
    """``(probs [N, 2], targets [N])`` whose top class has probability ``confidence`` and is right
    exactly when ``correct``: the form ``common.metrics`` reliability functions take."""
    import torch

    probs = torch.stack([confidence, torch.zeros_like(confidence)], dim=1)
    return probs, (~correct).long()


def evaluate_run(run_dir: Path, split: Optional[str] = None, data_root: Optional[str] = None,
                 noise_std: Sequence[float] = (), mc_samples: int = 0, mc_dropout: bool = True,
                 p_threshold: float = 0.05, seed: int = 0, batch_size: Optional[int] = None,
                 out: Optional[Path] = None, progress: bool = True, runtime: Optional[Runtime] = None,
                 rules: str = "official") -> Dict:
    """Evaluate the latest checkpoint of ``run_dir`` (see the module docstring) on ``runtime``'s
    device (default: the CPU), scoring with the official evaluator's ``rules``
    (:mod:`vqa.evaluation`); returns the report (and ``report_file``, where it went)."""
    import torch
    from torch.utils.data import DataLoader

    from common.utils import Checkpointer, results_record, seed_everything
    from common.utils.runs import ScoredSeed, unfinished_seeds
    from common.utils.runtime import Runtime

    from .data import QuestionEncoder, VQADataset, load_split, split_inputs
    from .predict import predict_logits

    runtime = runtime or Runtime(torch.device("cpu"))
    cfg, vocab, answers, model, update = load_run(run_dir, data_root)
    newest = Checkpointer(run_dir).paths()[-1]  # the checkpoint load_run read
    scored = ScoredSeed.of(cfg.seed, newest, run_dir / "results.json")
    split = split or cfg.data.eval_split
    check_inputs(split_inputs(cfg, split))  # every missing file of the split in one line
    questions, annotations, store = load_split(cfg, split)
    dataset = VQADataset(questions, annotations, store, answers, QuestionEncoder(vocab, cfg.data.max_question_len),
                         vocab.pad, cfg.data.max_regions)
    loader = DataLoader(dataset, batch_size or cfg.train.eval_batch_size, collate_fn=dataset.collate,
                        num_workers=cfg.train.num_workers, pin_memory=runtime.pin_memory)
    out = out or run_dir / f"eval_{split}.json"
    model.to(runtime.device)
    report: Dict = {"run": str(run_dir), "split": split, "update": update, **scored.record(),
                    "unfinished_seeds": unfinished_seeds([scored]), "attention": cfg.attention.name, "rules": rules,
                    "conditions": {}}
    by_question = {a["question_id"]: a for a in annotations} if annotations is not None else None
    for std in [0.0, *noise_std]:
        name = "clean" if std == 0 else f"noise_{std:g}"
        seed_everything(seed)
        ids, logits = predict_logits(model, loader, runtime, noise_std=std, seed=seed, progress=progress, desc=name)
        predictions = answers_of(ids, logits, answers)
        condition: Dict = {"noise_std": std,
                           "results_file": str(write_submission(out.parent / f"{split}_{name}_results.json",
                                                                predictions))}
        if annotations is not None:
            condition["accuracy"] = vqa_accuracy(annotations, predictions, rules=rules).summary()
        if mc_samples and annotations is not None:
            seed_everything(seed)
            mc = mc_uncertainty(model, loader, answers, by_question, mc_samples, mc_dropout, std, seed, p_threshold,
                                runtime, progress)
            probs, targets = confidence_view(mc["confidence"], mc["correct"])
            bins = metrics.plot_reliability(probs, targets, out.parent / f"reliability_{split}_{name}.png",
                                    title=f"MCAN {cfg.attention.name}, {split} {name}")
            condition["mc"] = {
                "samples": mc_samples, "dropout": mc_dropout, "p_threshold": p_threshold,
                "accuracy": vqa_accuracy(annotations, mc["predictions"], rules=rules).summary(),
                "pavpu": 100 * mc["pavpu"], "uncertain_fraction": mc["uncertain_fraction"],
                "label_accuracy": 100 * mc["label_accuracy"], "ece": 100 * bins.ece,
                "reliability_plot": str(out.parent / f"reliability_{split}_{name}.png"),
            }
        report["conditions"][name] = condition
    atomic_write_json(out, results_record({"noise_std": list(noise_std), "mc_samples": mc_samples,
                                           "mc_dropout": mc_dropout, "p_threshold": p_threshold, "seed": seed,
                                           "runtime": runtime.describe(),
                                           "train_config": OmegaConf.to_container(cfg)}, **report))
    return {**report, "report_file": str(out)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vqa.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="output directory of python -m vqa.train")
    parser.add_argument("--split", help="split of the run's config to evaluate (default: its data.eval_split)")
    parser.add_argument("--data-root", help="directory holding vqa/ (default: the one used in training)")
    parser.add_argument("--noise-std", type=float, nargs="*", default=[],
                        help="also evaluate with N(0, s^2) noise on the region features, for each s")
    parser.add_argument("--mc-samples", type=int, default=0, help="Monte Carlo samples for uncertainty (0: none)")
    parser.add_argument("--no-mc-dropout", action="store_true",
                        help="sample attention only (default: keep dropout on too, MC dropout)")
    parser.add_argument("--p-threshold", type=float, default=0.05, help="PAvPU t-test: uncertain if p > this")
    parser.add_argument("--seed", type=int, default=0, help="seed of the noise and the Monte Carlo sampling")
    parser.add_argument("--batch-size", type=int, help="default: the run's train.eval_batch_size")
    parser.add_argument("--rules", choices=RULES, default="official",
                        help="VQA evaluator: official (current GT-Vision-Lab/VQA master, default) or legacy-2016 "
                             "(the pre-2021 code that scored MCAN and BAM); python -m vqa.score rescores a results "
                             "file")
    add_runtime_options(parser)
    parser.add_argument("--out", type=Path, help="report JSON (default <run>/eval_<split>.json)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    from common.utils.runs import ScoredSeed, print_unfinished
    from common.utils.runtime import DeviceError

    from .data import VQADataError

    try:
        report = evaluate_run(args.run, args.split, args.data_root, args.noise_std, args.mc_samples,
                              not args.no_mc_dropout, args.p_threshold, args.seed, args.batch_size, args.out,
                              not args.no_progress, runtime_from(args), args.rules)
    except (FileNotFoundError, VQADataError, DeviceError, ValueError) as err:
        return console.fail(err)
    scored = ScoredSeed.from_record(report)
    console.say(scored.line())
    written = [report["report_file"]]
    for name, condition in report["conditions"].items():
        line = f"{report['split']} {name}:"
        if "accuracy" in condition:
            acc = condition["accuracy"]
            line += f" accuracy {acc['overall']:.2f} ({format_answer_types(acc['per_answer_type'])})"
        if "mc" in condition:
            mc = condition["mc"]
            line += f" | MC accuracy {mc['accuracy']['overall']:.2f} PAvPU {mc['pavpu']:.2f} ECE {mc['ece']:.2f}"
        print(line)
        written += [condition["results_file"], *([condition["mc"]["reliability_plot"]] if "mc" in condition else [])]
    print_unfinished([scored], [], "python -m vqa.train")
    console.files_written(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
