"""A command whose optional extra is not installed says which package is missing and the ``pip install`` to run,
in one line with exit status 2, before it reads data or creates a directory (common.utils.extras)."""
import importlib
import re
import sys
from pathlib import Path

import pytest

from common.utils import extras

ROOT = Path(__file__).resolve().parents[1]
#: command -> (its arguments, a package of its extra, the extra); ``OUT`` is a directory the command must not create.
OUT = "out"
CLIS = {
    "mt.prepare": (["multi30k", "--out", OUT], "sacremoses", "mt"),
    "mt.train": (["--preset", "demo", "--out", OUT], "sacrebleu", "mt"),
    "mt.evaluate": ([OUT], "sacrebleu", "mt"),
    "mt.translate": ([OUT], "subword_nmt", "mt"),
    "captioning.train": (["--demo", "--out", OUT], "pycocoevalcap", "captioning"),
    "captioning.evaluate": ([OUT], "pycocoevalcap", "captioning"),
    "vqa.lxmert.train": (["--demo", "--out", OUT], "safetensors", "lxmert"),
    "vqa.lxmert.evaluate": ([OUT], "transformers", "lxmert"),
    "vqa.lxmert.flops": (["--out", f"{OUT}/flops.json"], "transformers", "lxmert"),
    "tagging.train": (["--demo", "--out", OUT], "conllu", "tagging"),
    "tagging.evaluate": ([OUT], "conllu", "tagging"),
    "nlu.train": (["--task", "RTE", "--out", OUT], "sklearn", "nlu"),
    "nlu.evaluate": ([OUT], "sklearn", "nlu"),
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory, also the cache and the data root, so that anything written shows."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTN_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setattr("sys.stdin", open("/dev/null"))
    return tmp_path


@pytest.mark.parametrize("module", sorted(CLIS))
def test_a_missing_extra_is_one_line_before_any_work(module, workdir, capsys, monkeypatch):
    argv, package, extra = CLIS[module]
    monkeypatch.setitem(sys.modules, package, None)  # not importable, and find_spec finds nothing
    assert importlib.import_module(module).main(argv) == 2
    err = capsys.readouterr().err
    distribution = extras.EXTRAS[extra][package]
    assert err == f'error: {distribution} is not installed (the {extra} extra): pip install -e ".[{extra}]"\n'
    assert list(workdir.iterdir()) == []  # no output directory, no data, no cache


@pytest.mark.parametrize("module", ["mt.train", "nlu.evaluate"])
def test_help_answers_without_the_extra(module, workdir, capsys, monkeypatch):
    argv, package, _ = CLIS[module]
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(module).main(["--help"])
    assert stop.value.code == 0 and "usage:" in capsys.readouterr().out


def test_several_missing_packages_are_named_together(monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    monkeypatch.setitem(sys.modules, "subword_nmt", None)
    assert extras.missing_extra_message("mt") == \
        'sacrebleu and subword-nmt are not installed (the mt extra): pip install -e ".[mt]"'
    assert extras.missing_extra_message("tagging") is None


def test_an_unknown_extra_is_refused_when_a_command_is_defined():
    with pytest.raises(ValueError, match=r"unknown extra 'nlp'; the extras commands need are captioning, mt"):
        extras.needs_extra("nlp")


def test_the_packages_are_those_pyproject_declares():
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, packages in extras.EXTRAS.items():
        names = {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0] for requirement in declared[extra]}
        assert set(packages.values()) == names, extra
