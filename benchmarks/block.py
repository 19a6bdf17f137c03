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

3. Dense BAM (``bam-wc``, ``bam-lc``) through ``Attend`` in training mode with the KL
   collected (the fused path of :mod:`common.attention.dense_bam`) against the softmax block
   (SDPA), at ``--lengths`` (default 128 512 4096 16384) in ``--dtypes`` (fp32, bf16), with a
   key padding mask (``--padding none``: no mask) and ``batch = --tokens / L``. Time is the
   median of paired ABBA ratios; peak memory is measured for each case in a fresh subprocess
   (CPU: resident set high-water mark; CUDA: ``torch.cuda.max_memory_allocated``). The
   materialised BAM path is timed too where its ``[L x L]`` maps stay under
   ``--materialised-max`` entries.

    python benchmarks/block.py            # writes benchmarks/results/block.json
    python benchmarks/block.py --quick    # small shapes, for a smoke run
    python benchmarks/block.py --only bam --device cuda
    python benchmarks/block.py --only bam --lengths 128 512 4096 --dtypes fp32   # CPU
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import environment, in_subprocess, interleaved_times, peak_memory_mb, write_json  # noqa: E402

from common import attention  # noqa: E402
from common.attention.blocks import Attend, MultiHeadAttention  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

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


def bam_case(name: str, length: int, batch: int, dtype: str, device: str, padded: bool = True):
    """One forward+backward of ``Attend`` in training mode: ``softmax`` (SDPA) or a BAM variant
    (``<variant>`` fused, ``<variant>:materialised`` the weight-matrix path), KL included; with
    ``padded``, a key padding mask keeps a length drawn between L/2 and L per sequence."""
    g = torch.Generator().manual_seed(0)
    variant, _, path = name.partition(":")
    q, k, v = (torch.randn(batch, HEADS, length, HEAD_DIM, generator=g).to(device, DTYPES[dtype]).requires_grad_()
               for _ in range(3))
    upstream = torch.randn(batch, HEADS, length, HEAD_DIM, generator=g).to(device, DTYPES[dtype])
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
    mask = (torch.arange(length) < lengths[:, None]).view(batch, 1, 1, length).to(device) if padded else None
    attend = Attend(HEADS, HEAD_DIM, {"normalizer": variant}).to(device).train()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def step():
        os.environ["ATTN_FUSED_BAM"] = "0" if path == "materialised" else "1"
        with attention.aux_losses() as aux:
            out, _ = attend(q, k, v, mask=mask)
        ((out * upstream).float().sum() + aux.total().to(device)).backward()
        sync()
    return step


def bam_memory_main(name: str, length: int, batch: int, dtype: str, device: str, padded: bool) -> None:
    step = bam_case(name, length, batch, dtype, device, padded)
    if device.startswith("cuda"):
        step()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:  # warmed up on a small case: the measured call starts from an allocator without its buffers
        peak = peak_memory_mb(step, warmup=bam_case(name, 64, 2, dtype, device, padded))
    print(json.dumps({"peak_mb": peak}))


