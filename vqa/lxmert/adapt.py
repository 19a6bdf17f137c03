"""Adaptive fine-tuning of LXMERT (Bhargava, *Adaptive Transformers for Learning Multimodal
Representations*): route every attention module of a ``transformers.LxmertModel`` through
``common.attention`` (:func:`common.attention.surgery.swap_attention`), and wrap its three layer stacks in LayerDrop.

LXMERT has five kinds of attention, grouped here in three *sites*:

* ``language``: self-attention over word pieces (``encoder.layer.*``, ``x_layers.*.lang_self_att``);
* ``vision``: self-attention over object regions (``encoder.r_layers.*``, ``x_layers.*.visn_self_att``);
* ``cross``: ``x_layers.*.visual_attention``, one module that LXMERT uses in both directions
  (words -> regions and regions -> words), so its span and alpha serve both.

Adaptive span, ``m_z(x) = clamp((R + zS - x) / R, 0, 1)`` (paper Eq. 1, with the span ``zS``),
needs a distance ``x`` between a query and a key:

* language: the token distance ``|i - j|`` (bidirectional form of the paper's ``t - r``);
* vision and cross: regions have no order and a word and a region share no frame, so ``x`` is
  the key's *rank* by its attention logit for that query (0 = the best key). A head's span is
  then a learned soft top-``zS``: how many regions (or words) it looks at.

LayerDrop: ``layerdrop.<stack>: p`` drops ``p`` layers of that stack on average in training
(each layer with probability ``p / N``), never in eval mode. :func:`pruned_layers` removes
exactly ``p`` layers per stack at inference with the "every other" rule
(:func:`common.attention.every_other_layers` at rate ``p / N``): the paper's 9-5-5 with ``p = 1``
keeps 8-4-4. LXMERT's encoder needs at least one layer of a stack to produce its output, so a
training draw that would drop a whole stack is redrawn (:class:`StackLayerDrop`).
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

from torch import nn
from transformers.models.lxmert.modeling_lxmert import LxmertEncoder

from common.attention import AttendConfig, LayerDropList, every_other_layers, prune_layers
from common.attention.blocks import SpanConfig
from common.attention.surgery import swap_attention, swapped_attention

SITES = ("language", "vision", "cross")
SPAN_DISTANCE = {"language": "position", "vision": "rank", "cross": "rank"}
#: encoder attribute holding each stack, and the stack's name in configs
STACKS = {"language": "layer", "vision": "r_layers", "cross": "x_layers"}
#: every attention module of the encoder: name pattern, site, and plot group
_MODULES = (
    (re.compile(r"(?:^|\.)layer\.(\d+)\.attention\.self$"), "language", "language"),
    (re.compile(r"(?:^|\.)r_layers\.(\d+)\.attention\.self$"), "vision", "vision"),
    (re.compile(r"(?:^|\.)x_layers\.(\d+)\.visual_attention\.att$"), "cross", "cross"),
    (re.compile(r"(?:^|\.)x_layers\.(\d+)\.lang_self_att\.self$"), "language", "cross_language"),
    (re.compile(r"(?:^|\.)x_layers\.(\d+)\.visn_self_att\.self$"), "vision", "cross_vision"),
)
#: plot panel titles of each group (the paper's Figures 1 and 3)
GROUP_TITLES = {
    "language": "Language encoder",
    "vision": "Vision encoder",
    "cross": "Cross-modality: cross-attention (both directions)",
    "cross_language": "Cross-modality: language self-attention",
    "cross_vision": "Cross-modality: vision self-attention",
}


@dataclass
class SiteSpan:
    """Span options of one site: ``max_span`` = ``S`` and ``ramp`` = ``R`` (tokens or ranks)."""

    max_span: float
    ramp: float = 4.0


@dataclass
class SpanOptions:
    """Adaptive span for every site; ``init`` is the starting ``z`` (1 = the full span, which
    leaves a pretrained model's attention unchanged when ``S`` covers every key)."""

    language: SiteSpan = field(default_factory=lambda: SiteSpan(20))
    vision: SiteSpan = field(default_factory=lambda: SiteSpan(36))
    cross: SiteSpan = field(default_factory=lambda: SiteSpan(36))
    init: float = 1.0
    loss_coef: float = 2e-6

    def __post_init__(self):
        for site in SITES:
            value = getattr(self, site)
            if isinstance(value, Mapping):
                setattr(self, site, SiteSpan(**value))

    def for_site(self, site: str) -> SpanConfig:
        s = getattr(self, site)
        return SpanConfig(max_span=s.max_span, ramp=s.ramp, init=self.init, loss_coef=self.loss_coef,
                          distance=SPAN_DISTANCE[site])


@dataclass
class LayerDropOptions:
    """Layers dropped per stack (the paper's ``p``): in expectation while training, exactly when pruned."""

    language: int = 0
    vision: int = 0
    cross: int = 0

    def __post_init__(self):
        for stack in STACKS:
            if getattr(self, stack) < 0:
                raise ValueError(f"layerdrop.{stack} must be >= 0 layers, got {getattr(self, stack)}")

    def probability(self, stack: str, num_layers: int) -> float:
        """Per-layer drop probability ``p / N`` of ``stack``."""
        return getattr(self, stack) / num_layers

    def kept(self, stack: str, num_layers: int) -> List[int]:
        """Indices of the layers the "every other" rule keeps when ``p`` of ``num_layers`` are pruned."""
        drop = getattr(self, stack)
        if drop == 0:
            return list(range(num_layers))
        if 2 * drop > num_layers:
            raise ValueError(f"layerdrop.{stack}={drop}: the every-other rule drops at most half of the "
                             f"{num_layers} layers")
        keep = every_other_layers(num_layers, rate=drop / num_layers)
        if num_layers - len(keep) != drop:
            raise ValueError(f"layerdrop.{stack}={drop} of {num_layers} layers is not reachable with the "
                             f"every-other rule (it drops {num_layers - len(keep)}); choose another count")
        return keep

    @property
    def active(self) -> bool:
        return any(getattr(self, stack) for stack in STACKS)


@dataclass
class Adaptation:
    """What to change in LXMERT: the normalizer (any ``common.attention`` name), span, LayerDrop."""

    normalizer: str = "softmax"
    normalizer_options: dict = field(default_factory=dict)
    span: Optional[SpanOptions] = None
    layerdrop: LayerDropOptions = field(default_factory=LayerDropOptions)

    def __post_init__(self):
        if isinstance(self.span, Mapping):
            self.span = SpanOptions(**self.span)
        if isinstance(self.layerdrop, Mapping):
            self.layerdrop = LayerDropOptions(**self.layerdrop)
        self.normalizer_options = dict(self.normalizer_options or {})

    @classmethod
    def from_dict(cls, options: Mapping) -> "Adaptation":
        try:
            return cls(**dict(options))
        except TypeError as err:
            raise ValueError(f"model.adaptation: {err}; valid keys: normalizer, normalizer_options, span "
                             f"(language/vision/cross: {{max_span, ramp}}, init, loss_coef), layerdrop "
                             f"(language, vision, cross)") from None

    def attend_config(self, site: str, dropout: float) -> AttendConfig:
        span = self.span.for_site(site) if self.span is not None else None
        return AttendConfig(normalizer=self.normalizer, normalizer_options=dict(self.normalizer_options),
                            dropout=dropout, span=span)

    def to_dict(self) -> dict:
        return asdict(self)


class StackLayerDrop(LayerDropList):
    """LayerDrop that never drops a whole stack: a draw that keeps no layer is redrawn.

    With ``N`` layers this conditions on the event "some layer runs", of probability
    ``1 - (p/N)^N`` (``1 - 3e-4`` for one of five layers).
    """

    def __iter__(self):
        while True:
            layers = list(super().__iter__())
            if layers or len(self) == 0:
                return iter(layers)


def _match(name: str):
    for pattern, site, group in _MODULES:
        match = pattern.search(name)
        if match:
            return site, group, match.group(1)
    return None


def attention_site(name: str) -> Optional[str]:
    """The site (``language``, ``vision``, ``cross``) of the attention module at ``name``, if any."""
    found = _match(name)
    return found[0] if found else None


def attention_label(name: str) -> str:
    """Short label ``<group>.<layer>`` of an encoder attention module, e.g. ``cross_vision.2``."""
    found = _match(name)
    if found is None:
        raise ValueError(f"{name} is not an LXMERT encoder attention module")
    return f"{found[1]}.{found[2]}"


def _encoder(model: nn.Module) -> LxmertEncoder:
    for module in model.modules():
        if isinstance(module, LxmertEncoder):
            return module
    raise TypeError(f"{type(model).__name__} holds no LxmertEncoder; pass an LxmertModel or a model containing one")


def adapt_lxmert(model: nn.Module, adaptation: Adaptation) -> nn.Module:
    """Route the attention modules of ``model`` (an ``LxmertModel`` or a model holding one) through the
    suite's attention core (:func:`common.attention.surgery.swap_attention`), in place.

    Pretrained weights stay where they are, under their state-dict names; the new parameters (span
    ``z``, entmax ``alpha``, BAM's prior network) live under ``<attention>.attend``. Returns ``model``.
    """
    encoder = _encoder(model)
    if any(True for _ in swapped_attention(encoder)):
        raise ValueError("this LXMERT was adapted already: build a fresh model to adapt it differently")

    def configure(name: str, module: nn.Module) -> AttendConfig:
        site = attention_site(name)
        if site is None:
            raise ValueError(f"LxmertAttention at encoder.{name} matches no known site; this LXMERT layout is "
                             f"not supported")
        return adaptation.attend_config(site, encoder.config.attention_probs_dropout_prob)

    swap_attention(encoder, configure)
    for stack, attr in STACKS.items():
        layers = list(getattr(encoder, attr))
        setattr(encoder, attr, StackLayerDrop(layers, p=adaptation.layerdrop.probability(stack, len(layers))))
    return model


def adaptive_attention(model: nn.Module) -> Iterator[Tuple[str, str, nn.Module]]:
    """``(name, site, module)`` of every adapted attention module, in forward order of the stacks."""
    for name, module in swapped_attention(_encoder(model)):
        yield name, attention_site(name), module


@contextmanager
def pruned_layers(model: nn.Module, layerdrop: LayerDropOptions) -> Iterator[Dict[str, List[int]]]:
    """Run ``model`` with ``layerdrop.<stack>`` layers of each stack removed (every-other rule).

    Yields the kept indices per stack; the full stacks are restored on exit.
    """
    encoder = _encoder(model)
    saved = {attr: getattr(encoder, attr) for attr in STACKS.values()}
    kept = {stack: layerdrop.kept(stack, len(saved[attr])) for stack, attr in STACKS.items()}
    try:
        for stack, attr in STACKS.items():
            pruned = prune_layers(saved[attr], kept[stack])
            pruned.training = saved[attr].training  # a new list starts in training mode: keep eval's no-drop
            setattr(encoder, attr, pruned)
        yield kept
    finally:
        for attr, layers in saved.items():
            setattr(encoder, attr, layers)
