"""What a compiled kernel's main loop does per score element, read from its SASS, and what that costs on an H100.

A kernel launch compiled by :mod:`common.attention.kernels.aot` is disassembled with the ``cuobjdump`` of
Triton's wheel. Loops are the backward branches (``BRA`` to a lower address); the *main loop* is, among the
innermost loops, the one with the most tensor-core instructions, and of those the shortest: a flash kernel that
splits its keys into an unmasked stage and a masked one (the causal diagonal, a ragged end) runs the unmasked one
for nearly every block. Its instructions are counted statically (each once per iteration).

A launch whose constexprs name a score tile ``BLOCK_M x BLOCK_N`` (the queries and keys one iteration covers) gets
its counts per score element: ``count x num_warps x 32 / (BLOCK_M x BLOCK_N)``, i.e. thread-instructions per
element. Kernels without such a tile (row statistics, edge-wise and entmax kernels) report their loops without it.

* ``instructions``, ``mufu`` (``MUFU.*``: exp2, log2, rcp, ...), ``integer`` (:data:`INTEGER`) and ``mma``
  (tensor-core instructions, :data:`TENSOR_CORE`) per element;
* ``barriers_per_iteration``: ``BAR.*`` in the main loop (a CTA-wide barrier stalls every warp);
* ``mma_replication``: the tensor-core work issued per iteration (the MMA shapes times their count, times the
  warps; a Hopper ``HGMMA`` is one instruction of a 4-warp group) over the work the loop's dots need (the
  shapes of the ``tt.dot``/``warp_group_dot`` of the loop in the TTGIR). Above 1, warps repeat each other's
  products, and usually the elementwise work around them too;
* ``score_elements_per_thread``: ``BLOCK_M x BLOCK_N / threads``, what each thread must hold of the tile;
* a roofline for :data:`H100_SXM` in picoseconds per score element, the whole GPU busy: instruction issue
  (4 warp-instructions per clock per SM), MUFU (16 per clock per SM) and tensor cores (the MACs issued at the
  dense peak of their operand type); ``bound_ps`` is the largest and ``binding`` names it. ``hbm_no_reuse_ps``
  prices the loop's global loads at HBM bandwidth as if nothing came from L2; flash kernels re-read each K/V tile
  from L2 for every query block, so it is a ceiling, not part of the bound.

:func:`missing_mma` is the rule CI applies: the main loop of a bfloat16/float16 score-tile kernel must use the
tensor cores.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import NamedTuple, Optional

#: Integer ALU instructions (the vector datapath; the uniform ``U*`` ones run per warp and are not counted).
INTEGER = frozenset({"IMAD", "IMADSP", "IMUL", "IADD", "IADD3", "VIADD", "IABS", "IMNMX", "VIMNMX", "ISETP",
                     "ISCADD", "LOP", "LOP3", "SHF", "SHL", "SHR", "LEA", "PRMT", "SEL", "POPC", "FLO", "BREV",
                     "BMSK", "SGXT", "BFE", "BFI", "I2I", "I2IP"})
#: Tensor-core instructions: warp-level MMA (sm_80) and warpgroup MMA (sm_90).
TENSOR_CORE = frozenset({"HMMA", "IMMA", "DMMA", "BMMA", "HGMMA", "IGMMA", "QGMMA", "BGMMA"})
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_WIDTH = re.compile(r"^[US]?(8|16|32|64|128)$")


class Instruction(NamedTuple):
    address: int
    opcode: str  # with its modifiers, e.g. "HMMA.16816.F32.BF16"
    operands: str

    @property
    def base(self) -> str:
        return self.opcode.split(".", 1)[0]


@dataclass(frozen=True)
class Machine:
    """Peak rates of a GPU: SMs, clock, warp-instructions issued and MUFU results per clock per SM, dense
    tensor-core FLOP/s by operand kind and memory bandwidth (bytes/s)."""

    name: str
    sms: int
    clock_hz: float
    issue_per_clock: int
    mufu_per_clock: int
    tensor_flops: dict
    memory_bytes_per_s: float


#: H100 SXM5: 132 SMs at a 1.83 GHz boost, 989 TFLOP/s dense bf16/fp16 (495 TF32), HBM3 at 3.35 TB/s.
H100_SXM = Machine("H100 SXM", 132, 1.83e9, 4, 16, {"half": 989e12, "tf32": 494.5e12}, 3.35e12)


def disassemble(cubin: bytes) -> str:
    """The SASS of ``cubin`` (``cuobjdump --dump-sass``)."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-sass", f.name], capture_output=True, text=True,
                              check=True).stdout