def bam_sweep(args, on_row=None) -> list:
    """Rows of section 3: BAM block vs softmax block (SDPA), time and peak memory; ``on_row(rows)`` after each
    row (the caller writes its JSON then, so that a run cut short by a time box keeps the rows measured)."""
    rows, padded = [], args.padding == "random"
    for dtype in args.dtypes:
        for length in args.lengths:
            batch = max(1, args.tokens // length)
            common = [str(length), str(batch), dtype, args.device, "--padding", args.padding]
            sdpa_mem = in_subprocess(__file__, "--bam-memory", "softmax", *common, "--threads", str(args.threads))
            for variant in args.bam:
                names = ["softmax", variant]
                if batch * HEADS * length * length <= args.materialised_max:
                    names.append(variant + ":materialised")
                fns = {name: bam_case(name, length, batch, dtype, args.device, padded) for name in names}
                calls = max(4, args.calls * 128 * 128 // (length * length))
                clock = time.process_time if args.clock == "cpu" else time.perf_counter
                times, ratio = paired_times({n: fns[n] for n in names[:2]}, calls, warmup=1, clock=clock)
                row = {"variant": variant, "dtype": dtype, "length": length, "batch": batch, "heads": HEADS,
                       "head_dim": HEAD_DIM, "mask": "key padding" if padded else "none", "calls": calls,
                       "sdpa_ms": round(times["softmax"], 2), "bam_ms": round(times[variant], 2),
                       "time_ratio": round(ratio, 3)}
                if len(names) == 3:
                    mat, mat_ratio = paired_times({n: fns[n] for n in names[::2]}, calls, warmup=1, clock=clock)
                    row["materialised_ms"] = round(mat[names[2]], 2)
                    row["materialised_time_ratio"] = round(mat_ratio, 3)
                mem = in_subprocess(__file__, "--bam-memory", variant, *common, "--threads", str(args.threads))
                row.update(sdpa_peak_mb=round(sdpa_mem["peak_mb"], 1), bam_peak_mb=round(mem["peak_mb"], 1),
                           memory_ratio=round(mem["peak_mb"] / max(sdpa_mem["peak_mb"], 1e-9), 3))
                rows.append(row)
                print(f"{variant} {dtype} L={length:5d} B={batch:3d}  sdpa {row['sdpa_ms']:9.2f} ms  bam "
                      f"{row['bam_ms']:9.2f} ms  x{ratio:.2f}  (materialised x{row.get('materialised_time_ratio')})  "
                      f"peak {row['sdpa_peak_mb']:.1f} / {row['bam_peak_mb']:.1f} MB", flush=True)
                if on_row is not None:
                    on_row(rows)
    return rows


def paired_times(fns: dict, calls: int, warmup: int = 3, clock=time.perf_counter) -> tuple[dict, float]:
    """Per-call medians of two functions timed in ABBA order, and the median of the paired ratios B/A.
    ``clock`` is wall time by default; ``time.process_time`` counts this process's CPU time only."""
    (name_a, fn_a), (name_b, fn_b) = fns.items()
    for _ in range(warmup):
        fn_a(), fn_b()

    def timed(fn) -> float:
        start = clock()
        fn()
        return clock() - start

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
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N (section 3)")
    parser.add_argument("--only", choices=["core", "bam"], help="run only sections 1-2 (core) or 3 (bam)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 4096, 16384], help="section 3 lengths")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--bam", nargs="+", default=["bam-wc", "bam-lc"], help="section 3 variants")
    parser.add_argument("--tokens", type=int, default=8192, help="section 3: batch = tokens / length (at least 1)")
    parser.add_argument("--padding", choices=["random", "none"], default="random",
                        help="section 3: key padding to a length drawn between L/2 and L per sequence, or no mask")
    parser.add_argument("--materialised-max", type=float, default=2**27,
                        help="section 3: time the materialised path up to this many map entries")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="section 3 timer: wall time, or this process's CPU time (steadier on a shared CPU)")
    parser.add_argument("--bam-memory", nargs=5, metavar=("NAME", "L", "B", "DTYPE", "DEVICE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.bam_memory:
        name, length, batch, dtype, device = args.bam_memory
        return bam_memory_main(name, int(length), int(batch), dtype, device, args.padding == "random")
    if args.only == "bam":
        report = {"environment": environment(args.threads), "device": args.device,
                  "pass": "forward+backward, training mode, KL collected",
                  "ratio": "median over calls of bam_time / sdpa_time, adjacent calls in ABBA order",
                  "clock": args.clock, "bam_vs_sdpa": []}
        write_json("block_bam", report)  # (rewritten after every row)
        report["bam_vs_sdpa"] = bam_sweep(args, lambda rows: write_json("block_bam", report | {"bam_vs_sdpa": rows}))
        print("wrote", write_json("block_bam", report))
        return
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
    if args.only is None:
        report["bam_vs_sdpa"] = bam_sweep(args)
    print("wrote", write_json("block", report))


if __name__ == "__main__":
    main()
