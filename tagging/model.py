"""The self-attention tagger of Dufter, Schmitt & Schütze (2020, Sec. 2.1, Table 1a), and its variants.

As in the authors' code (``pdufter/convatt``, ``models/seqlabel.py``):

* input ``x_i = [w_i (+ p_i) ; (p_i) ; c_i]``: a word embedding, a position embedding added
  (PE[add], same width) or concatenated (PE[con]) or none (the +P / +R variants), and a
  character-level word vector ``c_i`` (character embeddings, 3 x (Conv1d width 5 + ReLU),
  max-pooled over the word);
* ``layers`` x ``h <- Dropout(h); h <- h + MultiHead(h)``: self-attention heads without biases and
  without an output projection (the heads' outputs are concatenated), around each a
  residual connection;
* ``softmax(W [x ; h])``: a residual connection from the input to the output layer;
* ``init="keras"`` (:func:`keras_initialise`): the authors' Keras 2.2.4 initialisation.

The attention of every layer is :class:`common.attention.blocks.MultiHeadAttention`: any
normalizer of the registry, learnable temperature, convoluted attention, and (first layer only)
the direct position interactions ``A^p``, ``A^r``.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.attention.blocks import MultiHeadAttention

#: The paper's variants (Table 2): how positions enter and which attention options each layer gets.
#: ``first_layer`` options go to layer 1 only (the paper's +P / +R), ``every_layer`` options to all.
VARIANTS: Dict[str, Dict[str, Any]] = {
    "pe-add": {"label": "SAN+PE[add]", "positions": "add"},
    "pe-con": {"label": "SAN+PE[con]", "positions": "concat"},
    "p": {"label": "SAN+P", "first_layer": {"position": {"absolute": True}}},
    "r": {"label": "SAN+R", "first_layer": {"position": {"absolute": False, "relative": True}}},
    "pr": {"label": "SAN+P+R", "first_layer": {"position": {"absolute": True, "relative": True}}},
    "temp": {"label": "SAN+PE[add]+Temp", "positions": "add", "every_layer": {"temperature": True}},
    "conv1d": {"label": "SAN+PE[add]+Conv1d", "positions": "add",
               "every_layer": {"convoluted": {"kind": "1d", "activation": "relu", "init": "glorot"}}},
    "conv2d": {"label": "SAN+PE[add]+Conv2d", "positions": "add",
               "every_layer": {"convoluted": {"kind": "2d", "activation": "relu", "init": "glorot"}}},
}


#: ``keras``: the authors' initialisation (:func:`keras_initialise`); ``torch``: PyTorch's module defaults
#: (``N(0, 1)`` embeddings, Kaiming-uniform layers) and zero position interactions.
INITIALISATIONS = ("keras", "torch")


def variant_label(variant: str, normalizer: str = "softmax") -> str:
    """``"SAN+PE[add]"``, or ``"SAN+PE[add] (bam-wc)"`` with another normalizer."""
    label = VARIANTS[variant]["label"]
    return label if normalizer == "softmax" else f"{label} ({normalizer})"


#: Keras 2.2.4's truncated normal (cut at 2 standard deviations) has this standard deviation per unit scale;
#: ``VarianceScaling`` divides by it so that the truncated draws have the intended variance.
_TRUNCATED_STD = 0.87962566103423978
#: Keras' ``Embedding`` default: ``RandomUniform(-0.05, 0.05)``.
EMBEDDING_RANGE = 0.05


def glorot_normal_keras_(tensor: Tensor, fan_in: float, fan_out: float) -> Tensor:
    """Keras' ``glorot_normal``: a normal truncated at 2 sd with variance ``2 / (fan_in + fan_out)``."""
    std = math.sqrt(2.0 / (fan_in + fan_out)) / _TRUNCATED_STD
    return nn.init.trunc_normal_(tensor, 0.0, std, -2 * std, 2 * std)