def parse(sass: str) -> list:
    """The instructions of a SASS listing, in address order (predicates dropped)."""
    return [Instruction(int(address, 16), opcode, operands.strip())
            for address, opcode, operands in _LINE.findall(sass)]


def loops(instructions: list) -> list:
    """``(first, last)`` index ranges of the loops: a branch back to a lower address closes one."""
    index = {ins.address: i for i, ins in enumerate(instructions)}
    found = []
    for i, ins in enumerate(instructions):
        if ins.base == "BRA" and (target := re.match(r"0x[0-9a-f]+", ins.operands)):
            address = int(target.group(0), 16)
            if address < ins.address and address in index:
                found.append((index[address], i))
    return found


def main_loop(instructions: list) -> Optional[list]:
    """The instructions of the main loop (see the module docstring), or None without a loop."""
    ranges = loops(instructions)
    innermost = [(a, b) for a, b in ranges if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in ranges)]
    if not innermost:
        return None
    a, b = max(innermost, key=lambda r: (sum(ins.base in TENSOR_CORE for ins in instructions[r[0]:r[1] + 1]),
                                         -(r[1] - r[0])))
    return instructions[a:b + 1]


def mma_macs_per_warp(ins: Instruction) -> float:
    """Multiply-adds one warp's issue of a tensor-core instruction does: ``HMMA.16816`` is m16 n8 k16, a warpgroup
    ``HGMMA.64x64x16`` is shared by 4 warps."""
    shape = ins.opcode.split(".")[1]
    group = re.fullmatch(r"(\d+)x(\d+)x(\d+)", shape)
    if group:
        m, n, k = map(int, group.groups())
        return m * n * k / 4
    m, n, k = (16, int(shape[2]), int(shape[3:])) if shape.startswith("16") else (8, 8, int(shape[2:]))
    return m * n * k


def dot_macs(ttgir: str) -> int:
    """Multiply-adds of one iteration's dots (``tt.dot``, ``ttng.warp_group_dot``) in the TTGIR loop that has the
    most: ``M x N x K`` from the operand and result types."""
    stack, per_loop = [], []  # stack: an index into per_loop for each open scf.for region, None for other regions
    for line in ttgir.splitlines():
        op = re.search(r"\b(?:tt\.dot|ttng\.warp_group_dot)\b(.*)", line)
        if op and stack:
            loop = next((s for s in reversed(stack) if s is not None), None)
            a = re.search(r":\s*(?:tensor|!ttg\.memdesc)<(\d+)x(\d+)x", op.group(1))
            result = re.search(r"->\s*tensor<(\d+)x(\d+)x", op.group(1))
            if loop is not None and a and result:
                per_loop[loop] += int(a.group(1)) * int(a.group(2)) * int(result.group(2))
        depth = line.count("{") - line.count("}")
        if depth > 0:
            if "scf.for" in line:
                per_loop.append(0)
                stack.append(len(per_loop) - 1)
            else:
                stack.append(None)
        elif depth < 0 and stack:
            stack.pop()
    return max(per_loop, default=0)


def _load_bytes(ins: Instruction) -> int:
    """Bytes one thread loads from global memory with ``LDG``/``LDGSTS`` (0 for other instructions)."""
    if ins.base not in ("LDG", "LDGSTS"):
        return 0
    widths = [int(m.group(1)) for part in ins.opcode.split(".")[1:] if (m := _WIDTH.match(part))]
    return (widths[-1] if widths else 32) // 8


