"""Forward+backward time and peak memory of every normalizer against plain softmax.

Dense: VQA-like shapes, batch 64 x 8 heads x 100 queries x 100 keys, with a key padding
mask (10-100 real regions) and 64-d keys for the contextual prior; reference
``torch.softmax``. Edge-wise: 1.2M edges x 8 heads on 170k target nodes; reference
``torch_geometric.utils.softmax``. Every normalizer runs in training mode inside
``aux_losses()`` (so BAM samples and computes its KL), and the backward pass includes the
KL. Timings are interleaved medians measured in one process; peak memory is measured
for each case in a fresh subprocess.

    python benchmarks/attention.py            # writes benchmarks/results/attention.json
    python benchmarks/attention.py --quick    # smaller shapes, for a smoke run
    python benchmarks/attention.py --device cuda

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import environment, in_subprocess, interleaved_times, peak_memory_mb, write_json  # noqa: E402

from common import attention  # noqa: E402

TARGET_RATIO = 1.3
REFERENCE = "reference"


def _sync(device: str):
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def dense_case(name: str, quick: bool, device: str = "cpu"):
    g = torch.Generator().manual_seed(0)
    B, H, Q, K, D = (8, 8, 50, 50, 64) if quick else (64, 8, 100, 100, 64)
    scores = torch.randn(B, H, Q, K, generator=g).to(device).requires_grad_()
    keys = torch.randn(B, H, K, D, generator=g).to(device)
    lengths = torch.randint(10, K + 1, (B,), generator=g)
    mask = (torch.arange(K) < lengths[:, None]).view(B, 1, 1, K).to(device)
    upstream = torch.randn(B, H, Q, K, generator=g).to(device)
    sync = _sync(device)
    if name == REFERENCE:
        def step():
            w = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
            (w * upstream).sum().backward()
            sync()
        return step
    norm = attention.build(name, num_heads=H, key_dim=D).to(device).train()

    def step():
        with attention.aux_losses() as aux:
            w = norm(scores, mask=mask, keys=keys)
        ((w * upstream).sum() + aux.total()).backward()
        sync()
    return step


def edge_case(name: str, quick: bool, device: str = "cpu"):
    g = torch.Generator().manual_seed(0)
    E, N, H, D = (120_000, 17_000, 8, 8) if quick else (1_200_000, 170_000, 8, 8)
    index = torch.randint(0, N, (E,), generator=g).to(device)
    source = torch.randint(0, N, (E,), generator=g).to(device)
    scores = torch.randn(E, H, generator=g).to(device).requires_grad_()
    keys = torch.randn(N, H, D, generator=g).to(device)
    upstream = torch.randn(E, H, generator=g).to(device)
    sync = _sync(device)
    if name == REFERENCE:
        def step():
            (pyg_softmax(scores, index, num_nodes=N) * upstream).sum().backward()
            sync()
        return step
    norm = attention.build(name, num_heads=H, key_dim=D).to(device).train()

    def step():
        with attention.aux_losses() as aux:
            w = norm(scores, index=index, num_nodes=N, keys=keys, key_index=source)
        ((w * upstream).sum() + aux.total()).backward()
        sync()
    return step


CASES = {"dense": dense_case, "edge": edge_case}


def memory_main(layout: str, name: str, quick: bool, threads: int, device: str) -> None:
    torch.set_num_threads(threads)
    step = CASES[layout](name, quick, device)
    if device.startswith("cuda"):
        step()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        print(json.dumps({"peak_mb": (torch.cuda.max_memory_allocated() - base) / 2**20}))
    else:
        print(json.dumps({"peak_mb": peak_memory_mb(step)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes (smoke run)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", nargs="*", default=attention.available())
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--memory-only", nargs=2, metavar=("LAYOUT", "NAME"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_only:
        return memory_main(*args.memory_only, args.quick, args.threads, args.device)

    torch.set_num_threads(args.threads)
    names = [REFERENCE] + list(args.variants)
    report = {"environment": environment(args.threads), "device": args.device, "target_ratio": TARGET_RATIO,
              "quick": args.quick}
    for layout, case in CASES.items():
        slow = {"entmax", "entmax15", "sparsemax"} if layout == "edge" else set()
        fns = {name: case(name, args.quick, args.device) for name in names if name not in slow}
        times = interleaved_times(fns, args.threads, args.rounds, min_run_time=0.5 if args.quick else 2.0)
        # Bisection over 1.2M edges takes seconds per call: one round, shorter timing.
        fns = {name: case(name, args.quick, args.device) for name in names if name in slow}
        times.update(interleaved_times(fns, args.threads, 1, min_run_time=0.2))
        rows = {}
        for name in names:
            flag = ["--quick"] if args.quick else []
            mem = in_subprocess(__file__, "--memory-only", layout, name, "--threads", str(args.threads),
                                "--device", args.device, *flag)["peak_mb"]
            rows[name] = {"time_ms": round(times[name], 2), "peak_mb": round(mem, 1)}
            print(f"{layout:5s} {name:10s} {times[name]:9.1f} ms {mem:8.1f} MB", flush=True)
        for name, row in rows.items():
            row["time_ratio"] = round(row["time_ms"] / rows[REFERENCE]["time_ms"], 3)
            row["memory_ratio"] = round(row["peak_mb"] / max(rows[REFERENCE]["peak_mb"], 1e-9), 3)
            if name.startswith("bam-"):
                row["meets_time_target"] = row["time_ratio"] <= TARGET_RATIO
        report[layout] = {
            "reference": "torch.softmax (masked)" if layout == "dense" else "torch_geometric.utils.softmax",
            "results": rows,
        }
    print("wrote", write_json("attention", report))


if __name__ == "__main__":
    main()
