"""Translation models and a name -> class registry used by the configs (``model.arch``)."""
from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from .lstm import LSTMSeq2Seq
from .transformer import TransformerSeq2Seq

ARCHITECTURES = {"lstm": LSTMSeq2Seq, "transformer": TransformerSeq2Seq}


def build_model(options: Mapping[str, Any], src_vocab: int, tgt_vocab: int, src_pad: int, tgt_pad: int) -> nn.Module:
    """``options`` is the config's ``model`` section: ``arch`` plus the class's keyword arguments."""
    options = dict(options)
    arch = options.pop("arch", None)
    if arch not in ARCHITECTURES:
        raise ValueError(f"model.arch must be one of {sorted(ARCHITECTURES)}, got {arch!r}")
    try:
        return ARCHITECTURES[arch](src_vocab, tgt_vocab, src_pad, tgt_pad, **options)
    except TypeError as err:
        raise ValueError(f"model options for arch={arch!r}: {err}") from None


__all__ = ["ARCHITECTURES", "LSTMSeq2Seq", "TransformerSeq2Seq", "build_model"]
