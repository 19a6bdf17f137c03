"""Model surgery: the suite's attention core inside pretrained Hugging Face encoders.

:func:`swap_attention` gives each supported attention module of a ``transformers`` model an
:class:`~common.attention.blocks.Attend` (any registry normalizer: softmax, BAM, entmax, ...,
and the map operators) and routes the module's ``softmax(q k^T * scale + mask) v`` through it.
Everything else stays: the projections, their state-dict names and the pretrained weights. The
only new parameters are the normalizer's own (BAM's contextual prior network, entmax's alpha,
a span's ``z``), under ``<module>.attend``, initialised as their papers say.

Two kinds of module are supported, by one route, :func:`attend_hf`:

* modules that call ``transformers``' attention interface (BERT, RoBERTa, ALBERT, ELECTRA,
  XLM-R, CamemBERT, ... self- and cross-attention): the model's attention implementation is set
  to ``"attention_suite"``, registered with ``AttentionInterface`` (and ``AttentionMaskInterface``,
  which gives a boolean mask, True = attend, as for SDPA); modules without an ``attend`` fall
  back to SDPA;
* LXMERT's ``LxmertAttention``, which computes attention inline: its class is swapped for a
  subclass whose forward calls :func:`attend_hf` (same signature and outputs).

With ``softmax`` and no operator the call is ``F.scaled_dot_product_attention``, as in the
unswapped model, so a swapped model equals the original (the tests check 1e-5 in fp32, in train
and eval mode). KL collection (:func:`~common.attention.aux_losses`) and MC evaluation
(:func:`~common.attention.mc_sampling`) work as in the suite's own blocks.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator, List, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .blocks import Attend, AttendConfig
from .blocks.config import as_config

#: the name under which the suite's attention is registered with ``transformers``
IMPLEMENTATION = "attention_suite"
#: attention modules that call ``transformers``' attention interface (class names)
INTERFACE_MODULES = frozenset({
    "BertSelfAttention", "BertCrossAttention", "RobertaSelfAttention", "RobertaCrossAttention",
    "AlbertAttention", "ElectraSelfAttention", "ElectraCrossAttention", "XLMRobertaSelfAttention",
    "XLMRobertaCrossAttention", "CamembertSelfAttention", "CamembertCrossAttention",
})
#: attention modules that compute attention inline; their class is swapped for a subclass
INLINE_MODULES = frozenset({"LxmertAttention"})

ConfigLike = Union[AttendConfig, Mapping, None]
ConfigFor = Union[ConfigLike, Callable[[str, nn.Module], ConfigLike]]


def additive_to_boolean(attention_mask: Optional[Tensor]) -> Optional[Tensor]:
    """An additive mask (0 = attend, the dtype's minimum = masked) as a boolean one (True = attend)."""
    if attention_mask is None or attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2


def attend_hf(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
              need_maps: bool = False, causal: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """``module.attend`` on projected heads ``[B, H, L, d]``: the output ``[B, Q, H, d]`` (the
    layout of ``transformers``' attention functions) and the weights (``None`` on the fast path)."""
    out, maps = module.attend(query, key, value, mask=additive_to_boolean(attention_mask), causal=causal,
                              need_maps=need_maps)
    return out.transpose(1, 2).contiguous(), maps.weights


def _interface_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                         attention_mask: Optional[Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                         **kwargs):
    """The function registered as ``"attention_suite"`` with ``transformers``' ``AttentionInterface``."""
    if not isinstance(getattr(module, "attend", None), Attend):  # a module left as it was: SDPA, as before
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    is_causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", False) if is_causal is None else is_causal)
    causal = causal and attention_mask is None and query.shape[2] > 1  # a decoder's mask already holds the triangle
    return attend_hf(module, query, key, value, attention_mask, bool(kwargs.get("output_attentions")), causal)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _interface_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


_INLINE_CLASSES: dict = {}


def _inline_class(cls: type) -> type:
    """The subclass of ``LxmertAttention`` whose forward goes through :func:`attend_hf`."""
    if cls in _INLINE_CLASSES.values():  # swapped before
        return cls
    if cls not in _INLINE_CLASSES:
        def forward(self, hidden_states, context, attention_mask=None, output_attentions=False):
            heads = lambda x: x.view(*x.shape[:-1], -1, self.attention_head_size).transpose(1, 2)  # noqa: E731
            q, k, v = heads(self.query(hidden_states)), heads(self.key(context)), heads(self.value(context))
            out, weights = attend_hf(self, q, k, v, attention_mask, need_maps=output_attentions)
            out = out.flatten(-2)
            return (out, weights) if output_attentions else (out,)

        _INLINE_CLASSES[cls] = type(f"Suite{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})
    return _INLINE_CLASSES[cls]


def _attention_dropout(module: nn.Module) -> float:
    for name in ("dropout", "attention_dropout"):
        layer = getattr(module, name, None)
        if isinstance(layer, nn.Dropout):
            return layer.p
    return 0.0


def _kind(module: nn.Module) -> Optional[str]:
    for cls in type(module).__mro__:
        if cls.__name__ in INTERFACE_MODULES:
            return "interface"
        if cls.__name__ in INLINE_MODULES:
            return "inline"
    return None


def swap_attention(model: nn.Module, attend: ConfigFor = "softmax", *, dropout: Optional[float] = None) -> List[str]:
    """Route every supported attention module of ``model`` through an :class:`Attend`, in place.

    Args:
        model: a ``transformers`` model, or any module holding one.
        attend: a normalizer name, an :class:`AttendConfig` (or a mapping of its fields), or a
            function ``(name, module) -> config`` that configures each module (``None`` leaves
            that module as it is).
        dropout: attention dropout; ``None`` keeps each module's own (the pretrained config's).

    Returns the names of the swapped modules. Calling it again on a swapped model re-configures
    it (new ``Attend`` modules, the projections untouched).
    """
    configure = attend if callable(attend) else (lambda name, module: attend)
    swapped, interface = [], False
    for name, module in model.named_modules():
        kind = _kind(module)
        if kind is None:
            continue
        config = configure(name, module)
        if config is None:
            continue
        config = as_config({"normalizer": config} if isinstance(config, str) else config)
        scale = getattr(module, "scaling", None)
        if config.scale is not None or scale is None or abs(scale - module.attention_head_size ** -0.5) < 1e-12:
            scale = config.scale
        config = replace(config, dropout=_attention_dropout(module) if dropout is None else dropout, scale=scale)
        weight = module.query.weight
        module.attend = Attend(module.num_attention_heads, module.attention_head_size, config).to(
            device=weight.device, dtype=weight.dtype).train(module.training)
        if kind == "inline":
            module.__class__ = _inline_class(type(module))
        interface |= kind == "interface"
        swapped.append(name)
    if not swapped:
        raise ValueError(f"{type(model).__name__} holds no supported attention module; supported: "
                         f"{', '.join(sorted(INTERFACE_MODULES | INLINE_MODULES))}")
    if interface:
        _register()
        for module in model.modules():
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "_attn_implementation"):
                config._attn_implementation = IMPLEMENTATION
    return swapped


def swapped_attention(model: nn.Module) -> Iterator[Tuple[str, nn.Module]]:
    """``(name, module)`` of every swapped attention module of ``model``, in module order."""
    for name, module in model.named_modules():
        if isinstance(getattr(module, "attend", None), Attend) and _kind(module) is not None:
            yield name, module
