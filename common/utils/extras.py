"""The optional extras of ``pyproject.toml`` that a command needs, checked before it does any work.

    @console.interruptible
    @needs_extra("mt")
    def main(argv=None) -> int:
        ...

Without one of the extra's packages the command prints one line and exits with status 2 before it
parses its options further, reads data or creates a directory (``--help`` still answers)::

    error: sacrebleu is not installed (the mt extra): pip install -e ".[mt]"

Packages are looked up with :func:`importlib.util.find_spec`, which imports nothing.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from typing import Callable, Dict, List, Optional, Sequence

#: extra -> {import name: the distribution pip installs}: the optional-dependencies of pyproject.toml that the
#: commands import (``scatter``, ``sampler`` and ``kernels`` are optional within a command, which checks them itself).
EXTRAS: Dict[str, Dict[str, str]] = {
    "captioning": {"pycocoevalcap": "pycocoevalcap"},
    "mt": {"sacrebleu": "sacrebleu", "sacremoses": "sacremoses", "subword_nmt": "subword-nmt"},
    "tagging": {"conllu": "conllu"},
    "lxmert": {"transformers": "transformers", "torch_optimizer": "torch-optimizer", "safetensors": "safetensors"},
    "nlu": {"transformers": "transformers", "safetensors": "safetensors", "sklearn": "scikit-learn"},
}
HELP_OPTIONS = ("-h", "--help")


def install_command(extra: str) -> str:
    """``pip install -e ".[<extra>]"``."""
    return f'pip install -e ".[{extra}]"'


def missing_packages(extra: str) -> List[str]:
    """The distributions of ``extra`` whose modules are not importable here."""
    return [distribution for module, distribution in EXTRAS[extra].items() if importlib.util.find_spec(module) is None]


def missing_extra_message(extra: str) -> Optional[str]:
    """One line naming the missing packages of ``extra`` and the command that installs them; None if none is."""
    missing = missing_packages(extra)
    if not missing:
        return None
    names = ", ".join(missing[:-1]) + " and " + missing[-1] if len(missing) > 1 else missing[0]
    verb = "are" if len(missing) > 1 else "is"
    return f"{names} {verb} not installed (the {extra} extra): {install_command(extra)}"


def needs_extra(extra: str) -> Callable:
    """Decorate a command's ``main(argv)``: without a package of ``extra`` it prints ``error: <the one line>`` on
    stderr and returns 2 before ``main`` runs (unless the command line asks for ``--help``)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; the extras commands need are {', '.join(EXTRAS)}")

    def decorate(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def checked(argv: Optional[Sequence[str]] = None) -> int:
            asks_help = any(arg in HELP_OPTIONS for arg in (sys.argv[1:] if argv is None else argv))
            message = None if asks_help else missing_extra_message(extra)
            if message:
                print(f"error: {message}", file=sys.stderr)
                return 2
            return main(argv)
        return checked
    return decorate
