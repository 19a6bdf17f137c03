"""Warnings in the test output: the torch.jit.script deprecation, filtered in pyproject.toml because only
third-party imports (torch_geometric, torch_sparse) raise it."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "graphattn", "mt", "vqa", "captioning", "tagging", "nlu")


def test_the_library_never_calls_torch_jit_script():
    calls = re.compile(r"jit\.script\b|from torch\.jit import .*\bscript\b")
    offenders = [str(path.relative_to(ROOT)) for package in PACKAGES for path in (ROOT / package).rglob("*.py")
                 if calls.search(path.read_text(encoding="utf-8"))]
    assert not offenders, f"call torch.compile or plain Python instead of torch.jit.script in {offenders}"


def test_importing_torch_geometric_under_pytest_prints_no_torch_jit_script_warning(tmp_path):
    test = tmp_path / "test_import.py"
    test.write_text("def test_import():\n    import torch_geometric.nn  # noqa: F401\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                             str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), str(test)],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout and "torch.jit.script" not in result.stdout + result.stderr
