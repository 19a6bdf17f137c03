"""The editable install that scripts/bootstrap.sh makes: setuptools builds it without its notice box."""
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "graphattn", "vqa", "captioning", "mt", "tagging", "nlu")
#: Builds the editable wheel in the current directory and prints the warnings setuptools raised, one a line.
BUILD = textwrap.dedent("""
    import warnings
    from setuptools import build_meta

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_meta.build_editable("dist")
    print("\\n".join(str(w.message).splitlines()[0] for w in caught))
""")


def test_an_editable_build_raises_no_editable_installation_notice(tmp_path):
    pytest.importorskip("setuptools")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tmp_path / name)
    for package in PACKAGES:  # the layout, not the code, decides how the editable install finds the packages
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    result = subprocess.run([sys.executable, "-c", BUILD], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "dist").glob("attention_suite-*.whl"))
    assert "Editable installation" not in result.stdout, result.stdout
