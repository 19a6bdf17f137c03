"""MCAN-small throughput: questions per second in training and inference, BAM vs softmax.

    python benchmarks/vqa.py [--attention softmax bam-wc] [--batch-size 16] [--repeats 5] [--threads 2]
    python benchmarks/vqa.py --device cuda --batch-size 64 --precision fp32 bf16 --compile off default reduce-overhead

One run measures every attention variant side by side on the same synthetic batch (MCAN-small:
hidden 512, 8 heads, 6 + 6 layers, 14 question tokens, 100 regions of 2048-d features, 3,129
answers), timings interleaved (softmax, bam-wc, softmax, ...) so that load from other
processes hits all alike; the median of ``--repeats`` is reported.

* ``train``: one update as ``vqa.train`` runs it: forward inside ``aux_losses()`` (BAM: one
  sample and the KL of all 26 attentions), summed BCE + 0.01 * KL, backward, Adam step.
* ``inference``: eval mode under ``no_grad`` (BAM: the posterior mean).

Every variant runs in every ``--precision`` (autocast) and ``--compile`` (``torch.compile`` of
the model) setting; on CUDA each step ends with a synchronisation, so wall times are the GPU's.
Writes ``benchmarks/results/vqa.json`` with questions/s (from the median wall time) and each
row's cost relative to the fp32, uncompiled softmax step as the ratio of median wall times and
of median process CPU times (issue 7's target: BAM within 1.3x of softmax). On a CPU shared with other jobs the wall
times of single steps swing widely; the CPU time of this process is much less disturbed by the
neighbours, and with ``--threads 1`` (the default; two threads on two busy cores ran 3x slower
from OpenMP contention) it is exact bookkeeping of the step's own work.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import attention  # noqa: E402
from common.utils import atomic_write_json, environment  # noqa: E402
from common.utils.runtime import COMPILE_MODES, PRECISIONS, Runtime  # noqa: E402
from vqa.mcan import MCAN, MCANConfig  # noqa: E402

from benchmarks._measure import interleaved_wall_cpu  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "vqa.json"


def synthetic_batch(batch: int, length: int, regions: int, vocab: int, answers: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, vocab, (batch, length), generator=g)
    lengths = torch.randint(4, length + 1, (batch,), generator=g)
    q_mask = torch.arange(length) < lengths.unsqueeze(1)
    tokens[~q_mask] = 0
    counts = torch.randint(10, regions + 1, (batch,), generator=g)
    r_mask = torch.arange(regions) < counts.unsqueeze(1)
    features = torch.rand(batch, regions, 2048, generator=g) * r_mask.unsqueeze(-1)
    target = (torch.rand(batch, answers, generator=g) > 0.999).float()
    return (tokens, q_mask, features, r_mask), target


def train_step(model: MCAN, optimizer, inputs, target, runtime: Runtime) -> Callable[[], None]:
    forward = runtime.compile(model)

    def step():
        runtime.begin_step()
        model.train()
        optimizer.zero_grad(set_to_none=True)
        with runtime.autocast(), attention.aux_losses() as aux:
            logits = forward(*inputs)
        loss = F.binary_cross_entropy_with_logits(logits.float(), target, reduction="sum") + 0.01 * aux.total()
        runtime.backward_step(loss, optimizer)
        runtime.synchronize()
    return step


def inference_step(model: MCAN, inputs, runtime: Runtime) -> Callable[[], None]:
    forward = runtime.compile(model)

    def step():
        runtime.begin_step()
        model.eval()
        with torch.no_grad(), runtime.autocast():
            forward(*inputs)
        runtime.synchronize()
    return step


def _row(parser: argparse.ArgumentParser, row: str) -> str:
    """``NAME/PRECISION/MODE`` as a row key, or a parser error."""
    parts = row.split("/")
    if len(parts) != 3 or parts[1] not in PRECISIONS or parts[2] not in ("off", "on", *COMPILE_MODES[1:]):
        parser.error(f"--rows {row}: expected NAME/PRECISION/MODE, e.g. bam-wc/bf16/reduce-overhead")
    return f"{parts[0]}/{parts[1]}/compile-{parts[2]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attention", nargs="+", default=["softmax", "bam-wc"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--regions", type=int, default=100)
    parser.add_argument("--question-len", type=int, default=14)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--compile", nargs="+", default=["off"], choices=("off", "on", *COMPILE_MODES[1:]),
                        help="torch.compile modes (on = default; reduce-overhead: CUDA graphs, CUDA only)")
    parser.add_argument("--rows", nargs="+", metavar="NAME/PRECISION/MODE",
                        help="measure these rows only (e.g. bam-wc/bf16/reduce-overhead) instead of every combination "
                             "of --attention, --precision and --compile; softmax/fp32/off is always measured")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if "softmax" not in args.attention:
        parser.error("--attention must include softmax, the reference of the ratios")
    torch.set_num_threads(args.threads)
    device = Runtime.create(args.device).device
    vocab, answers = 20_000, 3129
    inputs, target = Runtime(device).to_device(synthetic_batch(args.batch_size, args.question_len, args.regions,
                                                               vocab, answers))
    reference = "softmax/fp32/compile-off"  # today's step: fp32, eager
    combinations = [f"{name}/{precision}/compile-{compiled}" for name in args.attention
                    for precision in args.precision for compiled in args.compile]
    if args.rows:
        combinations = [_row(parser, row) for row in args.rows]
    # eager rows first, then each compile mode: a time box (benchmarks/gpu_suite.py) keeps what was measured
    order = {mode: i for i, mode in enumerate(("off", "on", *COMPILE_MODES[1:]))}
    rows = sorted(dict.fromkeys([reference] + combinations),
                  key=lambda row: (row != reference, order.get(row.rsplit("/compile-", 1)[1], len(order))))
    start = time.perf_counter()
    results: dict = {}

    def steps(row: str):
        name, precision, compiled = row.split("/")
        mode = compiled.removeprefix("compile-")
        runtime = Runtime(device, precision, "default" if mode == "on" else mode)
        torch.manual_seed(0)
        model = MCAN(MCANConfig(vocab_size=vocab, num_answers=answers, attention=name)).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        return train_step(model, optimizer, inputs, target, runtime), inference_step(model, inputs, runtime)

    reference_steps = steps(reference)
    for row in rows:
        # each row is timed in alternation with the reference (eager, already warm), so that its ratios
        # compare steps measured side by side; the row alone is built, compiled and warmed up here
        row_steps = reference_steps if row == reference else steps(row)
        timed = {}
        for phase, index in (("train", 0), ("inference", 1)):
            fns = {reference: reference_steps[index]}
            if row != reference:
                fns[row] = row_steps[index]
            timed[phase] = interleaved_wall_cpu(fns, args.repeats, warmup=2)
        results[row] = {}
        for phase, times in timed.items():
            t, ref = times[row], times[reference]
            results[row][phase] = {
                **{f"{k}_per_batch": v for k, v in t.items()},
                "questions_per_second": 1e3 * args.batch_size / t["wall_median_ms"],
                "cpu_time_vs_softmax_fp32": t["cpu_median_ms"] / ref["cpu_median_ms"],
                "wall_time_vs_softmax_fp32": t["wall_median_ms"] / ref["wall_median_ms"],
            }
        del row_steps
        payload = {"benchmark": "MCAN-small questions/s", "batch_size": args.batch_size, "regions": args.regions,
                   "question_len": args.question_len, "repeats": args.repeats, "threads": args.threads,
                   "reference": reference, "wall_seconds": time.perf_counter() - start, "results": results,
                   "rows_left": [r for r in rows if r not in results],
                   "environment": environment() | Runtime(device).describe()}
        atomic_write_json(args.out, payload)  # after every row: a run cut short keeps the rows measured
        r = results[row]
        print(f"{row:28s}" + "".join(
            f"  {phase} {r[phase]['questions_per_second']:7.2f} q/s (vs {reference}: CPU time "
            f"{r[phase]['cpu_time_vs_softmax_fp32']:.2f}x, wall {r[phase]['wall_time_vs_softmax_fp32']:.2f}x)"
            for phase in ("train", "inference")), flush=True)
    print(f"-> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
