"""Attention block speed: every option off vs ``F.scaled_dot_product_attention``, and the
cost of each map operator.

1. ``Attend`` with every option off (softmax) against calling SDPA directly, forward +
   backward, on ``batch 32 x 8 heads x 64-d heads`` at length 128 and 512, without a mask
   and with a key padding mask. Target: the block takes at most 1.2x SDPA's time.
2. ``MultiHeadAttention`` (projections included, ``E = 512``) at length 128 with one
   operator on at a time, against the same block with every option off.

Timings are in training mode with ``--threads`` threads (default 2). Block vs SDPA is
measured call by call in alternating order (ABBA), and the ratio reported is the median
of the paired per-call ratios: on a shared machine the load changes within seconds, and
pairing adjacent calls cancels that drift where the block-of-seconds medians of
``interleaved_times`` do not. The operator table uses ``interleaved_times``.

    python benchmarks/block.py            # writes benchmarks/results/block.json
    python benchmarks/block.py --quick    # small shapes, for a smoke run
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import environment, interleaved_times, write_json  # noqa: E402

from common.attention.blocks import Attend, MultiHeadAttention  # noqa: E402

TARGET_RATIO = 1.2
HEADS, HEAD_DIM = 8, 64

OPERATORS = {
    "off": {},
    "predictive": {"cross_layer": {"kind": "predictive", "alpha": 0.2}},
    "evolving": {"cross_layer": {"kind": "evolving", "alpha": 0.5, "beta": 0.1}},
    "convoluted-1d": {"convoluted": {"kind": "1d", "max_len": 512}},
    "convoluted-2d": {"convoluted": {"kind": "2d"}},
    "position-abs+rel": {"position": {"max_len": 512, "absolute": True, "relative": True}},
    "span-token": {"span": {"max_span": 64, "ramp": 8, "init": 0.5, "loss_coef": 1e-6}},
    "span-rank": {"span": {"max_span": 64, "ramp": 8, "init": 0.5, "distance": "rank"}},
    "temperature": {"temperature": True},
    "materialised maps (need_maps)": {},
}


def core_case(name: str, batch: int, length: int, masked: bool):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, HEADS, length, HEAD_DIM, generator=g, requires_grad=True) for _ in range(3))
    upstream = torch.randn(batch, HEADS, length, HEAD_DIM, generator=g)
    mask = None
    if masked:
        lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
        mask = (torch.arange(length) < lengths[:, None]).view(batch, 1, 1, length)
    attend = Attend(HEADS, HEAD_DIM).train()

    def sdpa():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        (out * upstream).sum().backward()

    def block():
        out, _ = attend(q, k, v, mask=mask)
        (out * upstream).sum().backward()

    return {"sdpa": sdpa, "block": block}[name]


def paired_times(fns: dict, calls: int, warmup: int = 3) -> tuple[dict, float]:
    """Per-call medians of two functions timed in ABBA order, and the median of the paired ratios B/A."""
    (name_a, fn_a), (name_b, fn_b) = fns.items()
    for _ in range(warmup):
        fn_a(), fn_b()

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    samples = {name_a: [], name_b: []}
    ratios = []
    for i in range(calls):
        if i % 2:
            b, a = timed(fn_b), timed(fn_a)
        else:
            a, b = timed(fn_a), timed(fn_b)
        samples[name_a].append(a)
        samples[name_b].append(b)
        ratios.append(b / a)
    return {name: statistics.median(v) * 1e3 for name, v in samples.items()}, statistics.median(ratios)


def operator_case(name: str, batch: int, length: int):
    torch.manual_seed(0)
    E = HEADS * HEAD_DIM
    layer = MultiHeadAttention(E, HEADS, OPERATORS[name]).train()
    x = torch.randn(batch, length, E, requires_grad=True)
    prev = torch.randn(batch, HEADS, length, length) if "cross_layer" in OPERATORS[name] else None
    need_maps = name.startswith("materialised")
    upstream = torch.randn(batch, length, E)

    def step():
        out, _ = layer(x, prev_logits=prev, need_maps=need_maps)
        (out * upstream).sum().backward()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes (smoke run)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the operator table")
    parser.add_argument("--calls", type=int, default=200, help="paired calls per shape at length 128 (a quarter at 512)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch, lengths = (4, (32, 64)) if args.quick else (32, (128, 512))
    min_run = 0.2 if args.quick else 1.0
    report = {"environment": environment(args.threads), "target_ratio": TARGET_RATIO, "quick": args.quick,
              "pass": "forward+backward, training mode",
              "ratio": "median over calls of block_time / sdpa_time, adjacent calls in ABBA order",
              "off_vs_sdpa": [], "operators": {}}
    for length in lengths:
        for masked in (False, True):
            fns = {name: core_case(name, batch, length, masked) for name in ("sdpa", "block")}
            times, ratio = paired_times(fns, args.calls if length <= 128 else max(args.calls // 4, 10))
            row = {"batch": batch, "heads": HEADS, "head_dim": HEAD_DIM, "length": length,
                   "mask": "key padding" if masked else "none", "sdpa_ms": round(times["sdpa"], 2),
                   "block_ms": round(times["block"], 2), "ratio": round(ratio, 3),
                   "ratio_of_medians": round(times["block"] / times["sdpa"], 3),
                   "meets_target": ratio <= TARGET_RATIO}
            report["off_vs_sdpa"].append(row)
            print(f"L={length:4d} mask={row['mask']:11s} sdpa {times['sdpa']:8.2f} ms  block "
                  f"{times['block']:8.2f} ms  ratio {ratio:.3f}", flush=True)
    length = lengths[0]
    fns = {name: operator_case(name, batch, length) for name in OPERATORS}
    times = interleaved_times(fns, args.threads, args.rounds, min_run)
    report["operators"] = {
        "shape": {"batch": batch, "length": length, "embed_dim": HEADS * HEAD_DIM, "heads": HEADS},
        "reference": "off (MultiHeadAttention with every option off, i.e. projections + SDPA)",
        "results": {name: {"time_ms": round(t, 2), "ratio_to_off": round(t / times["off"], 3)}
                    for name, t in times.items()},
    }
    for name, t in times.items():
        print(f"{name:32s} {t:8.2f} ms  x{t / times['off']:.2f}", flush=True)
    print("wrote", write_json("block", report))


if __name__ == "__main__":
    main()
