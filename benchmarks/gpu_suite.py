"""Every GPU number of the suite in one command, for the few minutes a GPU is at hand.

    python -m benchmarks.gpu_suite --out DIR [--data-root DIR] [--budget-minutes 7] [--parts ...]

The parts run in this order, each in its own process and time box (a part that overruns is stopped, the
next one starts), the issue's headline numbers first, so that the default 7 minutes yield them:

1. ``dense-bam`` (200 s): BAM-WC through ``Attend`` vs the fastest baseline and the reference Triton flash
   kernel, rows of equal length first (bf16 then fp32; L = 4096, 16384, 512; head sizes 64 and 128), then
   padded rows; time, TFLOP/s, first call apart, peak memory (``benchmarks/block.py --only bam``);
2. ``mcan`` (50 s): MCAN-small training and inference steps in eager mode, softmax vs BAM-WC, fp32 and bf16
   (``benchmarks/vqa.py``; first calls apart);
3. ``gat`` (45 s): our GAT layers (softmax, BAM-WC) vs PyG's ``GATConv`` on Cora (``benchmarks/gat.py``);
4. ``lxmert`` (60 s): LXMERT-base with BAM, entmax and a binding span vs plain Hugging Face
   (``benchmarks/lxmert.py``);
5. ``gpu-tests`` (150 s): ``pytest tests/gpu`` (the kernels against the PyTorch paths, CUDA training runs);
6. ``mcan-compiled`` (150 s): the MCAN-small rows under ``torch.compile`` (default and reduce-overhead, bf16);
7. ``gat-large`` (120 s): the GAT layers on a 1.2M-edge graph, with a fresh graph per call and peak memory,
   and 30 NeighborLoader mini-batches of it (skipped, with the reason, where the image has no sampler);
8. ``mt-throughput`` (60 s): MT Transformer training tokens/s vs ``nn.Transformer`` (``benchmarks/mt.py``);
9. ``mt-convergence``: Multi30k Transformers trained for ``--mt-minutes`` each, vanilla, predictive and
   evolving attention side by side (BLEU at the end, so that learning speed can be compared).

Before the first part ``DIR/suite.json`` records the machine (GPU, driver, CUDA, torch, Triton, Python);
after every part it and ``DIR/summary.md`` are rewritten (status, seconds, the part's JSON; a line per dense
BAM row), so a session that runs out of time still leaves everything measured so far. A part that would
start with under 10 s of the budget left is skipped. No part needs the network. On a fresh GPU machine the
packages that its image lacks travel as wheels (``scripts/gpu_bundle.sh``, docs/gpu.md, "The GPU suite").
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
#: The default budget (minutes): the first four parts in full, then the GPU tests in what is left.
BUDGET_MINUTES = 7.0
sys.path.insert(0, str(ROOT))  # run as a script too


@dataclass
class Part:
    """One time-boxed step: ``commands`` run side by side (each in its own process); ``results`` are the
    JSON files (relative to the output directory) it writes."""

    name: str
    title: str
    seconds: float
    commands: List[List[str]]
    results: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    before: Optional[List[str]] = None  # run first, alone (e.g. data preparation), inside the same time box


def parts(out: Path, data_root: str, mt_minutes: float, device: str = "cuda") -> List[Part]:
    """The suite's parts for output directory ``out``."""
    results_env = {"ATTN_RESULTS_DIR": str(out)}

    def bench(script: str, *args: str) -> List[str]:
        return [PYTHON, str(ROOT / "benchmarks" / script), "--device", device, *args]

    def mcan(*rows: str, result: str) -> List[str]:
        return bench("vqa.py", "--batch-size", "64", "--repeats", "10", "--rows", *rows, "--out", str(out / result))

    def gat(sections: str, result: str) -> List[str]:
        return bench("gat.py", "--sections", sections, "--repeats", "20", "--epoch-batches", "30", "--data-root",
                     data_root, "--out", str(out / result))

    variants = {"vanilla": [], "predictive": ["model.encoder_attention.cross_layer={kind: predictive, alpha: 0.1}"],
                "evolving": [f"model.{site}.cross_layer={{kind: evolving, alpha: 0.1, beta: 0.1}}"
                             for site in ("encoder_attention", "decoder_attention", "cross_attention")]}
    prepared = out / "mt-prepared"
    mt_common = ["--preset", "transformer-cpu", "--data-root", data_root, "--device", device, "--no-progress",
                 f"prepared_dir={prepared}", "batching.max_tokens=8000", "train.max_steps=1000000",
                 f"train.max_minutes={mt_minutes}", "train.eval_every=0", "train.precision=bf16",
                 "train.log_every=20", "eval.valid_bleu_sentences=500"]
    compiled = [f"{name}/bf16/{mode}" for mode in ("default", "reduce-overhead") for name in ("softmax", "bam-wc")]
    return [
        Part("dense-bam", "dense BAM-WC vs the fastest baseline and the reference flash kernel", 200,
             [bench("block.py", "--only", "bam", "--bam", "bam-wc", "--padding", "none", "random", "--dtypes", "bf16",
                    "fp32", "--lengths", "4096", "16384", "512", "--head-dims", "64", "128", "--row-seconds", "0.5")],
             ["block_bam.json"], results_env),
        Part("mcan", "MCAN-small steps, eager", 50,
             [mcan("bam-wc/fp32/off", "softmax/bf16/off", "bam-wc/bf16/off", result="vqa.json")], ["vqa.json"]),
        Part("gat", "GAT layers vs PyG GATConv on Cora", 45, [gat("layer", "gat.json")], ["gat.json"]),
        Part("lxmert", "LXMERT variants vs plain Hugging Face", 60,
             [bench("lxmert.py", "--batch", "64", "--variants", "plain", "softmax", "bam-wc", "entmax", "span-bound",
                    "--name", "lxmert")], ["lxmert.json"], results_env),
        Part("gpu-tests", "pytest tests/gpu", 150,
             [[PYTHON, "-m", "pytest", str(ROOT / "tests" / "gpu"), "-q", "-p", "no:cacheprovider",
               f"--junitxml={out / 'gpu_tests.xml'}"]]),
        Part("mcan-compiled", "MCAN-small steps under torch.compile", 150,
             [mcan(*compiled, result="vqa_compiled.json")], ["vqa_compiled.json"]),
        Part("gat-large", "GAT layers and mini-batch epochs vs PyG GATConv on a 1.2M-edge graph", 120,
             [gat("large,minibatch_epoch", "gat_large.json")], ["gat_large.json"]),
        Part("mt-throughput", "MT Transformer tokens/s vs nn.Transformer", 60,
             [bench("mt.py", "--presets", "transformer-cpu", "--precision", "fp32", "bf16", "--no-decode",
                    "--data-root", data_root, "--out", "mt")], ["mt.json"], results_env),
        Part("mt-convergence", f"Multi30k Transformers, {mt_minutes:g} minutes each", 60 * mt_minutes + 120,
             [[PYTHON, "-m", "mt.train", *mt_common, "--out", str(out / f"mt-{name}"), *extra]
              for name, extra in variants.items()],
             [f"mt-{name}/results.json" for name in variants],
             before=[PYTHON, "-m", "mt.prepare", "multi30k", "--data-root", data_root, "--out", str(prepared)]),
    ]


