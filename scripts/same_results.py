"""Whether a change of the training code leaves every domain's results as they were: each domain's demo and a short
real run, trained from two checkouts with the same seeds, compared number by number.

    git worktree add ../before <commit>            # the code before the change
    python scripts/same_results.py run ../before runs/same/before
    python scripts/same_results.py run . runs/same/after
    python scripts/same_results.py compare runs/same/before runs/same/after   # writes runs/same/after/same.json

``run`` trains, one thread each, in ``<checkout>`` (about 10 minutes on a 2-core CPU, with ``$ATTN_DATA_ROOT``):
the tagging demo (softmax, 2 seeds; BAM-WC), GUM ``pe-add`` for 1 epoch, MRPC BAM-WC for 50 updates, Cora and
CiteSeer BAM-WC over 3 seeds, the MT demo and Multi30k ``lstm-cpu`` for 200 updates, the MCAN demo, the LXMERT
demos ``bam`` and ``span``, and the Att2in demo. ``compare`` reads every JSON file of each run (``results.json``,
``seed<k>.json``, ``config.json``, ``metrics.jsonl``) and every tensor of its ``best.pt`` and ``seed<k>.pt``, and
lists what differs, leaving out what no seed fixes: timings, dates, paths, library versions and commits.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, Tuple

from common.utils import atomic_write_json

#: Each run: its name and the module and arguments that train it (``--out`` and one thread added).
RUNS = {
    "tag_demo_softmax": ["tagging.train", "--demo", "--seeds", "2"],
    "tag_demo_bamwc": ["tagging.train", "--demo", "--attention", "bam-wc", "--seeds", "1"],
    "tag_gum": ["tagging.train", "--treebank", "UD_English-GUM", "--variant", "pe-add", "--seeds", "1",
                "train.max_epochs=1"],
    "mrpc": ["nlu.train", "--task", "MRPC", "--attention", "bam-wc", "train.max_updates=50"],
    "cora": ["graphattn.train", "--dataset", "Cora", "--attention", "bam-wc", "--seeds", "3"],
    "citeseer": ["graphattn.train", "--dataset", "CiteSeer", "--attention", "bam-wc", "--seeds", "3"],
    "mt_demo": ["mt.train", "--preset", "demo"],
    "mt_lstm": ["mt.train", "--preset", "lstm-cpu", "train.max_steps=200"],
    "mcan": ["vqa.train", "--demo"],
    "lx_bam": ["vqa.lxmert.train", "--demo", "--variant", "bam"],
    "lx_span": ["vqa.lxmert.train", "--demo", "--variant", "span"],
    "att2in": ["captioning.train", "--demo"],
}
#: Keys whose values no seed fixes (matched anywhere in a key).
UNFIXED = re.compile(r"seconds|per_second|created|time|wall|commit|date|host|python|version|path|checkpoint|plots|"
                     r"out_dir|data_root|prepared_dir|environment|dir$|runtime|model$|file|source", re.I)


def run_all(checkout: Path, out: Path) -> None:
    """Train every run of :data:`RUNS` from ``checkout`` into ``out/<name>`` (a finished one is skipped)."""
    out = out.resolve()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(checkout.resolve())}
    for name, (module, *args) in RUNS.items():
        if (out / name / "results.json").exists():
            continue
        start = time.perf_counter()
        log = out / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as stream:
            code = subprocess.call([sys.executable, "-m", module, *args, "--out", str(out / name), "--threads", "1",
                                    "--no-progress"], cwd=checkout, env=env, stdout=stream, stderr=subprocess.STDOUT)
        print(f"{name}: exit {code}, {time.perf_counter() - start:.0f} s (log {log})", flush=True)
        if code:
            raise SystemExit(f"{name} failed: see {log}")


def _values(node, key: str = "") -> Iterator[Tuple[str, object]]:
    if isinstance(node, dict):
        for name, value in node.items():
            if not UNFIXED.search(str(name)):
                yield from _values(value, f"{key}/{name}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _values(value, f"{key}[{i}]")
    elif not isinstance(node, bool):
        yield key, node


def _json_values(path: Path) -> Dict[str, object]:
    text = path.read_text(encoding="utf-8")
    node = [json.loads(line) for line in text.splitlines()] if path.suffix == ".jsonl" else json.loads(text)
    return dict(_values(node))


def _tensors(path: Path) -> Dict[str, object]:
    import torch

    def walk(node, key=""):
        if isinstance(node, torch.Tensor):
            yield key, node
        elif isinstance(node, dict):
            for name, value in node.items():
                yield from walk(value, f"{key}/{name}")

    return dict(walk(torch.load(path, map_location="cpu", weights_only=False)))


def compare(before: Path, after: Path) -> Dict:
    """Per run: how many values (JSON numbers and strings, tensors) were compared and which differ."""
    import torch

    report = {}
    for name in RUNS:
        compared, differ = 0, []
        files = [p for p in sorted((before / name).rglob("*")) if p.suffix in (".json", ".jsonl")
                 or p.name == "best.pt" or re.fullmatch(r"seed\d+\.pt", p.name)]
        for path in files:
            other = after / path.relative_to(before)
            if not other.exists():
                differ.append(f"{other} is missing")
                continue
            if path.suffix == ".pt":
                mine, theirs = _tensors(path), _tensors(other)
                same = {key: key in theirs and torch.equal(value, theirs[key]) for key, value in mine.items()}
            else:
                mine, theirs = _json_values(path), _json_values(other)
                same = {key: mine.get(key) == theirs.get(key) for key in mine.keys() | theirs.keys()}
            compared += len(same)
            differ += [f"{path.relative_to(before)}{key}" for key, ok in sorted(same.items()) if not ok]
        report[name] = {"compared": compared, "differ": differ}
        print(f"{name}: {compared} values compared, {len(differ)} differ" + "".join(f"\n  {d}" for d in differ[:10]))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train every run from a checkout")
    run.add_argument("checkout", type=Path)
    run.add_argument("out", type=Path)
    both = commands.add_parser("compare", help="compare the runs of two outputs; writes <after>/same.json")
    both.add_argument("before", type=Path)
    both.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run_all(args.checkout, args.out)
        return 0
    report = compare(args.before, args.after)
    identical = all(not run["differ"] and run["compared"] for run in report.values())
    record = {"before": str(args.before), "after": str(args.after), "identical": identical, "runs": report}
    atomic_write_json(args.after / "same.json", record)
    print("ALL IDENTICAL" if identical else "DIFFERENCES (above)")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
