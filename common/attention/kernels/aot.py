"""Compile every Triton kernel launch of the suite ahead of time for real NVIDIA GPUs, without one.

Triton's CPU interpreter (``TRITON_INTERPRET=1``, the tests' way to run the kernels) accepts
programs that the real compiler rejects, and says nothing about registers, spills or shared
memory. Here the launchers themselves run on ``meta`` tensors (shapes and dtypes, no data) while
a recorder stands in for Triton's launch: each launch is bound to its arguments exactly as
Triton binds a real one (argument types, the divisibility-by-16 specialisations, constexprs,
``num_warps``/``num_stages``), then compiled with ``triton.compile`` for a CUDA target. The cubin's
resource usage comes from ``cuobjdump`` (shipped in Triton's wheel): registers per thread, the
per-thread stack (local memory: the register spills) and the shared memory, checked against the
architecture's limit. With ``--sass`` each launch's SASS is analysed too (:mod:`common.attention.kernels.sass`:
instructions, MUFU, integer and tensor-core operations per score element, barriers, replication, an H100
roofline), and every case's forward and backward launches are summed into one call.

    python -m common.attention.kernels.aot --arch 80 90 --sass --out kernel_resources.json

The exit status is 1 when a launch fails to compile, spills, needs more shared memory than its target has, or
(with ``--sass``) is a bfloat16/float16 score-tile kernel whose main loop has no tensor-core MMA.
``TRITON_INTERPRET`` must be unset (the recorder replaces real launches).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Optional

#: Dynamic shared memory per block (bytes), by compute capability: A100 and H100 (opt-in maximum).
SHARED_LIMIT = {80: 166912, 90: 232448}
#: Architectures checked by default.
ARCHES = (80, 90)


@dataclass
class Launch:
    """One kernel launch as Triton binds it: the JIT function's registry key and the compile inputs."""

    kernel: str  # "module:qualname", a key of Triton's JIT function registry
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    cases: list = field(default_factory=list)  # names of the cases that launch it

    def key(self) -> str:
        return repr((self.kernel, sorted(self.signature.items()), sorted(self.constexprs.items(), key=str),
                     sorted(self.attrs.items(), key=str), sorted(self.options.items(), key=str)))

    def describe(self) -> dict:
        from triton.runtime.jit import _triton_jit_function_registry

        names = _triton_jit_function_registry[self.kernel].arg_names
        types = sorted({t for t in self.signature.values() if t.startswith("*")})
        return {"kernel": self.kernel.split(":")[-1], "pointers": types,
                "constexprs": {names[k[0]] if isinstance(k, tuple) and len(k) == 1 else str(k): _plain(v)
                               for k, v in self.constexprs.items()},
                "num_warps": self.options.get("num_warps"), "num_stages": self.options.get("num_stages")}


def _plain(value):
    return value if isinstance(value, (bool, int, float, str)) or value is None else repr(value)