def environment() -> dict:
    """The machine: GPU, driver, CUDA, torch, Triton, Python."""
    info = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch
        info.update(torch=torch.__version__, cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(0)
                    if torch.cuda.is_available() else None)
    except ImportError as err:
        info["torch"] = f"not importable: {err}"
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True) if _have("nvidia-smi") else None
    info["nvidia_smi"] = smi.stdout.strip() if smi is not None and smi.returncode == 0 else None
    return info


def _have(program: str) -> bool:
    return any((Path(d) / program).is_file() for d in os.environ.get("PATH", "").split(os.pathsep))


def run_part(part: Part, out: Path, seconds: float) -> dict:
    """Run ``part`` within ``seconds``; its record: status (ok, failed, timed out), seconds, exit codes,
    the tail of its output, and the JSON results it wrote."""
    start = time.monotonic()
    env = {**os.environ, **part.env, "PYTHONUNBUFFERED": "1",  # a part stopped by its box leaves its output
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = out / f"{part.name}.log"
    record = {"title": part.title, "time_box_s": round(seconds), "log": log.name}
    with open(log, "w") as sink:
        codes, timed_out = [], False
        if part.before:
            try:
                codes.append(subprocess.run(part.before, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                            timeout=seconds).returncode)
            except subprocess.TimeoutExpired:
                timed_out = True
        if not timed_out and not any(codes):
            procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
                     for cmd in part.commands]
            for proc in procs:
                try:
                    codes.append(proc.wait(timeout=max(seconds - (time.monotonic() - start), 1)))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    proc.kill()
                    proc.wait()
                    codes.append(None)
    record["seconds"] = round(time.monotonic() - start, 1)
    record["exit_codes"] = codes
    record["status"] = "timed out" if timed_out else "ok" if all(c == 0 for c in codes) else "failed"
    record["output_tail"] = log.read_text(errors="replace")[-2000:]
    record["results"] = {}
    for name in part.results:
        path = out / name
        if path.is_file():
            try:
                record["results"][name] = json.loads(path.read_text())
            except json.JSONDecodeError as err:
                record["results"][name] = {"error": f"unreadable: {err}"}
    return record


#: Keys of numbers worth a line in the summary (speed ratios, throughputs, memory, BLEU, test counts).
HEADLINE_KEYS = ("ratio", "_vs_", "per_second", "peak", "mib", "bleu", "ms", "passed", "failed")


