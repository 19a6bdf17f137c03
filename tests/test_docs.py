"""The README and the guides in docs/ say what runs: every Python block executes, every command
line's options parse with the CLI it names, and every link points at a file in the repository."""
from __future__ import annotations

import argparse
import importlib
import inspect
import re
import shlex
from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

#: What a guide's Python block takes as given (a feature store, a vocabulary and a batch), set up here.
PRELUDES = {
    "features.md": """
import numpy as np
from common.features import RegionFeatureWriter
ids = [273052, 1]
with RegionFeatureWriter("coco_trainval_36.h5", feature_dim=2048) as writer:
    for i, n in zip(ids, (36, 10)):
        writer.add(i, np.random.rand(n, 2048).astype("float32"), np.tile([0, 0, 5, 5], (n, 1)).astype("float32"),
                   480, 640)
""",
    "vqa.md": """
import torch
from common.text import Vocabulary
vocab = Vocabulary(["what", "is", "this"])
batch = {"question_tokens": torch.tensor([[2, 3, 4]]), "question_mask": torch.ones(1, 3, dtype=torch.bool),
         "features": torch.randn(1, 5, 2048), "region_mask": torch.ones(1, 5, dtype=torch.bool)}
""",
}


def blocks(language: str):
    for doc in DOCS:
        for index, match in enumerate(m for m in BLOCK.finditer(doc.read_text(encoding="utf-8"))
                                      if m.group(1) == language):
            yield pytest.param(doc, match.group(2), id=f"{doc.name}-{language}{index}")


@pytest.mark.parametrize("doc, code", list(blocks("python")))
def test_python_blocks_run(doc, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(PRELUDES.get(doc.name, "") + code, f"{doc.name} block", "exec"), namespace)


class _Parsed(Exception):
    """Raised once a CLI's parser accepted the arguments, so that nothing runs."""


def _commands(code: str):
    """``(target, argv)`` of every ``python -m pkg.mod ...``, ``torchrun ... -m pkg.mod ...`` or
    ``python scripts/x.py ...`` in a shell block (continuation lines joined, comments dropped)."""
    code = code.replace("\\\n", " ")
    for line in code.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        parts, words = [], []
        for token in lexer:
            if token in {";", "&", "&&", "|", "||", "do", "done", "wait"}:
                parts.append(words)
                words = []
            else:
                words.append(token)
        for words in [*parts, words]:
            if "-m" in words:
                at = words.index("-m")
                if at + 1 < len(words) and words[at + 1].split(".")[0] in {"graphattn", "mt", "captioning", "vqa"}:
                    yield words[at + 1], words[at + 2:]
            elif len(words) > 1 and words[0].endswith("python") and words[1].startswith(("scripts/", "benchmarks/")):
                yield words[1], words[2:]


def _main_of(target: str):
    if target.endswith(".py"):
        module = load_script(target)
    else:
        module = importlib.import_module(target)
    return module.main


COMMANDS = sorted({(target, tuple(argv)) for doc in DOCS
                   for match in BLOCK.finditer(doc.read_text(encoding="utf-8")) if match.group(1) == "bash"
                   for target, argv in _commands(match.group(2))})


@pytest.mark.parametrize("target, argv", COMMANDS, ids=[f"{t} {' '.join(a)}"[:80] for t, a in COMMANDS])
def test_every_documented_command_line_parses(target, argv, monkeypatch, capsys):
    """One flag vocabulary: each documented option exists on the CLI it is given to."""
    for name in ("parse_args", "parse_intermixed_args"):
        original = getattr(argparse.ArgumentParser, name)

        def parse(self, args=None, namespace=None, _original=original):
            _original(self, args, namespace)
            raise _Parsed

        monkeypatch.setattr(argparse.ArgumentParser, name, parse)
    main = _main_of(target)
    monkeypatch.setattr("sys.argv", [target, *argv])  # for a main() that reads sys.argv
    try:
        with pytest.raises(_Parsed):
            main(list(argv)) if inspect.signature(main).parameters else main()
    except SystemExit as err:  # argparse's exit on an unknown option
        pytest.fail(f"{target} {' '.join(argv)}: {capsys.readouterr().err.strip()} (exit {err.code})")


def test_every_link_points_at_a_file_in_the_repository():
    missing = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)", doc.read_text(encoding="utf-8")):
            if not target.startswith(("http://", "https://", "mailto:")) and not (doc.parent / target).exists():
                missing.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not missing, missing