@contextmanager
def recording(target_arch: int = 90) -> Iterator[list]:
    """Within the block, Triton kernel launches are recorded as :class:`Launch` (bound for a CUDA
    target of ``target_arch``) instead of being run; yields the list they are appended to."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise RuntimeError("recording needs real Triton JIT functions: unset TRITON_INTERPRET")
    from . import _TARGET_ARCH

    backend = make_backend(GPUTarget("cuda", target_arch, 32))
    launches: list = []
    original = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        binder = create_function_from_signature(self.signature, self.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, specialization, options)
        name = f"{self.module}:{self.fn.__qualname__}"
        launches.append(Launch(name, signature, constexprs, attrs, dict(options.__dict__)))
        return _NotLoaded()

    JITFunction.run = record
    _TARGET_ARCH.append(target_arch)  # the launchers choose their tiles for this target
    try:
        yield launches
    finally:
        JITFunction.run = original
        _TARGET_ARCH.pop()


class _NotLoaded:
    """What a recorded launch returns in place of a compiled kernel (``precompile`` loads it)."""

    def _init_handles(self) -> None:
        pass


# --------------------------------------------------------------------------- cases ----
#: Dense BAM calls of the cases: (normalizer, key mask, causal, dropout, KL collected).
DENSE_VARIANTS = {
    "bam-wc": ("bam-wc", True, False, 0.0, True),
    "bam-wc+dropout": ("bam-wc", True, False, 0.1, True),
    "bam-lc": ("bam-lc", True, False, 0.0, True),
    "bam-wf+causal": ("bam-wf", False, True, 0.0, True),
    "bam-lf+causal+dropout sample": ("bam-lf", False, True, 0.1, False),
}


def _dense_bam_cases() -> Iterator[tuple[str, Callable[[], None]]]:
    """One training call (forward and backward) of ``attention_suite::bam_attention`` per case."""
    import torch

    from ..bam import BAM
    from ..dense_bam_op import attention_backward, attention_forward
    from . import tf32_products
    from .dense_bam import NOISE_LOGNORMAL, NOISE_WEIBULL, takes
    from .dense_bam_kl import ACTIVATIONS, constants, kl_kind

    dtypes = {"float32 tf32": (torch.float32, True),
              "bfloat16": (torch.bfloat16, False), "float16": (torch.float16, False)}
    names = {"bam-wc": ("weibull", "contextual"), "bam-lc": ("lognormal", "contextual"), "bam-wf": ("weibull", "fixed"),
             "bam-lf": ("lognormal", "fixed")}
    for dtype_name, (dtype, allow_tf32) in dtypes.items():
        for d in (64, 128):
            for length, bh in ((100, 64), (4096, 64), (16384, 1024)):
                for variant, (normalizer, mask, causal, dropout, kl) in DENSE_VARIANTS.items():
                    name = f"dense-bam {dtype_name} d={d} L={length} BH={bh} {variant}"

                    def run(dtype=dtype, allow_tf32=allow_tf32, d=d, length=length, bh=bh, normalizer=normalizer,
                            mask=mask, causal=causal, dropout=dropout, kl=kl):
                        with tf32_products(allow_tf32):
                            if not takes(dtype, d, d, interpret=False):
                                return  # no tiling: the chunked PyTorch path takes these
                            posterior, prior = names[normalizer]
                            bam = BAM(posterior, prior, key_dim=d).to("meta")
                            q, k, v = (torch.empty(bh // 8, 8, length, d, device="meta", dtype=dtype) for _ in range(3))
                            key_mask = torch.empty(bh // 8, 1, 1, length, device="meta", dtype=torch.bool) if mask \
                                else None
                            seed = torch.empty(1, device="meta", dtype=torch.long)
                            fused = kl_kind(bam.kl_kernel) if kl and not causal else 0
                            net = bam.prior_net
                            weights = [net.hidden.weight, net.hidden.bias, net.out.weight, net.out.bias] \
                                if fused and net is not None else [None] * 4
                            noise = NOISE_WEIBULL if posterior == "weibull" else NOISE_LOGNORMAL
                            options = (causal, d ** -0.5, noise, bam.noise_scale, dropout, fused,
                                       constants(bam.kl_kernel), False, ACTIVATIONS["relu"], kl and causal, False)
                            out, kl_value, stats = attention_forward(q, k, v, key_mask, seed, *weights, *options)
                            attention_backward(q, k, v, key_mask, seed, *weights, out, stats, torch.empty_like(out),
                                               kl_value if fused else None, None, *options)
                    yield name, run


#: Graphs of the edge-wise cases: (nodes, edges with self-loops).
GRAPHS = {"cora": (2708, 13264), "1.2M-edges": (100000, 1200000)}


def _edge_bam_cases() -> Iterator[tuple[str, Callable[[], None]]]:
    import torch

    from ..bam import BAM
    from ..edge_bam import Options
    from .edge_bam import backward, forward

    variants = {
        "bam-wc": dict(posterior="weibull", prior="contextual", key_dim=8),
        "bam-lc": dict(posterior="lognormal", prior="contextual", key_dim=8),
        "bam-wf": dict(posterior="weibull", prior="fixed"),
        "bam-wc-all": dict(posterior="weibull", prior="contextual", key_dim=8, prior_scope="all"),
    }
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for graph, (nodes, edges) in GRAPHS.items():
            for variant, options in variants.items():
                for sampling in (True, False):
                    name = f"edge-bam {str(dtype)[6:]} {graph} heads=8 {variant} {'sample' if sampling else 'mean'}"

                    def run(dtype=dtype, nodes=nodes, edges=edges, options=options, sampling=sampling):
                        bam = BAM(**options)
                        scores = torch.empty(edges, 8, device="meta", dtype=dtype)
                        prior = torch.empty_like(scores) if bam.prior_net is not None else None
                        ptr = torch.empty(nodes + 1, device="meta", dtype=torch.long)
                        seed = torch.empty(1, device="meta", dtype=torch.long)
                        kernel = Options.of(bam, sampling, with_kl=True, given_noise=False)
                        weights, kl, lse = forward(scores, prior, None, ptr, seed, *kernel)
                        backward(scores, prior, None, ptr, seed, lse, torch.empty_like(weights), torch.empty_like(kl),
                                 *kernel)
                    yield name, run


def _entmax_cases() -> Iterator[tuple[str, Callable[[], None]]]:
    import torch

    from .entmax_bisect import csr_backward, csr_forward, entmax_bisect_dense, power_mode

    alphas = {"learned": "tensor", "1.5": 1.5, "sparsemax": 2.0}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for alpha_name, alpha in alphas.items():
            for length in (100, 512, 16384):
                name = f"entmax dense {str(dtype)[6:]} L={length} heads=8 alpha={alpha_name}"

                def run(dtype=dtype, alpha=alpha, length=length):
                    x = torch.empty(2, 8, length, length if length <= 512 else 4, device="meta", dtype=dtype,
                                    requires_grad=True)
                    a = torch.empty(8, device="meta", dtype=dtype, requires_grad=True) if alpha == "tensor" else alpha
                    out = entmax_bisect_dense(x, a, None, n_iter=25)
                    inputs = (x, a) if alpha == "tensor" else (x,)
                    torch.autograd.grad(out, inputs, torch.empty_like(out))
                yield name, run
            for graph, (nodes, edges) in GRAPHS.items():
                name = f"entmax csr {str(dtype)[6:]} {graph} heads=8 alpha={alpha_name}"

                def run(dtype=dtype, alpha=alpha, nodes=nodes, edges=edges):
                    x = torch.empty(edges, 8, device="meta", dtype=dtype)
                    a = torch.empty(8, device="meta", dtype=dtype) if alpha == "tensor" else alpha
                    ptr = torch.empty(nodes + 1, device="meta", dtype=torch.long)
                    out = csr_forward(x, ptr, a, 25, power_mode(a))
                    csr_backward(out, torch.empty_like(out), ptr, a, power_mode(a), alpha_grad=alpha == "tensor")
                yield name, run


def _reference_flash_cases() -> Iterator[tuple[str, Callable[[], None]]]:
    import torch

    from .reference_flash import backward, forward

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for d in (64, 128):
            for causal in (False, True):
                name = f"reference-flash {str(dtype)[6:]} d={d} L=4096 BH=64 {'causal' if causal else 'full'}"

                def run(dtype=dtype, d=d, causal=causal):
                    q, k, v = (torch.empty(4, 16, 4096, d, device="meta", dtype=dtype) for _ in range(3))
                    out, lse = forward(q, k, v, causal, d ** -0.5)
                    backward(q, k, v, out, lse, torch.empty_like(out), causal, d ** -0.5)
                yield name, run


CASE_FAMILIES = {"dense-bam": _dense_bam_cases, "edge-bam": _edge_bam_cases, "entmax": _entmax_cases,
                 "reference-flash": _reference_flash_cases}


def matches(name: str, pattern: str) -> bool:
    """Whether every ``&``-separated part of ``pattern`` occurs in the case name ``name``."""
    return all(part in name for part in pattern.split("&"))


def collect(families=tuple(CASE_FAMILIES), arch: int = 90, match=()) -> list:
    """The distinct launches of every case of ``families`` (whose name :func:`matches` one of the patterns of
    ``match``, when given), each with the names of its cases."""
    distinct: dict = {}
    match = (match,) if isinstance(match, str) else tuple(match)
    for family in families:
        for name, run in CASE_FAMILIES[family]():
            if match and not any(matches(name, pattern) for pattern in match):
                continue
            with recording(arch) as launches:
                run()
            for launch in launches:  # a forward precompiles its backward kernels: a case may launch one twice
                cases = distinct.setdefault(launch.key(), launch).cases
                if name not in cases:
                    cases.append(name)
    return list(distinct.values())


# ------------------------------------------------------------------- compilation ----
@dataclass
class Report:
    """The compile result of one launch for one architecture."""

    arch: int
    launch: dict
    cases: list
    ok: bool
    registers: Optional[int] = None
    spill_bytes: Optional[int] = None  # the per-thread stack frame: local memory, i.e. spilled registers
    shared_bytes: Optional[int] = None
    shared_limit: Optional[int] = None
    seconds: float = 0.0
    error: Optional[str] = None
    sass: Optional[dict] = None  # with --sass: common.attention.kernels.sass.analyse


def resource_usage(cubin: bytes) -> dict:
    """``REG``, ``STACK``, ``SHARED`` and ``LOCAL`` of the cubin's kernel, read by ``cuobjdump``."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
                              capture_output=True, text=True, check=True).stdout
    line = next(line for line in text.splitlines() if "REG:" in line)
    return {key: int(value) for key, value in (item.split(":", 1) for item in line.split())
            if key in ("REG", "STACK", "SHARED", "LOCAL")}


