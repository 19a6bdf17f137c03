"""The architecture's import rules: common imports no domain; domains do not import each other."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOMAINS = ("graphattn", "vqa", "captioning", "mt")


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", ("common",) + DOMAINS)
def test_import_rules(package):
    forbidden = set(DOMAINS) - {package}
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_packages(path) & forbidden)
        for path in (ROOT / package).rglob("*.py")
        if _imported_packages(path) & forbidden
    }
    assert not offenders, f"{package} must not import {sorted(forbidden)}: {offenders}"


def test_the_rule_detects_an_offender(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from graphattn.conv import GATConv\nimport mt.data\n")
    assert _imported_packages(bad) >= {"graphattn", "mt"}
