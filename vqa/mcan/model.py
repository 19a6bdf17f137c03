"""MCAN (Yu et al., "Deep Modular Co-Attention Networks for VQA", CVPR 2019), encoder-decoder.

As ``MILVLG/mcan-vqa`` ``core/model/net.py``:

* question: word embeddings (GloVe when given) -> 1-layer LSTM -> ``X`` ``[B, L, d]``;
* image: region features ``[B, N, 2048]`` -> Linear -> ``Y`` ``[B, N, d]``;
* ``layers`` SA units on ``X``, then ``layers`` SGA units on ``Y``, each guided by the final ``X``;
* ``AttFlat`` on each, ``z = LN(W_x x + W_y y)``, answer logits ``W_z z`` (sigmoid -> scores).

Differences: explicit padding masks (MCAN infers them from all-zero rows), ``nn.LayerNorm``
(MCAN's own divides by the unbiased std + eps), and the forward returns logits; the sigmoid
belongs to the loss (``binary_cross_entropy_with_logits``) for numerical safety.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from torch import Tensor, nn

from common.attention import AttendConfig
from common.utils.runtime import LSTM

from .layers import AttentionFlatten, GuidedAttentionLayer, SelfAttentionLayer


@dataclass
class MCANConfig:
    """Sizes of the model; the defaults are MCAN-small (``cfgs/small_model.yml``)."""

    vocab_size: int
    num_answers: int
    feature_dim: int = 2048
    word_dim: int = 300
    hidden: int = 512
    heads: int = 8
    ffn: int = 2048
    layers: int = 6
    dropout: float = 0.1
    flat_mlp: int = 512
    flat_glimpses: int = 1
    flat_out: int = 1024
    attention: str = "softmax"
    attention_options: dict = field(default_factory=dict)
    flat_attention: bool = True  # the AttFlat poolings use the normalizer too (False: softmax)


@dataclass
class MCANMaps:
    """Attention weights of every layer, ``[B, heads, queries, keys]`` (masked keys are 0)."""

    question_self: List[Tensor]      # encoder SA layers, [B, H, L, L]
    image_self: List[Tensor]         # decoder SGA self-attention, [B, H, N, N]
    image_guided: List[Tensor]       # decoder SGA guided attention, [B, H, N, L]
    question_flat: Tensor            # AttFlat on the question, [B, G, 1, L]
    image_flat: Tensor               # AttFlat on the image, [B, G, 1, N]


class MCAN(nn.Module):
    """MCAN for VQA: ``forward(question_tokens, question_mask, features, region_mask) -> logits [B, A]``."""

    def __init__(self, config: MCANConfig, word_vectors: Optional[Tensor] = None):
        super().__init__()
        c = self.config = config
        self.embedding = nn.Embedding(c.vocab_size, c.word_dim)
        if word_vectors is not None:
            if tuple(word_vectors.shape) != (c.vocab_size, c.word_dim):
                raise ValueError(f"word vectors are {tuple(word_vectors.shape)}, expected "
                                 f"({c.vocab_size}, {c.word_dim}) = (question vocabulary, model.word_dim)")
            self.embedding.weight.data.copy_(word_vectors)
        self.lstm = LSTM(c.word_dim, c.hidden, num_layers=1, batch_first=True)
        self.image_proj = nn.Linear(c.feature_dim, c.hidden)
        attend = AttendConfig(normalizer=c.attention, normalizer_options=dict(c.attention_options), dropout=c.dropout)
        self.encoder = nn.ModuleList(SelfAttentionLayer(c.hidden, c.heads, c.ffn, c.dropout, attend)
                                     for _ in range(c.layers))
        self.decoder = nn.ModuleList(GuidedAttentionLayer(c.hidden, c.heads, c.ffn, c.dropout, attend)
                                     for _ in range(c.layers))
        flat = (c.attention, c.attention_options) if c.flat_attention else ("softmax", {})
        self.flat_question = AttentionFlatten(c.hidden, c.flat_mlp, c.flat_glimpses, c.flat_out, c.dropout, *flat)
        self.flat_image = AttentionFlatten(c.hidden, c.flat_mlp, c.flat_glimpses, c.flat_out, c.dropout, *flat)
        self.norm = nn.LayerNorm(c.flat_out)
        self.classifier = nn.Linear(c.flat_out, c.num_answers)

    def forward(self, question_tokens: Tensor, question_mask: Tensor, features: Tensor, region_mask: Tensor,
                need_maps: bool = False):
        """Answer logits ``[B, A]``; with ``need_maps=True`` also the :class:`MCANMaps`.

        Args:
            question_tokens: ``[B, L]`` word ids; question_mask: ``[B, L]``, True = real token.
            features: ``[B, N, feature_dim]``; region_mask: ``[B, N]``, True = real region.
        """
        x, _ = self.lstm(self.embedding(question_tokens))
        y = self.image_proj(features)
        x_mask, y_mask = question_mask[:, None, None, :], region_mask[:, None, None, :]
        question_self, image_self, image_guided = [], [], []
        for layer in self.encoder:
            x, w = layer(x, x_mask, need_maps)
            question_self.append(w)
        for layer in self.decoder:
            y, w_self, w_guided = layer(y, x, y_mask, x_mask, need_maps)
            image_self.append(w_self)
            image_guided.append(w_guided)
        x_flat, x_weights = self.flat_question(x, question_mask)
        y_flat, y_weights = self.flat_image(y, region_mask)
        logits = self.classifier(self.norm(x_flat + y_flat))
        if not need_maps:
            return logits
        return logits, MCANMaps(question_self, image_self, image_guided, x_weights, y_weights)
