"""Packages whose public names import their submodule on first use (PEP 562), so that a CLI can
answer ``--help`` or reject a bad option before torch, PyG or transformers are loaded."""
from __future__ import annotations

import sys
from importlib import import_module
from typing import Callable, Dict, List, Optional, Tuple


def lazy_exports(package: str, exports: Dict[str, Optional[str]]
                 ) -> Tuple[Callable[[str], object], Callable[[], List[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps each public name to the submodule
    (relative to ``package``) that defines it, or to None for a submodule of that name; the first
    access imports it and caches the value."""
    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = import_module(f".{exports[name] or name}", package)
        value = module if exports[name] is None else getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> List[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
