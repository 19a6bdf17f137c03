"""Typed configs of the attention block: the normalizer and each map operator.

Every operator is off unless its section is given. From YAML/OmegaConf, pass the mapping
to :meth:`AttendConfig.from_dict`::

    AttendConfig.from_dict({"normalizer": "bam-wc", "cross_layer": {"kind": "evolving", "alpha": 0.5, "beta": 0.1},
                            "span": {"max_span": 64, "ramp": 8, "loss_coef": 2e-6}})
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional

from ..maps.conv import CROSS_LAYER
from ..maps.convoluted import KINDS as CONVOLUTED_KINDS
from ..maps.span import DISTANCES


@dataclass
class CrossLayerConfig:
    """Predictive or evolving attention over the previous layer's logits (see :mod:`..maps.conv`).

    ``alpha``/``beta`` left as ``None`` take the operator's defaults (predictive: alpha 0.2;
    evolving: alpha 0.5, beta 0.1, the EA paper's notation). Predictive attention has no beta.
    """

    kind: str
    alpha: Optional[float] = None
    beta: Optional[float] = None
    layers: int = 1
    kernel_size: int = 3
    activation: str = "relu"

    def __post_init__(self):
        if self.kind not in CROSS_LAYER:
            raise ValueError(f"cross_layer.kind must be one of {sorted(CROSS_LAYER)}, got {self.kind!r}")
        if self.kind == "predictive" and self.beta is not None:
            raise ValueError("predictive attention has no beta (PA Eq. 4 mixes with alpha only); "
                             "use kind='evolving' for the alpha/beta form")

    def operator_options(self) -> dict:
        options = {"layers": self.layers, "kernel_size": self.kernel_size, "activation": self.activation}
        options.update({k: v for k, v in (("alpha", self.alpha), ("beta", self.beta)) if v is not None})
        return options


@dataclass
class PositionConfig:
    """Direct position interactions ``A^p`` (absolute) and/or ``A^r`` (relative); first layer only in the paper."""

    max_len: int
    absolute: bool = True
    relative: bool = False

    def __post_init__(self):
        if not (self.absolute or self.relative):
            raise ValueError("position: enable absolute and/or relative, or leave the section out")


@dataclass
class SpanConfig:
    """Adaptive span; ``distance`` is ``"position"`` (tokens, or given coordinates) or ``"rank"``."""

    max_span: float
    ramp: float = 32.0
    init: float = 0.0
    loss_coef: float = 0.0
    distance: str = "position"

    def __post_init__(self):
        if self.distance not in DISTANCES:
            raise ValueError(f"span.distance must be one of {DISTANCES}, got {self.distance!r}")


@dataclass
class ConvolutedConfig:
    """Convoluted attention after normalisation: ``"2d"`` (one 3x3 filter per head) or ``"1d"`` (``max_len``
    filters along the queries); ``activation`` ``None`` or ``"relu"``, ``init`` ``"identity"`` or ``"glorot"``
    (:class:`~common.attention.maps.ConvolutedAttention`)."""

    kind: str = "2d"
    max_len: Optional[int] = None
    activation: Optional[str] = None
    init: str = "identity"

    def __post_init__(self):
        if self.kind not in CONVOLUTED_KINDS:
            raise ValueError(f"convoluted.kind must be one of {CONVOLUTED_KINDS}, got {self.kind!r}")


_SECTIONS = {"cross_layer": CrossLayerConfig, "position": PositionConfig, "span": SpanConfig,
             "convoluted": ConvolutedConfig}


@dataclass
class AttendConfig:
    """Everything between the projected ``q, k, v`` and the attention output.

    ``temperature`` (learnable scalars on ``W_q, W_k, W_v``) is applied by
    :class:`~common.attention.blocks.MultiHeadAttention`, which owns the projections.
    """

    normalizer: str = "softmax"
    normalizer_options: dict = field(default_factory=dict)
    dropout: float = 0.0
    scale: Optional[float] = None
    temperature: bool = False
    cross_layer: Optional[CrossLayerConfig] = None
    position: Optional[PositionConfig] = None
    span: Optional[SpanConfig] = None
    convoluted: Optional[ConvolutedConfig] = None

    def __post_init__(self):
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        for name, section in _SECTIONS.items():
            value = getattr(self, name)
            if isinstance(value, Mapping):
                try:
                    setattr(self, name, section(**value))
                except TypeError as err:
                    valid = [f.name for f in fields(section)]
                    raise ValueError(f"attention option {name!r}: {err}; valid keys: {valid}") from None

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> "AttendConfig":
        """Build from a plain mapping (YAML, OmegaConf); unknown keys raise with the valid ones."""
        known = {f.name for f in fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown attention option(s) {sorted(unknown)}; valid: {sorted(known)}")
        values = dict(options)
        if "normalizer_options" in values:
            values["normalizer_options"] = dict(values["normalizer_options"])
        return cls(**values)

    @property
    def plain(self) -> bool:
        """True when no operator is on and the normalizer is softmax (the SDPA fast path)."""
        return (self.normalizer == "softmax" and not self.normalizer_options and not self.temperature
                and all(getattr(self, name) is None for name in _SECTIONS))


def as_config(config: "AttendConfig | Mapping[str, Any] | None") -> AttendConfig:
    if config is None:
        return AttendConfig()
    if isinstance(config, AttendConfig):
        return config
    if isinstance(config, Mapping):
        return AttendConfig.from_dict(config)
    raise TypeError(f"attention config must be an AttendConfig or a mapping, got {type(config).__name__}")
