"""The CLIs answer ``--help``, a bad option and a bad config value before they import torch, PyG,
transformers, matplotlib or the models: what they import is read from ``python -X importtime``
(independent of the machine's speed), not timed. ``import torch`` alone takes about 1.3 s on a small CPU
machine, so a CLI that answers without it answers in a fraction of a second."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Top-level packages a CLI may import only after its arguments and config have been checked. No CLI is
#: exempt from any of them: each parses its command line and checks its config with argparse, omegaconf
#: and the torch-free config modules, then imports the work (``<domain>/training.py`` and the like).
HEAVY_PACKAGES = ("torch", "torch_geometric", "transformers", "matplotlib", "scipy", "tensorboard")
#: The modules that hold models and layers.
MODEL_MODULES = ("graphattn.models", "graphattn.conv", "mt.models", "common.attention.bam", "common.attention.blocks")
#: CLI -> a config override it rejects (None: the CLI takes no config).
CLIS = {
    "graphattn.train": "kl.weight=abc",
    "graphattn.evaluate": None,
    "mt.prepare": None,
    "mt.train": "kl.weight=abc",
    "mt.evaluate": None,
    "mt.translate": None,
    "captioning.prepare": None,
    "captioning.train": "optim.lr=abc",
    "captioning.evaluate": None,
    "captioning.visualize": None,
    "scripts/convert_features.py": None,
    "scripts/extract_features.py": None,
    "scripts/reproduce_gat_table.py": None,
    "scripts/reproduce_mt_compare.py": None,
    "vqa.score": None,
    "vqa.train": "kl.weight=abc",
    "vqa.evaluate": None,
    "vqa.lxmert.train": "optim.name=sgd",
    "vqa.lxmert.evaluate": None,
    "vqa.lxmert.flops": None,
    "tagging.train": "train.batch_size=abc",
    "tagging.evaluate": None,
    "scripts/reproduce_pos_table.py": None,
    "nlu.train": "optim.lr=abc",
    "nlu.pretrained": None,
    "nlu.evaluate": None,
    "scripts/reproduce_glue_table.py": None,
}
MODEL_MODULES += ("vqa.mcan", "vqa.lxmert.model", "vqa.lxmert.adapt")
MODEL_MODULES += ("captioning.models", "tagging.model", "tagging.data", "tagging.training")
MODEL_MODULES += ("nlu.model", "nlu.training", "common.attention.surgery")
#: The work modules the train CLIs import once their config has been checked.
MODEL_MODULES += ("graphattn.training", "mt.training", "captioning.training", "vqa.training", "vqa.lxmert.training")


def imported_modules(module: str, *args: str):
    """``module`` is a package's CLI (run with ``-m``) or a script's path (``scripts/x.py``, run as a file)."""
    target = [module] if module.endswith(".py") else ["-m", module]
    run = subprocess.run([sys.executable, "-X", "importtime", *target, *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    modules = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    return run, modules


def heavy(modules):
    return sorted(m for m in modules if m.split(".")[0] in HEAVY_PACKAGES or m.startswith(MODEL_MODULES))


@pytest.mark.parametrize("module", sorted(CLIS))
def test_help_and_a_bad_option_import_nothing_heavy(module):
    run, modules = imported_modules(module, "--help")
    assert run.returncode == 0 and "usage:" in run.stdout
    assert heavy(modules) == []
    run, modules = imported_modules(module, "--no-such-option")
    assert run.returncode == 2 and "error:" in run.stderr  # the unknown option or a missing argument
    assert heavy(modules) == []


@pytest.mark.parametrize("module", sorted(name for name, bad in CLIS.items() if bad))
def test_a_bad_config_value_is_refused_before_anything_heavy(module, tmp_path):
    run, modules = imported_modules(module, CLIS[module], "--out", str(tmp_path / "run"))
    assert run.returncode == 2 and "error:" in run.stderr and CLIS[module].split("=")[0] in run.stderr
    assert heavy(modules) == []
    assert not (tmp_path / "run").exists()


def test_the_feature_converter_answers_help_without_torch_or_h5py():
    """A data tool: its --help needs neither the tensors nor the HDF5 store."""
    run, modules = imported_modules("scripts/convert_features.py", "bottom-up-tsv", "--help")
    assert run.returncode == 0 and "--overwrite" in run.stdout
    assert sorted(m for m in modules if m.split(".")[0] in ("torch", "h5py")) == []


@pytest.mark.parametrize("args", [("--help",), ("no-such-corpus",)])
def test_mt_prepare_answers_without_torch(args):
    """A data tool: tokenising and BPE need no tensors (mt.data imports torch only to encode ids)."""
    run, modules = imported_modules("mt.prepare", *args)
    assert run.returncode == (0 if args == ("--help",) else 2)
    assert sorted(m for m in modules if m.split(".")[0] == "torch") == []


@pytest.mark.parametrize("args", [("--help",), ("--dataset", "Cora", "kl.weight=abc")])
def test_the_main_job_answers_without_torch(args):
    """graphattn.train (the README's main job) checks its command line and config before torch is loaded:
    its training code lives in graphattn.training."""
    run, modules = imported_modules("graphattn.train", *args)
    assert run.returncode == (0 if args == ("--help",) else 2)
    assert sorted(m for m in modules if m.split(".")[0] == "torch") == []