def compile_launch(launch: Launch, arch: int, sass: bool = False) -> Report:
    """Compile ``launch`` for ``sm_<arch>`` and read its resources, and its SASS when ``sass`` (a failed compile
    is a report too)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import _triton_jit_function_registry

    start = time.perf_counter()
    report = Report(arch, launch.describe(), sorted(launch.cases), ok=False, shared_limit=SHARED_LIMIT.get(arch))
    try:
        fn = _triton_jit_function_registry[launch.kernel]
        kernel = triton.compile(ASTSource(fn, launch.signature, launch.constexprs, launch.attrs),
                                target=GPUTarget("cuda", arch, 32), options=launch.options)
        usage = resource_usage(kernel.asm["cubin"])
        report.registers = usage["REG"]
        report.spill_bytes = usage["STACK"] + usage["LOCAL"]
        report.shared_bytes = kernel.metadata.shared + usage["SHARED"]
        problems = []
        if report.spill_bytes:
            problems.append(f"{report.spill_bytes} bytes of stack (spilled registers) per thread")
        if report.shared_limit is not None and report.shared_bytes > report.shared_limit:
            problems.append(f"{report.shared_bytes} bytes of shared memory > {report.shared_limit}")
        if sass:
            from . import sass as sass_report
            report.sass = sass_report.analyse(sass_report.disassemble(kernel.asm["cubin"]), kernel.asm["ttgir"],
                                              report.launch["num_warps"], report.launch["constexprs"])
            if sass_report.missing_mma(report.sass, report.launch["pointers"]):
                problems.append("no tensor-core MMA in the main loop of a bf16/fp16 score-tile kernel")
        report.ok, report.error = not problems, "; ".join(problems) or None
    except Exception as err:  # a compile failure is a result, not a crash of the check
        report.error = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    report.seconds = round(time.perf_counter() - start, 2)
    return report


def _compile_in_child(launch: Launch, arch: int, sass: bool, conn, log_path: str) -> None:
    """A forked child's work: compile, send the report; LLVM aborts go to ``log_path``, not the terminal."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    conn.send(asdict(compile_launch(launch, arch, sass)))
    conn.close()


