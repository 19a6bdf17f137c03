"""Transformer encoder-decoder (Vaswani et al. 2017) whose attention takes every ``common`` option.

Three attention configs (``common.attention.AttendConfig`` mappings) choose, separately,
the encoder self-attention, the causal decoder self-attention and the encoder-decoder
attention: normalizer (softmax, BAM, entmax ...), predictive / evolving attention
(``cross_layer``: each layer's ``maps.logits`` is handed to the next as ``prev_logits``),
convoluted attention, direct position interactions (first layer only, as in the paper)
and learnable temperature. Decoder layers are built with ``decoder=True`` so that map
convolutions read no later query.

Sub-layer: ``x + Dropout(F(LN(x)))`` (pre-norm) or ``LN(x + Dropout(F(x)))`` (post-norm,
the original). Sinusoidal positions are added to ``sqrt(d) * E x``.
"""
from __future__ import annotations

import math
from typing import Dict, Mapping, Optional

import torch
from torch import Tensor, nn

from common.attention import AttendConfig, MultiHeadAttention

State = Dict[str, Tensor]


def sinusoidal_positions(length: int, dim: int, device=None) -> Tensor:
    """``PE[p, 2i] = sin(p / 10000^(2i/d))``, ``PE[p, 2i+1] = cos(...)``: ``[length, dim]``."""
    position = torch.arange(length, dtype=torch.float32, device=device).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim, device=device)
    pe[:, 0::2] = torch.sin(position * freq)
    pe[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return pe


def _layer_config(config: AttendConfig, index: int) -> AttendConfig:
    """Position interactions belong to the first layer only (Dufter et al.); the rest is shared."""
    if index == 0 or config.position is None:
        return config
    return AttendConfig(**{**config.__dict__, "position": None})


class SubLayer(nn.Module):
    """Residual connection, dropout and layer norm around one sub-layer."""

    def __init__(self, dim: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, fn) -> tuple[Tensor, object]:
        out, extra = fn(self.norm(x) if self.pre_norm else x)
        x = x + self.dropout(out)
        return (x if self.pre_norm else self.norm(x)), extra


class FeedForward(nn.Sequential):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, dim))


class EncoderLayer(nn.Module):
    def __init__(self, dim, heads, ffn_dim, dropout, activation_dropout, pre_norm, config, first_layer):
        super().__init__()
        self.attn = MultiHeadAttention(dim, heads, config, first_layer=first_layer)
        self.ffn = FeedForward(dim, ffn_dim, activation_dropout)
        self.sub_attn, self.sub_ffn = SubLayer(dim, dropout, pre_norm), SubLayer(dim, dropout, pre_norm)
        self.cross_layer = config.cross_layer is not None
        # map convolutions mix neighbouring query rows: padded queries must be masked too
        self.mask_queries = config.cross_layer is not None or config.convoluted is not None

    def forward(self, x: Tensor, src_mask: Tensor, prev_logits: Optional[Tensor]) -> tuple[Tensor, Optional[Tensor]]:
        """``src_mask [B, S]`` True = real token."""
        mask = src_mask[:, None, None, :]
        if self.mask_queries:
            mask = mask & src_mask[:, None, :, None]
        x, maps = self.sub_attn(x, lambda h: self.attn(h, mask=mask, prev_logits=prev_logits))
        x, _ = self.sub_ffn(x, lambda h: (self.ffn(h), None))
        return x, maps.logits if self.cross_layer else None


class DecoderLayer(nn.Module):
    def __init__(self, dim, heads, ffn_dim, dropout, activation_dropout, pre_norm, self_config, cross_config,
                 first_layer):
        super().__init__()
        self.self_attn = MultiHeadAttention(dim, heads, self_config, first_layer=first_layer, decoder=True)
        self.cross_attn = MultiHeadAttention(dim, heads, cross_config, first_layer=first_layer, decoder=True)
        self.ffn = FeedForward(dim, ffn_dim, activation_dropout)
        self.subs = nn.ModuleList(SubLayer(dim, dropout, pre_norm) for _ in range(3))
        self.self_cross_layer = self_config.cross_layer is not None
        self.cross_cross_layer = cross_config.cross_layer is not None

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor, prev_self: Optional[Tensor],
                prev_cross: Optional[Tensor]) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        x, self_maps = self.subs[0](x, lambda h: self.self_attn(h, causal=True, prev_logits=prev_self))
        x, cross_maps = self.subs[1](x, lambda h: self.cross_attn(h, memory, mask=memory_mask,
                                                                   prev_logits=prev_cross))
        x, _ = self.subs[2](x, lambda h: (self.ffn(h), None))
        return (x, self_maps.logits if self.self_cross_layer else None,
                cross_maps.logits if self.cross_cross_layer else None)


