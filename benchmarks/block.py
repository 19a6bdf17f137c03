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
   collected (one forward + backward, gradients of q, k, v and the prior network) against the
   fastest attention a user has without BAM (:mod:`_dense_baselines`), at ``--lengths``,
   ``--head-dims``, ``--dtypes`` and ``--padding`` (``none``: rows of equal length;
   ``random``: each sequence keeps a length drawn between L/2 and L) with ``batch = --tokens / L``
   and 8 heads. On CUDA the candidates are SDPA with its own backend choice and forced to its flash
   (or, in fp32, memory-efficient) and cuDNN backends for rows of equal length, and for padded rows
   SDPA with the key padding mask, ``varlen_attn`` on packed tokens, nested tensors and one SDPA
   call per sequence; the fastest is the row's ``baseline``, named in the JSON. The reference Triton
   flash kernel
   (``common.attention.kernels.reference_flash``) runs beside them where it exists, and the
   materialised BAM path where its ``[L x L]`` maps stay under ``--materialised-max`` entries.
   Every method of a row is timed in rotation (ABBA); on CUDA each call between CUDA events, with
   two warm-up rounds and as many rounds as fit in ``--row-seconds`` (5 to 100), and peak memory
   by ``torch.cuda.max_memory_allocated`` in this process. The first call (Triton compilation,
   autotuning, kernel loading) is timed apart (``first_call_ms``). On the CPU a row compares BAM
   with SDPA (with the mask on padded rows) as it always has: ``--calls`` scaled by 128^2 / L^2 (at
   least 4) paired calls, ``--clock``, peak memory in a fresh subprocess per case. Ratios are
   medians of paired per-call ratios to the baseline. TFLOP/s count attention FLOPs as
   ``4 B H L^2 d`` for the forward pass and 3.5 times that for forward + backward (the
   backward pass 2.5 times the forward, flash-attention's benchmark convention); padded rows count
   the full ``L x L``, so TFLOP/s compare methods at equal work, as the times do.

    python benchmarks/block.py            # writes benchmarks/results/block.json
    python benchmarks/block.py --quick    # small shapes, for a smoke run
    python benchmarks/block.py --only bam --device cuda --dtypes bf16 fp32 --head-dims 64 128 --padding none random
    python benchmarks/block.py --only bam --lengths 128 512 4096 --dtypes fp32   # CPU
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _dense_baselines as baselines  # noqa: E402
from benchmarks._dense_baselines import Inputs  # noqa: E402
from benchmarks._measure import (cuda_peak_mb, environment, first_call_s, in_subprocess, interleaved_times,  # noqa: E402
                                 paired_ratio, peak_memory_mb, rotated_times, write_json)

from common import attention  # noqa: E402
from common.attention.blocks import Attend, MultiHeadAttention  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

TARGET_RATIO = 1.2
HEADS, HEAD_DIM = 8, 64
#: Forward + backward attention FLOPs in forward passes: the backward pass does 2.5 times the forward's
#: products (flash-attention's benchmark convention).
FORWARD_BACKWARD = 3.5
FLOPS_CONVENTION = "4 B H L^2 d per forward pass (two L x L x d products), x3.5 for forward + backward " \
                   "(backward 2.5x the forward, flash-attention's convention); padded rows count the full L x L"

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


class Row(NamedTuple):
    """One dense BAM row's shape: ``batch x HEADS x length x head_dim`` in ``dtype`` on ``device``; ``padded``:
    each sequence keeps a length drawn between L/2 and L, behind a key padding mask."""

    length: int
    batch: int
    head_dim: int
    dtype: str
    device: str
    padded: bool

    @property
    def flops(self) -> float:
        """Attention FLOPs of a forward and backward pass (see :data:`FLOPS_CONVENTION`)."""
        return FORWARD_BACKWARD * 4 * self.batch * HEADS * self.length ** 2 * self.head_dim


def row_inputs(row: Row) -> Inputs:
    g = torch.Generator().manual_seed(0)
    shape = (row.batch, HEADS, row.length, row.head_dim)
    dtype = DTYPES[row.dtype]
    q, k, v = (torch.randn(shape, generator=g).to(row.device, dtype).requires_grad_() for _ in range(3))
    upstream = torch.randn(shape, generator=g).to(row.device, dtype)
    lengths = torch.randint(row.length // 2, row.length + 1, (row.batch,), generator=g)
    if not row.padded:
        return Inputs(q, k, v, upstream, [row.length] * row.batch, None)
    mask = (torch.arange(row.length) < lengths[:, None]).view(row.batch, 1, 1, row.length).to(row.device)
    return Inputs(q, k, v, upstream, lengths.tolist(), mask)


def bam_step(name: str, x: Inputs):
    """One forward+backward of ``Attend`` in training mode with BAM ``name`` (``<variant>`` the fused path,
    ``<variant>:materialised`` the weight-matrix path), the KL collected and in the objective."""
    variant, _, path = name.partition(":")
    attend = Attend(HEADS, x.q.shape[-1], {"normalizer": variant}).to(x.q.device).train()
    leaves = (x.q, x.k, x.v, *attend.parameters())
    one = torch.ones((), device=x.q.device)

    def step():
        os.environ["ATTN_FUSED_BAM"] = "0" if path == "materialised" else "1"
        with attention.aux_losses() as aux:
            out, _ = attend(x.q, x.k, x.v, mask=x.mask)
        torch.autograd.grad([out, aux.total()], leaves, [x.upstream, one])
    return step


def method_step(name: str, x: Inputs):
    """The step of method ``name``: a BAM variant, ``reference-flash`` or a candidate baseline."""
    if name.startswith("bam"):
        return bam_step(name, x)
    if name == "reference-flash":
        return baselines.reference_flash(x)
    return baselines.candidates(x)[name]()


def bam_memory_main(name: str, row: Row) -> None:
    """CPU: the peak resident memory of one step of ``name`` (a fresh process per case)."""
    warmup = method_step(name, row_inputs(Row(64, 2, row.head_dim, row.dtype, row.device, row.padded)))
    print(json.dumps({"peak_mb": peak_memory_mb(method_step(name, row_inputs(row)), warmup=warmup)}))


def measure_row(args, row: Row, variant: str) -> dict:
    """BAM ``variant`` against the reference flash kernel and every baseline candidate, timed in rotation; the
    fastest candidate is the row's baseline. First calls (compilation, autotuning) are timed apart."""
    x, cuda = row_inputs(row), row.device.startswith("cuda")
    candidates = baselines.candidates(x)
    names = [variant] + [variant + ":materialised"] * (row.batch * HEADS * row.length ** 2 <= args.materialised_max)
    steps, first, skipped = _first_calls(names + ["reference-flash"] * cuda + list(candidates), x, row.device)
    if cuda:  # two warm-up rounds; on the CPU the first call is the warm-up
        warm = rotated_times(steps, 2, row.device)
        rounds = min(100, max(5, math.ceil(args.row_seconds / sum(t[-1] for t in warm.values()))))
    else:
        rounds = max(4, args.calls * 128 * 128 // row.length ** 2)
    times = rotated_times(steps, rounds, row.device, time.process_time if args.clock == "cpu" else time.perf_counter)
    medians = {name: statistics.median(t) for name, t in times.items()}
    baseline = min((n for n in steps if n in candidates), key=medians.get)
    if cuda:
        peaks = {name: cuda_peak_mb(step, warmup=False) for name, step in steps.items()}
    else:
        peaks = {name: _cpu_peak_mb(args, row, name) for name in (variant, baseline)}
    methods = {name: {"ms": round(1e3 * medians[name], 3), "tflops": float(f"{row.flops / medians[name] / 1e12:.3g}"),
                      "time_ratio": round(paired_ratio(times, name, baseline), 3),
                      "first_call_ms": round(1e3 * first[name], 1),
                      "peak_mb": round(peaks[name], 1) if name in peaks else None} for name in steps}
    result = {"variant": variant, "dtype": row.dtype, "length": row.length, "batch": row.batch, "heads": HEADS,
              "head_dim": row.head_dim, "mask": "key padding" if row.padded else "none",
              "real_tokens": sum(x.lengths), "flops": row.flops, "rounds": rounds, "baseline": baseline,
              "time_ratio": methods[variant]["time_ratio"],
              "memory_ratio": round(peaks[variant] / max(peaks[baseline], 1e-9), 3), "methods": methods,
              "skipped": skipped}
    if "reference-flash" in steps:
        result["time_ratio_vs_reference_flash"] = round(paired_ratio(times, variant, "reference-flash"), 3)
    result["summary"] = _summary(result)
    return result


def _first_calls(names: list, x: Inputs, device: str) -> tuple[dict, dict, dict]:
    """The steps of ``names`` that run here, each called once: ``(steps, first-call seconds, skipped with the
    reason)``. A baseline that cannot run is skipped; a BAM step that fails ends the run."""
    steps, first, skipped = {}, {}, {}
    for name in names:
        try:
            step = method_step(name, x)
            first[name] = first_call_s(step, device)
        except Exception as err:
            if name.startswith("bam"):
                raise
            skipped[name] = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            continue
        steps[name] = step
    return steps, first, skipped


def _cpu_peak_mb(args, row: Row, name: str) -> float:
    """The resident-memory peak of one step of ``name``, in a fresh process (:func:`bam_memory_main`)."""
    return in_subprocess(__file__, "--bam-memory", name, str(row.length), str(row.batch), str(row.head_dim), row.dtype,
                         row.device, "--padding", "random" if row.padded else "none",
                         "--threads", str(args.threads))["peak_mb"]


def _summary(r: dict) -> str:
    """One line of a row: BAM's time, its ratios to the baseline and the reference kernel, TFLOP/s, first call
    and peak memory."""
    m, bam, base = r["methods"], r["methods"][r["variant"]], r["methods"][r["baseline"]]
    line = (f"{r['variant']} {r['dtype']} d={r['head_dim']} L={r['length']} B={r['batch']} mask={r['mask']}: "
            f"{bam['ms']:.2f} ms x{r['time_ratio']:.2f} {r['baseline']} ({base['ms']:.2f} ms); "
            f"TFLOP/s {bam['tflops']} vs {base['tflops']}")
    if "time_ratio_vs_reference_flash" in r:
        line += f"; x{r['time_ratio_vs_reference_flash']:.2f} reference-flash ({m['reference-flash']['ms']:.2f} ms)"
    if r["variant"] + ":materialised" in m:
        line += f"; materialised x{m[r['variant'] + ':materialised']['time_ratio']:.2f}"
    return line + (f"; first call {bam['first_call_ms'] / 1e3:.1f} s; peak {bam['peak_mb']:.0f} / "
                   f"{base['peak_mb']:.0f} MB")


def bam_report(args) -> dict:
    """The conventions of section 3's rows."""
    cuda = args.device.startswith("cuda")
    return {"environment": environment(args.threads), "device": args.device,
            "gpu": torch.cuda.get_device_name(args.device) if cuda else None,
            "pass": "forward + backward (torch.autograd.grad of q, k, v and parameters), training mode, KL collected",
            "timing": "CUDA events per call, rounds in ABBA rotation, 2 warm-up rounds" if cuda else
                      f"{args.clock} clock per call, ABBA rotation, 1 warm-up round",
            "ratio": "median over rounds of method_time / baseline_time (adjacent calls); baseline = fastest candidate",
            "first_call": "wall time of the first call of each method on its row (compilation, autotuning, loading)",
            "flops": FLOPS_CONVENTION, "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "bam_vs_baseline": []}


def bam_sweep(args, on_row=None) -> list:
    """Rows of section 3, in the order padding, dtype, length, head size, variant; ``on_row(rows)`` after
    each row (the caller writes its JSON then, so that a run cut short by a time box keeps the rows measured)."""
    rows = []
    for padding, dtype, length, head_dim, variant in itertools.product(args.padding, args.dtypes, args.lengths,
                                                                         args.head_dims, args.bam):
        row = Row(length, max(1, args.tokens // length), head_dim, dtype, args.device, padding == "random")
        rows.append(measure_row(args, row, variant))
        print(rows[-1]["summary"], flush=True)
        if rows[-1]["skipped"]:
            print("    skipped:", "; ".join(f"{n}: {why}" for n, why in rows[-1]["skipped"].items()), flush=True)
        if on_row is not None:
            on_row(rows)
    return rows


def paired_times(fns: dict, calls: int, warmup: int = 3, clock=time.perf_counter) -> tuple[dict, float]:
    """Per-call medians (ms) of two functions timed in ABBA order, and the median of the paired ratios B/A."""
    (name_a, fn_a), (name_b, fn_b) = fns.items()
    for _ in range(warmup):
        fn_a(), fn_b()
    times = rotated_times(fns, calls, clock=clock)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}, paired_ratio(times, name_b, name_a)


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


def build_parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--head-dims", type=int, nargs="+", default=[HEAD_DIM], help="section 3 head sizes")
    parser.add_argument("--padding", nargs="+", choices=["random", "none"], default=["random"],
                        help="section 3: key padding to a length drawn between L/2 and L per sequence, or no mask "
                             "(rows in the order given)")
    parser.add_argument("--materialised-max", type=float, default=2**27,
                        help="section 3: time the materialised path up to this many map entries")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="section 3 timer on the CPU: wall time, or this process's CPU time (steadier on a "
                             "shared CPU); CUDA rows use CUDA events")
    parser.add_argument("--row-seconds", type=float, default=1.0,
                        help="section 3 on CUDA: time spent in the timed rounds of a row (5 to 100 rounds)")
    parser.add_argument("--bam-memory", nargs=6, metavar=("NAME", "L", "B", "D", "DTYPE", "DEVICE"),
                        help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    if args.bam_memory:
        name, length, batch, head_dim, dtype, device = args.bam_memory
        return bam_memory_main(name, Row(int(length), int(batch), int(head_dim), dtype, device,
                                         args.padding == ["random"]))
    if args.only == "bam":
        report = bam_report(args)
        write_json("block_bam", report)  # (rewritten after every row)
        report["bam_vs_baseline"] = bam_sweep(args, lambda rows: write_json("block_bam",
                                                                            report | {"bam_vs_baseline": rows}))
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
        report |= {"bam": bam_report(args), "bam_vs_baseline": bam_sweep(args)}
    print("wrote", write_json("block", report))


if __name__ == "__main__":
    main()
