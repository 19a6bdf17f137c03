"""LXMERT VQA model: time, memory and FLOPs of every adaptive variant against plain LXMERT.

``plain`` is ``transformers.LxmertForQuestionAnswering`` as it ships; every other variant is the
same model (same weights) with its attention swapped by :func:`vqa.lxmert.adapt_lxmert`:
``softmax`` (the swap alone: SDPA), ``span`` (at its start, ``z = 1``: every span covers every
key, so it runs SDPA), ``span-bound`` (``z = 0.5``: the spans bind, the full maps), ``entmax``
(learnable alpha; the fused Triton bisection on CUDA), ``entmax-package`` (the same on the
``entmax`` package's bisection, CUDA runs only), ``bam-wc`` and ``layerdrop`` (one layer per
stack: training drops at random, evaluation prunes 9-5-5 to 8-4-4).

For each variant: a training step (forward, ``A * BCE`` + auxiliary losses, backward) and an
evaluation forward pass, timed interleaved (plain, softmax, span, ..., plain, ...) so that load
from other processes hits all alike. On a CPU shared with other jobs wall-time medians swing by
2x, so the ratios to plain LXMERT use the median process CPU time (``time.process_time``; exact
bookkeeping with ``--threads 1``, the default) and the minimum wall time; the median wall time
is reported too. Also: the peak memory of a training step (CUDA: ``max_memory_allocated``
above the model; CPU: the resident-set high-water mark added by a first step, in a fresh
process) and the FLOPs of one question (:func:`vqa.lxmert.flops.count_flops`). Inputs are
full-length: 20 word pieces and 36 regions per question.

    python benchmarks/lxmert.py                 # LXMERT-base shape (9-5-5, 768), batch 16
    python benchmarks/lxmert.py --quick         # a small model, for a smoke run
    python benchmarks/lxmert.py --device cuda --batch 64
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

# The repository root goes first, so that ``vqa`` is the package, not benchmarks/vqa.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import LxmertConfig, LxmertForQuestionAnswering  # noqa: E402

from common.attention import aux_losses  # noqa: E402
from vqa.lxmert import Adaptation, adapt_lxmert, pruned_layers, vqa_loss  # noqa: E402
from vqa.lxmert.flops import NUM_ANSWERS, count_flops, dummy_inputs  # noqa: E402

from benchmarks._measure import (  # noqa: E402
    _rss_kb, cuda_peak_mb, environment, in_subprocess, interleaved_wall_cpu, kernels_off, write_json,
)

VARIANTS = {
    "plain": None,
    "softmax": {},
    "span": {"span": {}},
    "span-bound": {"span": {"init": 0.5}},
    "entmax": {"normalizer": "entmax"},
    "entmax-package": {"normalizer": "entmax"},
    "bam-wc": {"normalizer": "bam-wc"},
    "layerdrop": {"layerdrop": {"language": 1, "vision": 1, "cross": 1}},
}

#: Variants that run the PyTorch paths (``ATTN_TRITON=0``): the ``entmax`` package's bisection,
#: to compare with the fused Triton kernel that ``entmax`` uses on CUDA (on CPU both are the package).
PYTORCH_PATHS = {"entmax-package"}


def on_path(name: str, fn):
    """``fn`` run with the fused kernels off for the variants in :data:`PYTORCH_PATHS`."""
    if name not in PYTORCH_PATHS:
        return fn

    def step():
        with kernels_off():
            fn()
    return step


def build(config: LxmertConfig, options, state, device) -> torch.nn.Module:
    """The variant's model holding ``state``'s tensors themselves (shared: one copy of the weights)."""
    model = LxmertForQuestionAnswering(config)
    model.load_state_dict(state, assign=True)
    if options is not None:
        adapt_lxmert(model, Adaptation.from_dict(options))
    return model.to(device)


def train_step(model, inputs, target):
    def step():
        model.train()
        model.zero_grad(set_to_none=True)
        with aux_losses() as aux:
            logits = model(**inputs).question_answering_score
        (vqa_loss(logits, target) + aux.total()).backward()
        _sync(target.device)
        model.zero_grad(set_to_none=True)  # the variants share weights; keep one set of gradients alive
    return step


def eval_step(model, inputs, prune):
    def step():
        model.eval()
        with torch.no_grad():
            if prune is None:
                model(**inputs)
            else:
                with pruned_layers(model, prune):
                    model(**inputs)
        _sync(inputs["input_ids"].device)
    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def cpu_peak_mb(variant: str, quick: bool, batch: int, threads: int) -> float:
    """Peak resident memory added by a first training step, in a fresh process (on CPU the
    allocator reuses freed memory, so a high-water mark after a warm-up step shows ~0)."""
    args = ["--memory-of", variant, "--batch", str(batch), "--threads", str(threads)] + (["--quick"] if quick else [])
    return in_subprocess(__file__, *args)["peak_mb"]


def _memory_of(variant: str, config: LxmertConfig, batch: int) -> None:
    import json

    torch.manual_seed(0)
    model = build(config, VARIANTS[variant], LxmertForQuestionAnswering(config).state_dict(), torch.device("cpu"))
    model.train()
    inputs = dummy_inputs(config, batch)
    target = (torch.rand(batch, NUM_ANSWERS) < 0.002).float()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current resident set
    before = _rss_kb("VmRSS")
    train_step(model, inputs, target)()
    print(json.dumps({"peak_mb": (_rss_kb("VmHWM") - before) / 1024}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small 4-2-2 model (hidden 128) instead of LXMERT-base")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--variants", nargs="*", choices=list(VARIANTS),
                        help="default: all (entmax-package only with --device cuda)")
    parser.add_argument("--name", default="lxmert", help="results/<name>.json")
    parser.add_argument("--memory-of", choices=list(VARIANTS), help=argparse.SUPPRESS)  # the CPU memory subprocess
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config = (LxmertConfig(hidden_size=128, num_attention_heads=4, intermediate_size=512, l_layers=4, r_layers=2,
                           x_layers=2, num_qa_labels=NUM_ANSWERS) if args.quick
              else LxmertConfig(num_qa_labels=NUM_ANSWERS))
    if args.memory_of:
        _memory_of(args.memory_of, config, args.batch)
        return 0
    torch.manual_seed(0)
    state = {k: v.to(device) for k, v in LxmertForQuestionAnswering(config).state_dict().items()}
    inputs = {k: v.to(device) for k, v in dummy_inputs(config, args.batch).items()}
    target = (torch.rand(args.batch, NUM_ANSWERS) < 0.002).float().to(device)
    one = {k: v[:1] for k, v in inputs.items()}
    names = args.variants or [v for v in VARIANTS if device.type == "cuda" or v not in PYTORCH_PATHS]
    models = {name: build(config, VARIANTS[name], state, device) for name in names}
    prune = {name: (Adaptation.from_dict(VARIANTS[name]).layerdrop if name == "layerdrop" else None)
             for name in names}
    start = time.perf_counter()
    train = interleaved_wall_cpu({n: on_path(n, train_step(m, inputs, target)) for n, m in models.items()},
                                 args.repeats)
    evaluation = interleaved_wall_cpu({n: on_path(n, eval_step(m, inputs, prune[n])) for n, m in models.items()},
                                      args.repeats)
    rows = {}
    for name, model in models.items():
        full = count_flops(model, one)
        rows[name] = {
            "train_step": train[name], "eval_forward": evaluation[name],
            "train_step_peak_mb": (cuda_peak_mb(on_path(name, train_step(model, inputs, target)))
                                   if device.type == "cuda"
                                   else cpu_peak_mb(name, args.quick, args.batch, args.threads)),
            "flops_per_question": full,
            "flops_per_question_eval": count_flops(model, one, prune[name]) if prune[name] else full,
        }
    base = rows.get("plain")
    if base:
        for row in rows.values():
            row["vs_plain"] = {
                "train_cpu": row["train_step"]["cpu_median_ms"] / base["train_step"]["cpu_median_ms"],
                "train_wall_min": row["train_step"]["wall_min_ms"] / base["train_step"]["wall_min_ms"],
                "eval_cpu": row["eval_forward"]["cpu_median_ms"] / base["eval_forward"]["cpu_median_ms"],
                "eval_wall_min": row["eval_forward"]["wall_min_ms"] / base["eval_forward"]["wall_min_ms"],
                "memory": row["train_step_peak_mb"] / base["train_step_peak_mb"],
                "eval_flops": row["flops_per_question_eval"] / base["flops_per_question"],
            }
    layers = f"{config.l_layers}-{config.r_layers}-{config.x_layers}"
    payload = {
        "what": f"LXMERT {layers} (hidden {config.hidden_size}), batch {args.batch}, 20 words + 36 regions, "
                f"{device}: per variant vs plain transformers LXMERT",
        "device": str(device), "batch": args.batch, "layers": layers, "hidden": config.hidden_size,
        "variants": rows, "wall_seconds": time.perf_counter() - start, "environment": environment(args.threads),
    }
    if device.type == "cuda":
        payload["environment"]["gpu"] = torch.cuda.get_device_name(device)
    path = write_json(args.name, payload)
    print(f"{'variant':<10} {'train cpu ms':>12} {'x plain':>7} {'eval cpu ms':>11} {'x plain':>7} "
          f"{'peak MB':>8} {'x plain':>7} {'GFLOPs eval':>11}")
    for name, row in rows.items():
        ratio = row.get("vs_plain", {})
        print(f"{name:<10} {row['train_step']['cpu_median_ms']:12.0f} {ratio.get('train_cpu', 1):7.2f} "
              f"{row['eval_forward']['cpu_median_ms']:11.0f} {ratio.get('eval_cpu', 1):7.2f} "
              f"{row['train_step_peak_mb']:8.0f} {ratio.get('memory', 1):7.2f} {row['flops_per_question_eval'] / 1e9:11.3f}")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