def _isolated(job) -> dict:
    """:func:`compile_launch` in a forked child, so that a compiler crash (LLVM aborts the process on
    some inputs) becomes a failed report instead of ending the check."""
    import multiprocessing

    launch, arch, sass = job
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    with tempfile.NamedTemporaryFile(suffix=".log") as log:
        child = context.Process(target=_compile_in_child, args=(launch, arch, sass, send, log.name))
        child.start()
        send.close()
        try:
            report = receive.recv()
        except EOFError:  # the child died before sending
            report = None
        child.join()
        if report is None:
            crash = open(log.name, errors="replace").read().strip().splitlines()
            report = asdict(Report(arch, launch.describe(), sorted(launch.cases), ok=False,
                                   shared_limit=SHARED_LIMIT.get(arch),
                                   error=f"compiler crashed (exit {child.exitcode}): {crash[0] if crash else ''}"))
    return report


def check(arches=ARCHES, families=tuple(CASE_FAMILIES), jobs: Optional[int] = None,
          progress: Callable[[dict], None] = lambda report: None, match=(), sass: bool = False) -> list:
    """Reports (as dicts) for every distinct launch of ``families`` on every architecture of ``arches``, with
    their SASS analysed when ``sass``."""
    from concurrent.futures import ThreadPoolExecutor

    work = [(launch, arch, sass) for arch in arches for launch in collect(families, arch, match)]
    reports = []
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:  # each thread forks one compile at a time
        for report in pool.map(_isolated, work):
            progress(report)
            reports.append(report)
    return reports


