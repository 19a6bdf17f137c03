"""The idle cost of a CLI's settings: one command on an idle CPU, from several checkouts or settings, alternated.

    python benchmarks/idle_cost.py BEFORE . ".::--threads 2::OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=300000" \\
        [--command gat] [--repeats 4]

Each variant is ``checkout[::extra arguments[::NAME=VALUE ...]]``: a directory holding a checkout of the project
(``git worktree add ../before <commit>``), the arguments added to the command, and its environment. One round runs
every variant once, in turn, so that a drift of the machine reaches all of them alike; the report gives each
variant's median wall time and median training seconds (the seeds' ``train_seconds`` in ``results.json``) and
its ratio to the first variant's. Issue 40's target: the defaults that keep a busy CPU from stalling
(:mod:`benchmarks.busy_cpu`) cost at most 10 % of the idle speed of the defaults before them.
``OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=300000`` is libgomp's default spinning (every CLI sets ``PASSIVE`` when the
environment names no policy). Writes ``results/idle_cost.json``. Never run it beside another timing or a grid.
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._measure import environment, write_json  # noqa: E402
from benchmarks.busy_cpu import COMMANDS, parse_env, run_once  # noqa: E402


def parse_variant(spec: str) -> dict:
    """``checkout[::args[::NAME=VALUE ...]]`` as a dict, the checkout's commit with it."""
    tree, args, env = (spec.split("::") + ["", ""])[:3]
    if not (Path(tree) / "common").is_dir():
        raise SystemExit(f"error: variant {spec!r}: {tree} is not a checkout of this project (no common/ in it); "
                         f"make one with: git worktree add <dir> <commit>")
    commit = subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"spec": spec, "checkout": str(Path(tree).resolve()), "commit": commit or None,
            "args": shlex.split(args), "env": parse_env(shlex.split(env))}


def median_or_none(values: List) -> object:
    return None if not values or None in values else statistics.median(values)


def _number(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", metavar="CHECKOUT[::ARGS[::ENV]]")
    parser.add_argument("--command", choices=list(COMMANDS), default="gat",
                        help="what to run (benchmarks/busy_cpu.py's commands; default gat, the README's main one)")
    parser.add_argument("--repeats", type=int, default=4, help="rounds (default 4)")
    parser.add_argument("--data-root", default=os.environ.get("ATTN_DATA_ROOT", ""),
                        help="the shared data directory (default $ATTN_DATA_ROOT)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    variants = [parse_variant(spec) for spec in args.variants]
    for variant in variants:
        variant["wall_s"], variant["train_s"] = [], []
    for round_ in range(args.repeats):
        for variant in variants:
            wall, train = run_once(COMMANDS[args.command] + variant["args"], variant["env"], args.data_root,
                                   cwd=variant["checkout"])
            variant["wall_s"].append(wall)
            variant["train_s"].append(train)
            print(f"round {round_ + 1}/{args.repeats} {variant['spec']}: wall {wall:.1f} s, training "
                  f"{'-' if train is None else f'{train:.1f} s'}", flush=True)
    first = variants[0]
    for variant in variants:
        for key in ("wall_s", "train_s"):
            variant[f"{key}_median"] = median_or_none(variant[key])
            base = first[f"{key}_median"]
            variant[f"{key}_ratio"] = None if base is None or variant[f"{key}_median"] is None \
                else variant[f"{key}_median"] / base
        print(f"{variant['spec']} ({(variant['commit'] or '?')[:7]}): median wall {variant['wall_s_median']:.1f} s "
              f"({variant['wall_s_ratio']:.2f}x the first), training {_number(variant['train_s_median'], '.1f')} s "
              f"({_number(variant['train_s_ratio'], '.2f')}x)")
    path = write_json("idle_cost", {"command": COMMANDS[args.command], "repeats": args.repeats,
                                    "environment": environment(threads=0), "variants": variants})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
