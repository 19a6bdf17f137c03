"""Forward+backward time and peak memory of every normalizer against plain softmax.

Dense: VQA-like shapes, batch 64 x 8 heads x 100 queries x 100 keys, with a key padding
mask (10-100 real regions) and 64-d keys for the contextual prior; reference
``torch.softmax``. Edge-wise: 1.2M edges x 8 heads on 170k target nodes; reference
``torch_geometric.utils.softmax``. Every normalizer runs in training mode inside
``aux_losses()`` (so BAM samples and computes its KL), and the backward pass includes the
KL. Timings are interleaved medians measured in one process; peak memory is measured
for each case in a fresh subprocess (CUDA: ``max_memory_allocated`` in this process).

Two more tables, for the sparse normalizers and the adaptive span:

* ``entmax-512``: the entmax family on ``[32, 8, 512, 512]`` scores (the fused Triton
  bisection on CUDA), plus ``<name>-package`` rows with the kernels off (``ATTN_TRITON=0``:
  the ``entmax`` package's exact sort or bisection; CUDA runs only, on CPU they are the same).
* ``span``: an ``Attend`` block, forward + backward, at length 2048 (``[8, 8, L, 64]``) with a
  token-distance span of ``S = 64, R = 8`` at ``z = 0.5`` (every head reaches 40 tokens):
  ``span`` skips the keys beyond the span, ``span-full`` computes all ``L^2`` scores
  (``need_maps``), against softmax attention through SDPA.

    python benchmarks/attention.py                  # writes benchmarks/results/attention.json
    python benchmarks/attention.py --quick          # smaller shapes, for a smoke run
    python benchmarks/attention.py --device cuda    # on a GPU (the Triton kernels on)

The whole attention block with BAM against ``F.scaled_dot_product_attention`` at lengths up
to 16384 (the fused path, no weight matrix) is section 3 of ``benchmarks/block.py``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch_geometric.utils import softmax as pyg_softmax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import (  # noqa: E402
    cuda_peak_mb, environment, in_subprocess, interleaved_times, kernels_off, peak_memory_mb, write_json,
)

from common import attention  # noqa: E402
from common.attention.blocks import Attend  # noqa: E402

TARGET_RATIO = 1.3
REFERENCE = "reference"


def dense_case(name: str, quick: bool, device: str = "cpu", shape=None):
    g = torch.Generator().manual_seed(0)
    B, H, Q, K, D = shape or ((8, 8, 50, 50, 64) if quick else (64, 8, 100, 100, 64))
    scores = torch.randn(B, H, Q, K, generator=g).to(device).requires_grad_()
    keys = torch.randn(B, H, K, D, generator=g).to(device)
    lengths = torch.randint(min(10, K), K + 1, (B,), generator=g)
    mask = (torch.arange(K) < lengths[:, None]).view(B, 1, 1, K).to(device)
    upstream = torch.randn(B, H, Q, K, generator=g).to(device)
    if name == REFERENCE:
        def step():
            w = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
            (w * upstream).sum().backward()
        return step
    norm = attention.build(name.removesuffix(PACKAGE), num_heads=H, key_dim=D).to(device).train()

    def step():
        with attention.aux_losses() as aux:
            w = norm(scores, mask=mask, keys=keys)
        ((w * upstream).sum() + aux.total()).backward()
    return _kernels_off(step) if name.endswith(PACKAGE) else step


def edge_case(name: str, quick: bool, device: str = "cpu"):
    g = torch.Generator().manual_seed(0)
    E, N, H, D = (120_000, 17_000, 8, 8) if quick else (1_200_000, 170_000, 8, 8)
    index = torch.randint(0, N, (E,), generator=g).to(device)
    source = torch.randint(0, N, (E,), generator=g).to(device)
    scores = torch.randn(E, H, generator=g).to(device).requires_grad_()
    keys = torch.randn(N, H, D, generator=g).to(device)
    upstream = torch.randn(E, H, generator=g).to(device)
    if name == REFERENCE:
        def step():
            (pyg_softmax(scores, index, num_nodes=N) * upstream).sum().backward()
        return step
    norm = attention.build(name, num_heads=H, key_dim=D).to(device).train()

    def step():
        with attention.aux_losses() as aux:
            w = norm(scores, index=index, num_nodes=N, keys=keys, key_index=source)
        ((w * upstream).sum() + aux.total()).backward()
    return step


def entmax_case(name: str, quick: bool, device: str = "cpu"):
    """The entmax family on [32, 8, 512, 512] scores (the issue's normaliser-alone row)."""
    return dense_case(name, quick, device, shape=(4, 8, 128, 128, 64) if quick else (32, 8, 512, 512, 64))


def span_case(name: str, quick: bool, device: str = "cpu"):
    """An Attend block with a token-distance span, trimmed or full, against softmax (SDPA)."""
    g = torch.Generator().manual_seed(0)
    B, H, L, D = (2, 8, 512, 64) if quick else (8, 8, 2048, 64)
    q, k, v = (torch.randn(B, H, L, D, generator=g).to(device).requires_grad_() for _ in range(3))
    upstream = torch.randn(B, H, L, D, generator=g).to(device)
    config = {} if name == REFERENCE else {"span": {"max_span": 64, "ramp": 8, "init": 0.5, "loss_coef": 1e-6}}
    attend = Attend(H, D, config).to(device).train()

    def step():
        with attention.aux_losses() as aux:
            out, _ = attend(q, k, v, need_maps=name == "span-full")
        ((out * upstream).sum() + aux.total()).backward()
    return step


PACKAGE = "-package"
ENTMAX = ["entmax", "entmax15", "sparsemax"]
#: layout -> (case, the variants besides the reference, what the reference is)
CASES = {
    "dense": (dense_case, None, "torch.softmax (masked)"),
    "edge": (edge_case, None, "torch_geometric.utils.softmax"),
    "entmax-512": (entmax_case, ENTMAX + [n + PACKAGE for n in ENTMAX], "torch.softmax (masked)"),
    "span": (span_case, ["span", "span-full"], "Attend softmax (SDPA)"),
}


def _kernels_off(step):
    def off():
        with kernels_off():
            step()
    return off


def _sync(device: str):
    def wrap(step):
        def synced():
            step()
            torch.cuda.synchronize()
        return synced if device == "cuda" else step
    return wrap


def memory_main(layout: str, name: str, quick: bool, threads: int) -> None:
    torch.set_num_threads(threads)
    print(json.dumps({"peak_mb": peak_memory_mb(CASES[layout][0](name, quick))}))


def peak_mb(layout: str, name: str, args) -> float:
    if args.device == "cuda":
        return cuda_peak_mb(CASES[layout][0](name, args.quick, args.device))
    flag = ["--quick"] if args.quick else []
    return in_subprocess(__file__, "--memory-only", layout, name, "--threads", str(args.threads), *flag)["peak_mb"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes (smoke run)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", nargs="*", default=attention.available(),
                        help="normalizers of the dense and edge tables")
    parser.add_argument("--layouts", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--memory-only", nargs=2, metavar=("LAYOUT", "NAME"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_only:
        return memory_main(*args.memory_only, args.quick, args.threads)

    torch.set_num_threads(args.threads)
    report = {"environment": environment(args.threads), "target_ratio": TARGET_RATIO, "quick": args.quick,
              "device": args.device}
    if args.device == "cuda":
        report["environment"]["gpu"] = torch.cuda.get_device_name()
    sync = _sync(args.device)
    for layout in args.layouts:
        case, variants, reference = CASES[layout]
        names = [REFERENCE] + list(variants or args.variants)
        if args.device == "cpu":  # the fused kernels run on CUDA only: the package rows would repeat
            names = [n for n in names if not n.endswith(PACKAGE)]
        slow = {"entmax", "entmax15", "sparsemax"} if layout == "edge" and args.device == "cpu" else set()
        fns = {name: sync(case(name, args.quick, args.device)) for name in names if name not in slow}
        times = interleaved_times(fns, args.threads, args.rounds, min_run_time=0.5 if args.quick else 2.0)
        # Bisection over 1.2M edges takes seconds per call on CPU: one round, shorter timing.
        fns = {name: case(name, args.quick, args.device) for name in names if name in slow}
        times.update(interleaved_times(fns, args.threads, 1, min_run_time=0.2))
        rows = {}
        for name in names:
            mem = peak_mb(layout, name, args)
            rows[name] = {"time_ms": round(times[name], 2), "peak_mb": round(mem, 1)}
            print(f"{layout:10s} {name:18s} {times[name]:9.1f} ms {mem:8.1f} MB", flush=True)
        for name, row in rows.items():
            row["time_ratio"] = round(row["time_ms"] / rows[REFERENCE]["time_ms"], 3)
            row["memory_ratio"] = round(row["peak_mb"] / max(rows[REFERENCE]["peak_mb"], 1e-9), 3)
            if name.startswith("bam-"):
                row["meets_time_target"] = row["time_ratio"] <= TARGET_RATIO
        report[layout] = {"reference": reference, "results": rows}
    print("wrote", write_json("attention" if args.device == "cpu" else f"attention_{args.device}", report))


if __name__ == "__main__":
    main()