def analyse(sass: str, ttgir: str, num_warps: int, constexprs: dict, machine: Machine = H100_SXM) -> dict:
    """The report of one compiled launch from its SASS listing and TTGIR (see the module docstring)."""
    instructions = parse(sass)
    body = main_loop(instructions) or []
    counts = Counter(ins.base for ins in body)
    threads = num_warps * 32
    report = {
        "instructions": len(instructions),
        "loops": len(loops(instructions)),
        "main_loop_instructions": len(body),
        "barriers_per_iteration": sum(ins.opcode.startswith("BAR.") for ins in body),
        "mma_per_iteration": sum(counts[op] for op in TENSOR_CORE),
        "opcodes_per_iteration": dict(counts.most_common(12)),
        "score_tile": None, "per_element": None,
    }
    block_m, block_n = constexprs.get("BLOCK_M"), constexprs.get("BLOCK_N")
    if not body or not isinstance(block_m, int) or not isinstance(block_n, int):
        return report
    elements = block_m * block_n
    per_thread = threads / elements  # thread-instructions per element, per static instruction
    macs = defaultdict(float)  # issued multiply-adds per iteration, by operand kind
    for ins in body:
        if ins.base in TENSOR_CORE:
            macs["tf32" if "TF32" in ins.opcode else "half"] += mma_macs_per_warp(ins) * num_warps
    needed = dot_macs(ttgir)
    per_element = {"instructions": len(body) * per_thread, "mufu": counts["MUFU"] * per_thread,
                   "integer": sum(counts[op] for op in INTEGER) * per_thread,
                   "mma": report["mma_per_iteration"] * per_thread}
    roofline = {
        "issue": per_element["instructions"] / 32 / (machine.issue_per_clock * machine.sms * machine.clock_hz),
        "mufu": per_element["mufu"] / (machine.mufu_per_clock * machine.sms * machine.clock_hz),
        "tensor": sum(2 * m / elements / machine.tensor_flops[kind] for kind, m in macs.items()),
    }
    load_bytes = sum(_load_bytes(ins) for ins in body) * threads / elements
    binding = max(roofline, key=roofline.get)
    report.update(
        score_tile=[block_m, block_n], score_elements_per_thread=elements / threads,
        per_element=per_element,
        mma_macs_issued=sum(macs.values()), mma_macs_needed=needed,
        mma_replication=round(sum(macs.values()) / needed, 3) if needed else None,
        global_load_bytes_per_element=round(load_bytes, 3),
        roofline_ps={key: round(value * 1e12, 4) for key, value in roofline.items()},
        hbm_no_reuse_ps=round(load_bytes / machine.memory_bytes_per_s * 1e12, 4),
        bound_ps=round(roofline[binding] * 1e12, 4), binding=binding)
    return report


def missing_mma(report: dict, pointers: list) -> bool:
    """Whether a score-tile kernel with bfloat16/float16 operands has a main loop without tensor-core MMA."""
    half = any(p in ("*bf16", "*fp16") for p in pointers)
    return half and report["per_element"] is not None and report["mma_per_iteration"] == 0


_DTYPE = re.compile(r"\b(float32 tf32x3|float32 tf32|float32|bfloat16|float16)\b")
_HEAD = re.compile(r"\bd=(\d+)\b")


def calls(reports: list) -> list:
    """One entry per (case, arch): the case's launches (a forward and backward call) with a score tile, their
    per-element counts and roofline bounds summed; the others listed under ``without_tile``."""
    grouped = defaultdict(list)
    for report in reports:
        if report.get("sass"):
            for case in report["cases"]:
                grouped[(case, report["arch"])].append(report)
    entries = []
    for (case, arch), members in sorted(grouped.items()):
        tiled = [r for r in members if r["sass"]["per_element"]]
        totals = {key: round(sum(r["sass"]["per_element"][key] for r in tiled), 2)
                  for key in ("instructions", "mufu", "integer", "mma")}
        dtype, head = _DTYPE.search(case), _HEAD.search(case)
        entries.append({
            "case": case, "arch": arch, "family": case.split()[0],
            "dtype": dtype.group(1) if dtype else None, "head_dim": int(head.group(1)) if head else None,
            "per_element": totals, "bound_ps": round(sum(r["sass"]["bound_ps"] for r in tiled), 4),
            "kernels": [{"kernel": r["launch"]["kernel"], "tile": r["sass"]["score_tile"],
                         "num_warps": r["launch"]["num_warps"], "instructions_per_element":
                         r["sass"]["per_element"]["instructions"], "binding": r["sass"]["binding"]} for r in tiled],
            "without_tile": [r["launch"]["kernel"] for r in members if not r["sass"]["per_element"]],
        })
    return entries


def family_summary(entries: list) -> list:
    """Per (family, dtype, head size, arch) over the calls with a score tile: the range of forward+backward
    instructions per score element and the case with the most."""
    grouped = defaultdict(list)
    for entry in entries:
        if entry["kernels"] and entry["head_dim"] is not None:
            grouped[(entry["family"], entry["dtype"], entry["head_dim"], entry["arch"])].append(entry)
    rows = []
    for (family, dtype, head, arch), members in sorted(grouped.items()):
        worst = max(members, key=lambda e: e["per_element"]["instructions"])
        rows.append({"family": family, "dtype": dtype, "head_dim": head, "arch": arch, "calls": len(members),
                     "min_instructions_per_element": min(e["per_element"]["instructions"] for e in members),
                     "max_instructions_per_element": worst["per_element"]["instructions"],
                     "max_bound_ps": max(e["bound_ps"] for e in members), "max_case": worst["case"]})
    return rows
