"""The command-line options every training CLI shares, and their mapping onto config keys.

Each domain's ``train`` takes ``--data-root``, ``--out``, ``--config``, ``--device``,
``--threads``, ``--no-progress`` and any number of ``key=value`` config overrides (anywhere on the line,
between options too);
domain options (``--attention``, ``--dataset`` ...) are added to the returned parser and
become overrides through :func:`overrides_from`.

Every CLI imports this module before torch, and with it OpenMP's idle threads sleep instead of spinning
(``OMP_WAIT_POLICY=PASSIVE``, unless the environment sets a policy): libgomp reads the variable when torch
(or the C kernels) load it. On a CPU shared with other work the spinning threads stalled the CLIs: GLUE MRPC
for 50 updates took 3.42x its idle time beside two busy processes with them, 2.03x without, its idle time
8.7 % longer (``benchmarks/busy_cpu.py``, docs/utilities.md).
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any, Optional

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def training_parser(prog: str, description: str, defaults: str, example: str,
                    data_root_help: str = "data directory", out_help: str = "output directory"
                    ) -> argparse.ArgumentParser:
    """A parser with the shared options; parse it with ``parse_intermixed_args``.

    Args:
        prog: e.g. ``"python -m vqa.train"``.
        defaults: the packaged YAML that lists every key, e.g. ``"vqa/configs/mcan_small.yaml"``.
        example: overrides shown in the help, e.g. ``"kl.weight=0.01 train.batch_size=32"``.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     epilog=f"Any config key can be set as key=value, e.g. {example} (see {defaults}).")
    parser.add_argument("--data-root", help=f"{data_root_help} (default: $ATTN_DATA_ROOT, else the user cache)")
    parser.add_argument("--out", help=out_help)
    parser.add_argument("--config", help="a YAML file merged over the packaged config")
    add_device_option(parser)
    parser.add_argument("--threads", type=int, help="torch threads (default: the config's train.num_threads, "
                                                     "else torch's; 1 on a busy shared CPU)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser


def add_device_option(parser: argparse.ArgumentParser, default: Optional[str] = None) -> None:
    """``--device auto|cpu|cuda|cuda:N`` (see :mod:`common.utils.runtime`)."""
    parser.add_argument("--device", default=default, metavar="DEVICE",
                        help="auto (CUDA when available), cpu, cuda or cuda:N "
                             f"(default: {default or 'the config key device, auto'})")


def add_runtime_options(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--precision`` and ``--threads`` of the evaluate / translate / visualize CLIs."""
    add_device_option(parser, default="auto")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="autocast precision of the model (default fp32)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's; 1 on a busy shared CPU)")


def runtime_from(args: argparse.Namespace):
    """The :class:`~common.utils.runtime.Runtime` that :func:`add_runtime_options` describe."""
    from .runtime import Runtime

    return Runtime.create(args.device, args.precision, threads=args.threads)


def overrides_from(args: argparse.Namespace, options: Optional[Mapping[str, Any]] = None,
                   threads_key: str = "train.num_threads") -> list[str]:
    """``args.overrides`` then ``key=value`` for ``--data-root``/``--out``/``--device``/``--threads``
    (config key ``threads_key``) and each of ``options`` (config key -> value from a domain
    option) that was given; named options win."""
    given = {"data_root": args.data_root, "out_dir": args.out, "device": args.device,
             threads_key: getattr(args, "threads", None), **(options or {})}
    return list(args.overrides) + [f"{key}={value}" for key, value in given.items() if value is not None]