def summary(reports: list) -> dict:
    """Counts: launches compiled, failed, spilling, over the shared-memory limit, without the tensor cores they
    need (with ``--sass``); the worst of each."""
    from .sass import missing_mma

    compiled = [r for r in reports if r["registers"] is not None]
    return {
        "launches": len(reports),
        "compiled": len(compiled),
        "failed_to_compile": len(reports) - len(compiled),
        "spilling": sum(1 for r in compiled if r["spill_bytes"]),
        "over_shared_limit": sum(1 for r in compiled if r["shared_limit"] and r["shared_bytes"] > r["shared_limit"]),
        "max_registers": max((r["registers"] for r in compiled), default=None),
        "max_shared_bytes": max((r["shared_bytes"] for r in compiled), default=None),
        "missing_mma": sum(1 for r in compiled if r["sass"] and missing_mma(r["sass"], r["launch"]["pointers"])),
        "ok": all(r["ok"] for r in reports),
    }


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHES), choices=sorted(SHARED_LIMIT),
                        help="compute capabilities to compile for (default: %(default)s)")
    parser.add_argument("--family", nargs="+", default=list(CASE_FAMILIES), choices=list(CASE_FAMILIES),
                        help="which kernels (default: all)")
    parser.add_argument("--match", nargs="+", default=(),
                        help="only the cases whose name contains one of these (e.g. 'bfloat16 d=128'); parts joined "
                             "by '&' must all occur (e.g. 'bfloat16 d=64&L=16384&weibull')")
    parser.add_argument("--sass", action="store_true",
                        help="analyse each launch's SASS and sum each case's launches (instructions, MUFU, integer "
                             "and tensor-core operations per score element, barriers, H100 roofline)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: the CPU count)")
    parser.add_argument("--out", default=None, help="write the reports and the summary as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default; unset it warns on every compile

    def progress(report: dict) -> None:
        launch = report["launch"]
        status = "ok" if report["ok"] else f"FAIL ({report['error']})"
        print(f"sm_{report['arch']} {launch['kernel']:<14} warps={launch['num_warps']} "
              f"regs={report['registers']} spill={report['spill_bytes']} shared={report['shared_bytes']} "
              f"{_sass_line(report['sass'])}{report['seconds']}s {status} "
              f"[{report['cases'][0]}{' +' if len(report['cases']) > 1 else ''}]", flush=True)

    reports = check(args.arch, args.family, args.jobs, progress, args.match, args.sass)
    result = {"summary": summary(reports), "reports": reports}
    if args.sass:
        from .sass import calls, family_summary
        result["calls"] = calls(reports)
        result["families"] = family_summary(result["calls"])
        for row in result["families"]:
            print(f"sm_{row['arch']} {row['family']} {row['dtype']} d={row['head_dim']}: forward+backward "
                  f"{row['min_instructions_per_element']}-{row['max_instructions_per_element']} instructions per "
                  f"score element over {row['calls']} calls, H100 bound <= {row['max_bound_ps']} ps per element "
                  f"(most: {row['max_case']})")
    print(json.dumps(result["summary"]))
    if args.out:
        from ...utils.io import atomic_write_json
        atomic_write_json(args.out, result)
    return 0 if result["summary"]["ok"] else 1


def _sass_line(sass: Optional[dict]) -> str:
    """The per-element numbers of a launch's SASS report for the progress line ('' without one)."""
    if not sass or not sass["per_element"]:
        return f"loops={sass['loops']} " if sass else ""
    e = sass["per_element"]
    return (f"insn/elem={e['instructions']:.1f} mufu={e['mufu']:.2f} int={e['integer']:.1f} mma={e['mma']:.3f} "
            f"bar/iter={sass['barriers_per_iteration']} repl={sass['mma_replication']} "
            f"bound={sass['bound_ps']}ps({sass['binding']}) ")

if __name__ == "__main__":
    sys.exit(main())
