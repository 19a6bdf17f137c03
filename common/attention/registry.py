"""A small name -> factory registry for attention normalizers.

Variants are chosen by one string in configs and command lines (``softmax``,
``bam-wc``, ``entmax`` ...). Each factory accepts the host-layer context options
``num_heads`` and ``key_dim`` plus its own options; unknown options raise.
"""
from __future__ import annotations

from typing import Callable, Dict

from torch import nn

_REGISTRY: Dict[str, Callable[..., nn.Module]] = {}


def register(name: str, factory: Callable[..., nn.Module] | None = None):
    """Register ``factory`` under ``name``; usable as a decorator."""

    def _add(f: Callable[..., nn.Module]):
        if name in _REGISTRY:
            raise ValueError(f"attention variant {name!r} is already registered")
        _REGISTRY[name] = f
        return f

    return _add(factory) if factory is not None else _add


def available() -> list[str]:
    """Names of all registered normalizers, sorted."""
    return sorted(_REGISTRY)


def build(name: str, **options) -> nn.Module:
    """Build the normalizer registered as ``name`` (e.g. ``build("bam-wc", key_dim=64)``)."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown attention variant {name!r}; choose one of: {', '.join(available())}"
        ) from None
    try:
        return factory(**options)
    except TypeError as err:
        raise TypeError(f"attention variant {name!r}: {err}") from err
