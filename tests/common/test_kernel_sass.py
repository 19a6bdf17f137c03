"""The SASS report of the compiled kernels (common.attention.kernels.sass through ``aot --sass``, sm_90, no GPU):
the counter on a known listing, the tensor-core rule (and that it catches a loop without MMA), no stack, the
reference flash kernel, and the issue's budget for a dense BAM-WC training call."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common.attention.kernels import sass, triton_available

ROOT = Path(__file__).resolve().parents[2]
#: The aot case of one dense BAM-WC training call (bf16, key padding mask, the KL collected) at head size d, by its
#: exact name.
TRAINING_CALL = "dense-bam bfloat16 d={d} L=4096 BH=64 bam-wc"
#: The issue's budget: forward+backward main-loop instructions per score element of that call on sm_90.
BUDGET = {64: 160, 128: 190}
REFERENCE = "reference-flash bfloat16 d={d} L=4096 BH=64 full"

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR12], R24 ;
        /*0030*/                   MUFU.EX2 R2, R3 ;
        /*0040*/                   IMAD R5, R6, R7, R8 ;
        /*0050*/                   LDG.E.128 R8, desc[UR4][R2.64] ;
        /*0060*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0070*/              @!P0 BRA 0x10 ;
        /*0080*/                   EXIT ;
        /*0090*/                   BRA 0x90;
"""
TTGIR = """
    %r:2 = scf.for %i = %c0 to %n step %c64 iter_args(%a = %z) -> (tensor<32x64xf32, #mma>) : i32 {
      %s = tt.dot %q, %k, %z, inputPrecision = tf32 : tensor<32x64xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma}>> * tensor<64x64xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma}>> -> tensor<32x64xf32, #mma>
      %m = "tt.reduce"(%s) <{axis = 1 : i32}> ({
      ^bb0(%x: f32, %y: f32):
        tt.reduce.return %x : f32
      }) : (tensor<32x64xf32, #mma>) -> tensor<32xf32, #ttg.slice<{dim = 1, parent = #mma}>>
      %o = ttng.warp_group_dot %p, %v, %a {inputPrecision = 0 : i32, isAsync = true} : !ttg.memdesc<32x64xbf16, #shared, #smem> * !ttg.memdesc<64x128xbf16, #shared1, #smem> -> tensor<32x128xf32, #mma>
      scf.yield %o : tensor<32x128xf32, #mma>
    }
"""


def test_the_counter_on_a_known_listing():
    """One loop (0x10-0x70, the branch at 0x90 jumps to itself), counted per element of a 32 x 64 tile with 4 warps:
    every static instruction is 128 / 2048 thread-instructions per element."""
    report = sass.analyse(LISTING, TTGIR, num_warps=4, constexprs={"BLOCK_M": 32, "BLOCK_N": 64})
    assert report["loops"] == 1 and report["main_loop_instructions"] == 7
    assert report["per_element"] == {"instructions": 7 / 16, "mufu": 1 / 16, "integer": 1 / 16, "mma": 2 / 16}
    assert report["barriers_per_iteration"] == 1 and report["score_elements_per_thread"] == 16
    # issued: (16 x 8 x 16 + 64 x 64 x 16 / 4) x 4 warps; needed: 32 x 64 x 64 + 32 x 128 x 64
    assert report["mma_macs_issued"] == (2048 + 16384) * 4 and report["mma_macs_needed"] == 131072 + 262144
    assert report["global_load_bytes_per_element"] == 16 * 128 / 2048
    # H100 SXM, picoseconds per element: 4 warp-instructions and 16 MUFU per clock per SM, 2 FLOP per MAC
    assert report["roofline_ps"]["issue"] == pytest.approx(7 / 16 / 32 / (4 * 132 * 1.83e9) * 1e12, abs=1e-4)
    assert report["roofline_ps"]["mufu"] == pytest.approx(1 / 16 / (16 * 132 * 1.83e9) * 1e12, abs=1e-4)
    assert report["roofline_ps"]["tensor"] == pytest.approx(2 * 73728 / 2048 / 989e12 * 1e12, abs=1e-4)
    assert report["binding"] == "tensor" and report["bound_ps"] == report["roofline_ps"]["tensor"]
    no_tile = sass.analyse(LISTING, TTGIR, num_warps=4, constexprs={"BLOCK": 128})
    assert no_tile["per_element"] is None and no_tile["main_loop_instructions"] == 7
    assert sass.missing_mma(report, ["*bf16"]) is False


def test_the_main_loop_is_the_unmasked_stage():
    """Of two innermost loops with the same tensor-core work, the shorter (unmasked) one; an outer loop is not
    innermost."""
    listing = """
        /*0000*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0010*/                   FADD R1, R2, R3 ;
        /*0020*/               @P0 BRA 0x0 ;
        /*0030*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0040*/                   FSEL R1, R2, R3, P1 ;
        /*0050*/                   FADD R1, R2, R3 ;
        /*0060*/               @P0 BRA 0x30 ;
        /*0070*/               @P1 BRA 0x0 ;
    """
    instructions = sass.parse(listing)
    assert [ins.address for ins in sass.main_loop(instructions)] == [0x0, 0x10, 0x20]
    assert sass.mma_macs_per_warp(sass.Instruction(0, "HMMA.1688.F32.TF32", "")) == 1024


