"""GLUE fine-tuning step time: the unswapped Hugging Face model against the same model with its attention
routed through the suite (softmax, BAM-WC, ...), on the same batch.

    python benchmarks/glue.py [--task MRPC] [--model minilm-l6] [--batch-size 32] [--repeats 15] [--threads 2]
                              [--variants softmax bam-wc entmax] [--device cpu] [--name glue]

Every side runs one full training step on the same real batch (the ``--batch-size`` first examples of a
bucketed MRPC epoch, as ``nlu.train`` draws them): forward, cross-entropy (+ the KL for BAM), backward,
an AdamW update. ``unswapped`` is ``AutoModelForSequenceClassification`` as ``transformers`` loads it (SDPA
attention). The sides are timed in alternation, ``--repeats`` rounds after a warm-up; per side the median
wall and process-CPU milliseconds, and the ratios ``softmax / unswapped`` (the surgery's overhead, target
<= 1.05) and ``<variant> / softmax`` (the normalizer's cost, BAM-WC target <= 1.3).
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._measure import environment, interleaved_wall_cpu, write_json  # noqa: E402
from common.attention import aux_losses  # noqa: E402
from common.attention.surgery import swap_attention  # noqa: E402
from common.text.batching import bucketed_order  # noqa: E402
from common.utils import default_data_root  # noqa: E402
from nlu.data import read_split  # noqa: E402
from nlu.model import collate, encode, load_classifier, load_tokenizer, task_loss  # noqa: E402
from nlu.pretrained import resolve_model  # noqa: E402
from nlu.tasks import get_task  # noqa: E402


def trainer(model, batch, regression: bool, kl_weight: float = 0.01):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    labels = batch["labels"]
    inputs = {k: v for k, v in batch.items() if k != "labels"}

    def step():
        model.train()
        with aux_losses() as aux:
            loss = task_loss(model(**inputs).logits, labels, regression)
            if len(aux):
                loss = loss + kl_weight * aux.total()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if batch["input_ids"].is_cuda:
            torch.cuda.synchronize()
    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="MRPC")
    parser.add_argument("--model", default="minilm-l6", help="minilm-l6 or a local Hugging Face checkpoint directory")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=["softmax", "bam-wc", "entmax"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--name", default="glue")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    spec, model_dir = get_task(args.task), resolve_model(args.model)
    tokenizer = load_tokenizer(model_dir)
    train = encode(tokenizer, read_split(spec, "train", default_data_root(args.data_root)), args.max_length)
    indices = bucketed_order(train.lengths, args.batch_size, torch.Generator().manual_seed(0))[0]
    batch = {k: v.to(args.device) for k, v in collate(tokenizer, train, indices, spec.regression).items()}
    torch.manual_seed(0)
    base, _ = load_classifier(model_dir, spec, None)  # attention as transformers loads it
    fns = {"unswapped": trainer(copy.deepcopy(base).to(args.device), batch, spec.regression)}
    for variant in args.variants:
        model = copy.deepcopy(base)
        swap_attention(model, variant)
        fns[variant] = trainer(model.to(args.device), batch, spec.regression)
    times = interleaved_wall_cpu(fns, args.repeats, warmup=2)
    sides = {}
    for name, t in times.items():
        sides[name] = {**t, "ratio_to_unswapped": t["wall_median_ms"] / times["unswapped"]["wall_median_ms"]}
        if name not in ("unswapped", "softmax") and "softmax" in times:
            sides[name]["ratio_to_softmax"] = t["wall_median_ms"] / times["softmax"]["wall_median_ms"]
        print(f"{name:10s} {t['wall_median_ms']:8.1f} ms/step (cpu {t['cpu_median_ms']:8.1f})  "
              f"{sides[name]['ratio_to_unswapped']:.3f}x unswapped"
              + (f"  {sides[name]['ratio_to_softmax']:.3f}x softmax" if "ratio_to_softmax" in sides[name] else ""))
    path = write_json(args.name, {"task": spec.name, "model": str(model_dir), "batch_size": len(indices),
                                  "tokens_per_example": batch["input_ids"].shape[1], "repeats": args.repeats,
                                  "device": args.device, "environment": environment(args.threads), "sides": sides})
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
