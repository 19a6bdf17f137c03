"""A small name -> factory registry for attention normalizers.

Variants are chosen by one string in configs and command lines (``softmax``,
``bam-wc``, ``entmax`` ...). Each factory accepts the host-layer context options
``num_heads`` and ``key_dim`` plus its own options; unknown options raise.

The built-in variants are registered by name and import their module on first :func:`build`,
so that :func:`available` (a CLI checking ``attention.name``) imports no torch.
"""
from __future__ import annotations

import inspect
from functools import partial
from importlib import import_module
from typing import Callable, Dict, List, Optional, Tuple, Union

#: name -> a factory, or ``(module, attribute, keyword arguments)`` of a built-in one, imported on first use
_REGISTRY: Dict[str, Union[Callable, Tuple[str, str, dict]]] = {
    "softmax": ("common.attention.softmax", "Softmax", {}),
    "bam-wf": ("common.attention.bam", "BAM", {"posterior": "weibull", "prior": "fixed"}),
    "bam-wc": ("common.attention.bam", "BAM", {"posterior": "weibull", "prior": "contextual"}),
    "bam-lf": ("common.attention.bam", "BAM", {"posterior": "lognormal", "prior": "fixed"}),
    "bam-lc": ("common.attention.bam", "BAM", {"posterior": "lognormal", "prior": "contextual"}),
    "entmax": ("common.attention.entmax", "Entmax", {}),
    "entmax15": ("common.attention.entmax", "Entmax15", {}),
    "sparsemax": ("common.attention.entmax", "Sparsemax", {}),
}


def register(name: str, factory: Callable | None = None):
    """Register ``factory`` (returning an ``nn.Module``) under ``name``; usable as a decorator."""

    def _add(f: Callable):
        if name in _REGISTRY:
            raise ValueError(f"attention variant {name!r} is already registered")
        _REGISTRY[name] = f
        return f

    return _add(factory) if factory is not None else _add


def available() -> list[str]:
    """Names of all registered normalizers, sorted."""
    return sorted(_REGISTRY)


def _factory(name: str) -> Callable:
    entry = _REGISTRY[name]
    if isinstance(entry, tuple):
        module, attribute, options = entry
        entry = _REGISTRY[name] = partial(getattr(import_module(module), attribute), **options)
    return entry


def is_stochastic(name: str) -> bool:
    """Whether the normalizer registered as ``name`` samples its weights in training (BAM)."""
    factory = _factory(name)
    return bool(getattr(getattr(factory, "func", factory), "stochastic", False))


#: Options every factory is given by the host layer (not set by users).
CONTEXT_OPTIONS = ("num_heads", "key_dim")


def options_of(name: str) -> Optional[List[str]]:
    """The options the normalizer registered as ``name`` takes (``None`` when its factory takes any keyword)."""
    parameters = inspect.signature(_factory(name)).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return sorted(p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL
                  and p.name not in CONTEXT_OPTIONS)


def build(name: str, **options):
    """Build the normalizer registered as ``name`` (e.g. ``build("bam-wc", key_dim=64)``); an option it does not
    take is a ``ValueError`` naming the options it does."""
    try:
        factory = _factory(name)
    except KeyError:
        raise ValueError(
            f"unknown attention variant {name!r}; choose one of: {', '.join(available())}"
        ) from None
    known = options_of(name)
    unknown = sorted(set(options) - set(known) - set(CONTEXT_OPTIONS)) if known is not None else []
    if unknown:
        raise ValueError(f"attention variant {name!r} has no option {', '.join(unknown)}; "
                         f"its options are {', '.join(known) or 'none'} (attention options of the config)")
    try:
        return factory(**options)
    except TypeError as err:
        raise TypeError(f"attention variant {name!r}: {err}") from err