def glorot_uniform_keras_(tensor: Tensor, fan_in: float, fan_out: float) -> Tensor:
    """Keras' ``glorot_uniform`` (the default of ``Dense`` and ``Conv1D``): ``U(+-sqrt(6 / (fan_in + fan_out)))``."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return nn.init.uniform_(tensor, -limit, limit)


def keras_initialise(tagger: "Tagger") -> None:
    """The authors' initialisation (Keras 2.2.4 defaults and ``models/selfattention.py``), in place:

    * embeddings (words, positions, characters): ``U(-0.05, 0.05)``, the padding rows kept at zero;
    * the character convolutions and the output layer: ``glorot_uniform`` (a convolution's fans count its
      width), biases zero;
    * each head's ``W_Q``, ``W_K``, ``W_V`` (``[width, head_dim]`` in Keras): ``glorot_normal``;
    * ``A^p`` (``[t, t]`` per head): ``glorot_normal``; ``a^r`` (``2t`` per head): ``glorot_normal`` with
      Keras' fans of a vector, ``sqrt(2t)`` each;
    * the learnable temperatures stay at 1 and the convoluted attention's kernels at their own Glorot
      initialisation (the authors' ``Conv1D`` / ``Conv2D`` defaults).
    """
    with torch.no_grad():
        for embed in (tagger.word_embed, tagger.position_embed, tagger.chars.embed):
            if embed is not None:
                nn.init.uniform_(embed.weight, -EMBEDDING_RANGE, EMBEDDING_RANGE)
                if embed.padding_idx is not None:
                    embed.weight[embed.padding_idx].zero_()
        for conv in tagger.chars.convs:
            width = conv.kernel_size[0]
            glorot_uniform_keras_(conv.weight, conv.in_channels * width, conv.out_channels * width)
            nn.init.zeros_(conv.bias)
        glorot_uniform_keras_(tagger.output.weight, tagger.output.in_features, tagger.output.out_features)
        nn.init.zeros_(tagger.output.bias)
        for layer in tagger.layers:
            heads, head_dim = layer.num_heads, layer.head_dim
            for proj in (layer.q_proj, layer.k_proj, layer.v_proj):
                for block in proj.weight.view(heads, head_dim, proj.in_features):  # one head's [head_dim, width]
                    glorot_normal_keras_(block, proj.in_features, head_dim)
            attend = layer.attend
            if attend.absolute is not None:
                t = attend.absolute.max_len
                glorot_normal_keras_(attend.absolute.table, t, t)
            if attend.relative is not None:
                fan = math.sqrt(2 * attend.relative.max_len)
                glorot_normal_keras_(attend.relative.offsets, fan, fan)


class CharCNN(nn.Module):
    """``c = maxpool_t relu(conv(... relu(conv(E chars))))``: 3 convolutions of width 5 (Yu et al., 2017)."""

    def __init__(self, num_chars: int, dim: int = 64, layers: int = 3, kernel_size: int = 5):
        super().__init__()
        self.embed = nn.Embedding(num_chars, dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(dim, dim, kernel_size, padding=kernel_size // 2) for _ in range(layers))

    def forward(self, chars: Tensor) -> Tensor:
        """``chars [N, C]`` (the characters of N words, 0 = padding) -> ``[N, dim]``."""
        present = (chars != 0)[:, None, :]
        h = self.embed(chars).transpose(1, 2)  # [N, dim, C]; the padding embedding is zero
        for conv in self.convs:
            # zero beyond the word after every layer: each word is computed as if alone (zero-padded borders),
            # whatever the longest word of its batch; after ReLU values are >= 0, so padding never wins the max
            h = F.relu(conv(h)).masked_fill(~present, 0.0)
        return h.amax(-1)


class Tagger(nn.Module):
    """The paper's tagger; ``variant`` is a key of :data:`VARIANTS`, ``attention`` the options of
    :class:`~common.attention.blocks.AttendConfig` shared by all layers (e.g. ``{"normalizer": "bam-wc"}``)."""

    def __init__(self, num_words: int, num_chars: int, num_tags: int, variant: str = "pe-add", *,
                 word_dim: int = 128, char_dim: int = 64, char_layers: int = 3, char_kernel: int = 5,
                 concat_position_dim: int = 64, layers: int = 4, heads: int = 4, dropout: float = 0.1,
                 max_len: int = 60, attention: Optional[Mapping[str, Any]] = None, init: str = "keras"):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        spec = VARIANTS[variant]
        self.variant, self.max_len, self.positions = variant, max_len, spec.get("positions")
        self.word_embed = nn.Embedding(num_words, word_dim, padding_idx=0)
        position_dim = {"add": word_dim, "concat": concat_position_dim}.get(self.positions, 0)
        self.position_embed = nn.Embedding(max_len, position_dim) if position_dim else None
        self.chars = CharCNN(num_chars, char_dim, char_layers, char_kernel)
        width = word_dim + char_dim + (position_dim if self.positions == "concat" else 0)
        if width % heads:
            raise ValueError(f"the input width {width} must be divisible by heads={heads}")
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList()
        for i in range(layers):
            options = {**dict(attention or {}), **spec.get("every_layer", {}), **(spec.get("first_layer", {}) if i == 0
                                                                               else {})}
            options = {key: ({**value, "max_len": max_len} if key in ("position", "convoluted") else value)
                       for key, value in options.items()}
            self.layers.append(MultiHeadAttention(width, heads, options, bias=False, out_proj=False,
                                                  first_layer=i == 0))
        self.needs_query_mask = "convoluted" in spec.get("every_layer", {})
        self.output = nn.Linear(2 * width, num_tags)
        if init not in INITIALISATIONS:
            raise ValueError(f"init={init!r}: use one of {', '.join(INITIALISATIONS)}")
        if init == "keras":
            keras_initialise(self)

    def embed(self, words: Tensor, chars: Tensor, char_index: Tensor) -> Tensor:
        """``[w (+ p) ; (p) ; c]`` for ``words [B, L]``; ``chars [U, C]`` holds the characters of each distinct
        word and ``char_index [B, L]`` picks a row of it for each word (:func:`tagging.data.collate`)."""
        L = words.shape[1]
        if L > self.max_len:
            raise ValueError(f"a sequence of {L} words is longer than max_len={self.max_len}; cut sentences into "
                             f"chunks of at most max_len words (tagging.data.encode does)")
        x = self.word_embed(words)
        if self.position_embed is not None:
            p = self.position_embed(torch.arange(L, device=words.device)).expand(words.shape[0], L, -1)
            x = x + p if self.positions == "add" else torch.cat([x, p], -1)
        return torch.cat([x, self.chars(chars)[char_index]], -1)

    def forward(self, words: Tensor, chars: Tensor, char_index: Tensor, mask: Tensor) -> Tensor:
        """Tag logits ``[B, L, tags]``; ``mask [B, L]`` is True at real words."""
        x = self.embed(words, chars, char_index)
        keys = mask[:, None, None, :]  # [B, 1, 1, L]
        attn_mask = keys & mask[:, None, :, None] if self.needs_query_mask else keys
        h = x
        for layer in self.layers:
            h = self.dropout(h)  # the authors' order: the residual adds the dropped-out input
            out, _ = layer(h, mask=attn_mask)
            h = h + out
        return self.output(torch.cat([x, h], -1))