def headline_numbers(payload, prefix: str = "", limit: int = 60) -> List[str]:
    """``path: value`` lines for the numbers of ``payload`` whose key names a speed, memory or score; a record
    with a ``summary`` line (a dense BAM row) is that line."""
    lines: List[str] = []

    def walk(node, path):
        if len(lines) >= limit:
            return
        if isinstance(node, dict) and isinstance(node.get("summary"), str):
            lines.append(f"{prefix}{node['summary']}")
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, list):
            for i, value in enumerate(node[:50]):
                walk(value, f"{path}[{i}]")
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            leaf = path.rsplit(".", 1)[-1].lower()
            if any(key in leaf for key in HEADLINE_KEYS):
                lines.append(f"{prefix}{path}: {node:.4g}" if isinstance(node, float) else f"{prefix}{path}: {node}")

    walk(payload, "")
    return lines


def junit_counts(path: Path) -> Optional[dict]:
    """Passed, failed, errors and skipped tests of a JUnit XML file."""
    import xml.etree.ElementTree as ET

    if not path.is_file():
        return None
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return {"passed": tests - failed - errors - skipped, "failed": failed, "errors": errors, "skipped": skipped}


def summary_markdown(suite: dict) -> str:
    """The Markdown summary of the records so far."""
    env = suite["environment"]
    lines = ["# GPU suite", "",
             f"GPU: {env.get('gpu')} ({env.get('nvidia_smi')}); torch {env.get('torch')} (CUDA {env.get('cuda')}), "
             f"Triton {env.get('triton')}, Python {env.get('python')}.", "",
             "| part | status | seconds (time box) |", "|---|---|---|"]
    for name, record in suite["parts"].items():
        box = record.get("time_box_s", "-")
        lines.append(f"| {name} | {record['status']} | {record.get('seconds', '-')} ({box}) |")
    for name, record in suite["parts"].items():
        lines += ["", f"## {name}: {record.get('title', '')}", ""]
        if record["status"] not in ("ok", "skipped"):
            lines += ["```", record.get("output_tail", "")[-1200:], "```"]
        if record.get("tests"):
            lines.append(f"- tests: {record['tests']}")
        for file, payload in record.get("results", {}).items():
            lines += [f"- {file}:"] + [f"  - {line}" for line in headline_numbers(payload)]
    return "\n".join(lines) + "\n"


def write(suite: dict, out: Path) -> None:
    from common.utils.io import atomic_write_json, atomic_write_text

    atomic_write_json(out / "suite.json", suite)
    atomic_write_text(out / "summary.md", summary_markdown(suite))


def run_suite(selected: List[Part], out: Path, budget_s: float,
              on_record: Callable[[str, dict], None] = lambda name, record: None) -> dict:
    """Run ``selected`` in order within ``budget_s`` seconds in all; rewrite the results after every part."""
    out.mkdir(parents=True, exist_ok=True)
    suite = {"environment": environment(), "budget_s": budget_s, "parts": {}}
    write(suite, out)
    start = time.monotonic()
    for part in selected:
        left = budget_s - (time.monotonic() - start)
        if left < 10:
            record = {"title": part.title, "status": "skipped", "reason": "out of the suite's time budget"}
        else:
            record = run_part(part, out, min(part.seconds, left))
            if part.name == "gpu-tests":
                record["tests"] = junit_counts(out / "gpu_tests.xml")
        suite["parts"][part.name] = record
        write(suite, out)
        on_record(part.name, record)
    return suite


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for suite.json, summary.md and each part")
    parser.add_argument("--data-root", default=os.environ.get("ATTN_DATA_ROOT"),
                        help="data root holding planetoid/ and mt/multi30k (default: $ATTN_DATA_ROOT)")
    parser.add_argument("--budget-minutes", type=float, default=BUDGET_MINUTES,
                        help=f"for all parts together (default {BUDGET_MINUTES:g}: the first four parts in full)")
    parser.add_argument("--mt-minutes", type=float, default=2.0, help="training time of each Multi30k run")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a smoke run of the plumbing
    names = [p.name for p in parts(Path("."), "", 2.0)]
    parser.add_argument("--parts", nargs="+", choices=names, default=names, help="run only these (default: all)")
    args = parser.parse_args(argv)
    if not args.data_root:
        parser.error("--data-root (or $ATTN_DATA_ROOT) is needed: the GAT and MT parts read planetoid/ and mt/multi30k")
    out = args.out.resolve()
    selected = [p for p in parts(out, str(Path(args.data_root).resolve()), args.mt_minutes, args.device)
                if p.name in args.parts]

    def report(name: str, record: dict) -> None:
        print(f"{name}: {record['status']} ({record.get('seconds', 0)} s)", flush=True)

    suite = run_suite(selected, out, 60 * args.budget_minutes, report)
    print(f"wrote {out / 'summary.md'}")
    return 0 if all(r["status"] == "ok" for r in suite["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