def _compiled_env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return env | {"TRITON_CACHE_DIR": str(tmp_path / "triton-cache")}  # nothing cached across runs


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """``aot --sass`` on sm_90 for the training call's and the reference kernel's launches (bf16, d = 64, 128)."""
    if not triton_available():
        pytest.skip("needs triton")
    tmp = tmp_path_factory.mktemp("sass")
    cases = [name.format(d=d) for name in (TRAINING_CALL, REFERENCE) for d in BUDGET]
    command = [sys.executable, "-m", "common.attention.kernels.aot", "--arch", "90", "--sass", "--family", "dense-bam",
               "reference-flash", "--match", *cases, "--out", str(tmp / "sass.json")]
    run = subprocess.run(command, cwd=ROOT, env=_compiled_env(tmp), capture_output=True, text=True, timeout=900)
    assert (tmp / "sass.json").exists(), run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads((tmp / "sass.json").read_text())


def _call(compiled: dict, case: str) -> dict:
    """The summed call of the aot case named ``case``; a missing case is an error, not a budget failure."""
    found = [c for c in compiled["calls"] if c["case"] == case and c["arch"] == 90]
    if len(found) != 1 or not found[0]["kernels"]:
        pytest.fail(f"no aot case {case!r} with score-tile kernels (cases: {[c['case'] for c in compiled['calls']]}); "
                    "adjust TRAINING_CALL to the dense-bam case of one BAM-WC training call")
    return found[0]


def _listing(call: dict) -> str:
    kernels = [f"{k['kernel']} {k['tile'][0]}x{k['tile'][1]} warps={k['num_warps']}: "
               f"{k['instructions_per_element']} ({k['binding']}-bound)" for k in call["kernels"]]
    return (f"{call['case']}: {call['per_element']['instructions']} instructions per score element = "
            f"{' + '.join(kernels)}; without a score tile (not summed): {call['without_tile'] or 'none'}")


def test_every_launch_uses_tensor_cores_and_no_stack(compiled):
    summary = compiled["summary"]
    assert summary["ok"] and summary["spilling"] == 0 and summary["missing_mma"] == 0, summary
    tiled = [r for r in compiled["reports"] if r["sass"]["per_element"]]
    assert {r["cases"][0].split()[0] for r in tiled} == {"dense-bam", "reference-flash"}
    assert all(r["sass"]["mma_per_iteration"] > 0 for r in tiled)


@pytest.mark.parametrize("d", sorted(BUDGET))
def test_the_reference_flash_kernel_is_within_the_budget_without_repeated_work(compiled, d):
    """The baseline shows the budget can be met: one exp2 per score in the forward loop, every product done once
    (warps along the rows), and far fewer instructions per element than the budget."""
    call = _call(compiled, REFERENCE.format(d=d))
    print(_listing(call))
    assert call["without_tile"] == ["_delta"] and len(call["kernels"]) == 3
    assert call["per_element"]["instructions"] <= BUDGET[d] / 3, _listing(call)
    reports = [r for r in compiled["reports"] if REFERENCE.format(d=d) in r["cases"] and r["sass"]["per_element"]]
    assert all(r["sass"]["mma_replication"] == 1.0 for r in reports)
    forward = next(r["sass"] for r in reports if r["launch"]["kernel"] == "_forward")
    assert 1.0 <= forward["per_element"]["mufu"] <= 1.1


@pytest.mark.parametrize("d", sorted(BUDGET))
def test_a_dense_bam_training_call_is_within_the_budget(compiled, d):
    call = _call(compiled, TRAINING_CALL.format(d=d))
    print(_listing(call))
    assert call["per_element"]["instructions"] <= BUDGET[d], _listing(call)


NO_MMA_PROBE = '''
"""Two score-tile kernels, bf16, compiled by aot --sass: one with tl.dot, one with a broadcast product."""
import json

import torch
import triton
import triton.language as tl

from common.attention.kernels import aot


@triton.jit
def _scores(Q, K, O, n, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    total = tl.zeros((BLOCK_M,), tl.float32)
    for start in range(0, n, BLOCK_N):
        k = tl.load(K + (start + tl.arange(0, BLOCK_N))[:, None] * HEAD_DIM + offs_d[None, :])
        if DOT:
            s = tl.dot(q, tl.trans(k))
        else:
            s = tl.sum(q[:, None, :].to(tl.float32) * k[None, :, :].to(tl.float32), 2)
        total += tl.sum(tl.exp2(s), 1)
    tl.store(O + offs_m, total)


def cases():
    for dot in (True, False):
        def run(dot=dot):
            q, k = (torch.empty(64, 16, device="meta", dtype=torch.bfloat16) for _ in range(2))
            _scores[(4,)](q, k, torch.empty(64, device="meta"), 64, HEAD_DIM=16, BLOCK_M=16, BLOCK_N=16, DOT=dot)
        yield f"probe dot={dot}", run


aot.CASE_FAMILIES["probe"] = cases
reports = aot.check((90,), ("probe",), sass=True)
print(json.dumps({"summary": aot.summary(reports), "reports": reports}))
'''


def test_the_tensor_core_rule_catches_a_loop_without_mma(tmp_path):
    """A bf16 score-tile loop that multiplies without tl.dot fails the check; the same loop with tl.dot passes."""
    if not triton_available():
        pytest.skip("needs triton")
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(NO_MMA_PROBE))
    env = _compiled_env(tmp_path) | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(probe)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    by_dot = {r["cases"][0]: r for r in result["reports"]}
    assert by_dot["probe dot=True"]["ok"] and by_dot["probe dot=True"]["sass"]["mma_per_iteration"] > 0
    flagged = by_dot["probe dot=False"]
    assert not flagged["ok"] and "no tensor-core MMA" in flagged["error"]
    assert flagged["sass"]["mma_per_iteration"] == 0 and flagged["sass"]["per_element"]["instructions"] > 0
    assert result["summary"]["missing_mma"] == 1 and not result["summary"]["ok"]
