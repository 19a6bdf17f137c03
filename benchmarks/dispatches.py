"""Host-side cost: operators dispatched and Triton kernels launched by a training step, BAM vs softmax.

    python benchmarks/dispatches.py            # writes benchmarks/results/dispatches.json

Counted without a GPU by :mod:`tests.dispatch_counts` (the ``meta`` device run as a GPU; SDPA counted as
CUDA's flash or memory-efficient operator pair): one ``Attend`` call in training mode (forward, backward,
KL; batch 2 x 8 heads x 1024 x 64) in bf16 without a mask and in fp32 with a key padding mask, and one
MCAN-small training forward + backward (batch 64, padded questions and regions; no optimizer update).
Each row gives the total, operators and launches, forward and backward, and where they come from; the
targets of ``tests/test_dispatch_counts.py`` are checked beside them.
The CPU is enough (about 10 s).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.dispatch_counts import attend_call, mcan_step, meta_gpu  # noqa: E402

from benchmarks._measure import environment, write_json  # noqa: E402

ATTEND_CASES = {"bf16": dict(dtype=torch.bfloat16, mask=False), "fp32-padded": dict(dtype=torch.float32, mask=True)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--normalizers", nargs="+", default=["softmax", "bam-wc", "bam-lc"])
    args = parser.parse_args(argv)
    if args.normalizers[0] != "softmax":
        parser.error("--normalizers must start with softmax, the reference")
    report = {"environment": environment(torch.get_num_threads()),
              "counted": "operators dispatched (aten and custom, custom operators' bodies included) + Triton launches, "
                         "forward and backward, on meta as a GPU runs them; SDPA as CUDA's fused operator pair",
              "targets": {"attend": "BAM-WC total <= 2 x softmax + 12", "mcan": "BAM-WC total <= 1.3 x softmax"},
              "attend": {}, "mcan": {}}
    with pytest.MonkeyPatch.context() as monkeypatch, meta_gpu(monkeypatch):
        for case, options in ATTEND_CASES.items():
            rows = {name: attend_call(name, **options).summary() for name in args.normalizers}
            report["attend"][case] = rows
            _print(f"Attend {case}", rows, lambda bam, ref: bam <= 2 * ref + 12)
        rows = {name: mcan_step(name).summary() for name in args.normalizers}
        report["mcan"] = rows
        _print("MCAN-small step", rows, lambda bam, ref: bam <= 1.3 * ref)
    print("wrote", write_json("dispatches", report))


def _print(title: str, rows: dict, meets) -> None:
    reference = rows["softmax"]["total"]
    for name, row in rows.items():
        row["vs_softmax"] = round(row["total"] / reference, 3)
        if name == "bam-wc":
            row["meets_target"] = meets(row["total"], reference)
        print(f"{title:16s} {name:8s} {row['total']:6d} = {row['operators']} operators ({row['forward_operators']} "
              f"forward, {row['backward_operators']} backward) + {row['launches']} launches  x{row['vs_softmax']:.2f}",
              flush=True)
    for where, n in rows.get("bam-wc", {}).get("by_file", {}).items():
        print(f"    bam-wc {n:5d}  {where}")


if __name__ == "__main__":
    main()
