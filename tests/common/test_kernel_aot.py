"""Every Triton kernel compiles ahead of time for real GPUs (sm_80, sm_90) without a GPU, with no spilled
register and within the shared memory of the target (common.attention.kernels.aot, run in a subprocess:
the test session runs the kernels in Triton's interpreter). CI runs the whole check (.ci/run); here a
subset covers every kernel, dtype, head size and both targets."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.attention.kernels import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="needs triton")
ROOT = Path(__file__).resolve().parents[2]
SUBSET = ["L=4096 BH=64 bam-wc+dropout", "L=100 BH=64 bam-lc", "cora heads=8 bam-wc sample",
          "cora heads=8 bam-lc mean", "dense bfloat16 L=16384 heads=8 alpha=learned",
          "dense float32 L=100 heads=8 alpha=1.5", "csr float16 1.2M-edges heads=8 alpha=learned"]


def _compiled_env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def test_every_kernel_compiles_for_sm80_and_sm90_without_spills(tmp_path):
    out = tmp_path / "resources.json"
    run = subprocess.run([sys.executable, "-m", "common.attention.kernels.aot", "--match", *SUBSET, "--out", str(out)],
                         cwd=ROOT, env=_compiled_env(), capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    summary, reports = result["summary"], result["reports"]
    assert summary["ok"] and summary["spilling"] == 0 and summary["failed_to_compile"] == 0
    assert summary["over_shared_limit"] == 0
    seen = {(r["arch"], r["launch"]["kernel"]) for r in reports}
    kernels = {"_forward", "_backward", "_edge_bam_fwd", "_edge_bam_bwd", "_entmax_fwd",
               "_entmax_bwd"}
    assert seen == {(arch, kernel) for arch in (80, 90) for kernel in kernels}
    pointers = {t for r in reports for t in r["launch"]["pointers"]}
    assert {"*fp32", "*bf16", "*fp16"} <= pointers


def test_the_check_finds_spills_in_a_tile_too_large():
    """Sabotage: a backward tile of 64 queries x 128 keys at head size 64 with a Lognormal KL spills on an H100 (it
    did, before the tiles were chosen); the check must say so and fail."""
    script = ("from common.attention.kernels import aot, dense_bam as d\n"
              "d._TILES[(True, 'half', False)] = ((128, 64, 8, 2), (64, 128, 8, 2), (64, 128, 8, 2))\n"
              "r = aot.check((90,), ('dense-bam',), match=('bfloat16 d=64 L=100 BH=64 bam-lc',))\n"
              "import json; print(json.dumps(aot.summary(r)))\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_compiled_env(), capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert not summary["ok"] and summary["spilling"] >= 1 and summary["launches"] == 2


def test_recording_refuses_interpreted_kernels(monkeypatch):
    from common.attention.kernels import aot
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="unset TRITON_INTERPRET"):
        with aot.recording():
            pass


@pytest.mark.parametrize("allow_tf32", [True, False])
def test_float32_wide_heads_take_the_chunked_path_on_a_gpu(allow_tf32):
    """Float32 heads wider than 64 have no kernel tiles (the only spill-free TF32 backward tile, 16 x 16, gave
    wrong gradients on an H200), nor has float32 without TF32; bfloat16 and TF32 heads of 64 keep theirs."""
    import torch

    from common.attention.kernels import dense_bam, tf32_products

    with tf32_products(allow_tf32):
        assert dense_bam.tiles(torch.float32, 128, 128, interpret=False) is None
        assert dense_bam.tiles(torch.float32, 96, 64, interpret=False) is None
        assert (dense_bam.tiles(torch.float32, 64, 64, interpret=False) is not None) == allow_tf32
        assert dense_bam.tiles(torch.bfloat16, 128, 128, interpret=False) is not None
