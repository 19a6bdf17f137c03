"""A script of ``scripts/`` or ``benchmarks/`` loaded as a module (those folders are not packages)."""
import importlib.util
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
