"""A script of ``scripts/`` or ``benchmarks/`` loaded as a module (those folders are not packages), and the committed
results a reproduction script wrote into the docs."""
import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """The module of the script at ``relative`` (to the repository root), e.g. ``scripts/reproduce_gat_table.py``."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed_table(table_json: str, doc: str, marker: str):
    """``docs/tables/<table_json>`` (a grid's ``table.json``, committed) and the lines of ``docs/<doc>`` between
    ``<!-- marker -->`` and ``<!-- /marker -->``, where the table built from it stands."""
    saved = json.loads((ROOT / "docs" / "tables" / table_json).read_text(encoding="utf-8"))
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    start = text.index(f"<!-- {marker} -->\n") + len(f"<!-- {marker} -->\n")
    return saved, text[start:text.index(f"<!-- /{marker} -->")]