class TransformerSeq2Seq(nn.Module):
    """Encoder-decoder Transformer.

    Args:
        encoder_attention, decoder_attention, cross_attention: ``AttendConfig`` mappings for
            encoder self-, decoder self- and encoder-decoder attention (attention dropout
            goes in their ``dropout`` field).
        pre_norm: pre-LN sub-layers (stabler without long warm-up) instead of post-LN.
        tie_output: share the target embedding with the output projection.
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, src_pad: int, tgt_pad: int, dim: int = 512, heads: int = 4,
                 ffn_dim: int = 1024, enc_layers: int = 6, dec_layers: int = 6, dropout: float = 0.3,
                 activation_dropout: float = 0.0, pre_norm: bool = False, tie_output: bool = True,
                 encoder_attention: Optional[Mapping] = None, decoder_attention: Optional[Mapping] = None,
                 cross_attention: Optional[Mapping] = None, max_positions: int = 1024):
        super().__init__()
        enc_cfg, dec_cfg, cross_cfg = (AttendConfig.from_dict(dict(c or {})) for c in
                                       (encoder_attention, decoder_attention, cross_attention))
        self.dim, self.src_pad, self.tgt_pad = dim, src_pad, tgt_pad
        self.src_embed = nn.Embedding(src_vocab, dim, padding_idx=src_pad)
        self.tgt_embed = nn.Embedding(tgt_vocab, dim, padding_idx=tgt_pad)
        for emb, pad in ((self.src_embed, src_pad), (self.tgt_embed, tgt_pad)):
            nn.init.normal_(emb.weight, 0.0, dim ** -0.5)
            nn.init.zeros_(emb.weight[pad])
        self.register_buffer("positions", sinusoidal_positions(max_positions, dim), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.ModuleList(
            EncoderLayer(dim, heads, ffn_dim, dropout, activation_dropout, pre_norm, _layer_config(enc_cfg, i), i == 0)
            for i in range(enc_layers))
        self.decoder = nn.ModuleList(
            DecoderLayer(dim, heads, ffn_dim, dropout, activation_dropout, pre_norm, _layer_config(dec_cfg, i),
                         _layer_config(cross_cfg, i), i == 0)
            for i in range(dec_layers))
        self.enc_norm = nn.LayerNorm(dim) if pre_norm else nn.Identity()
        self.dec_norm = nn.LayerNorm(dim) if pre_norm else nn.Identity()
        self.output = nn.Linear(dim, tgt_vocab, bias=False)
        if tie_output:
            self.output.weight = self.tgt_embed.weight

    def _embed(self, embed: nn.Embedding, tokens: Tensor) -> Tensor:
        if tokens.shape[1] > self.positions.shape[0]:
            raise ValueError(f"sequence of {tokens.shape[1]} tokens exceeds max_positions={self.positions.shape[0]}")
        return self.dropout(embed(tokens) * self.dim ** 0.5 + self.positions[: tokens.shape[1]])

    def encode(self, src: Tensor, src_mask: Tensor) -> State:
        """``{"memory" [B, S, d], "mask" [B, S], "prefix" [B, 0]}``: the decoding state."""
        x, prev = self._embed(self.src_embed, src), None
        for layer in self.encoder:
            x, prev = layer(x, src_mask, prev)
        return {"memory": self.enc_norm(x), "mask": src_mask, "prefix": src.new_zeros(src.shape[0], 0)}

    def decode(self, tgt_in: Tensor, state: State) -> Tensor:
        """Logits ``[B, T, V]`` for decoder inputs ``tgt_in`` (causal: position t sees inputs <= t)."""
        x, prev_self, prev_cross = self._embed(self.tgt_embed, tgt_in), None, None
        memory_mask = state["mask"][:, None, None, :]
        for layer in self.decoder:
            x, prev_self, prev_cross = layer(x, state["memory"], memory_mask, prev_self, prev_cross)
        return self.output(self.dec_norm(x))

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        return self.decode(tgt_in, self.encode(src, src_mask))

    def decode_step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """``common.decoding`` step. The prefix is re-decoded each step (no key/value cache), which
        keeps map convolutions over the decoder's attention maps exact."""
        prefix = torch.cat([state["prefix"], tokens.unsqueeze(1)], 1)
        logits = self.decode(prefix, state)[:, -1]
        return torch.log_softmax(logits.float(), -1), dict(state, prefix=prefix)
