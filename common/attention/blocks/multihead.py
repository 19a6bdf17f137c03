"""Multi-head attention with projections: self-, cross- (guided) and causal attention."""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Optional

from torch import Tensor, nn

from ..maps.temperature import LearnableTemperature
from .attend import Attend, AttentionMaps
from .config import AttendConfig, as_config


class MultiHeadAttention(nn.Module):
    """``out_proj(Attend(W_q x, W_k y, W_v y))`` over batch-first inputs ``[B, L, E]``.

    Self-attention when ``key`` is omitted; cross (guided) attention with ``key`` (and
    ``value``, which defaults to ``key``). ``config.temperature`` multiplies ``W_q``, ``W_k``
    and ``W_v`` by learnable scalars (Dufter et al., Sec. 2.4). With every option off this is
    ``nn.MultiheadAttention`` computed by ``F.scaled_dot_product_attention``.

    Args:
        embed_dim: ``E``, the query width and the output width.
        num_heads: ``H``; ``embed_dim`` must be divisible by it.
        config: :class:`AttendConfig` or a mapping of its fields.
        kdim, vdim: widths of key/value inputs for cross-attention (default ``embed_dim``).
        bias: biases on the four projections.
        out_proj: False leaves the heads' outputs concatenated, without the output projection
            (the self-attention layers of Dufter et al., 2020).
        first_layer, decoder: see :class:`Attend`.
    """

    def __init__(self, embed_dim: int, num_heads: int, config: "AttendConfig | Mapping | None" = None, *,
                 kdim: Optional[int] = None, vdim: Optional[int] = None, bias: bool = True,
                 out_proj: bool = True, first_layer: bool = False, decoder: bool = False):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        config = as_config(config)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(kdim or embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(vdim or embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias) if out_proj else nn.Identity()
        self.temperature = LearnableTemperature() if config.temperature else None
        self.attend = Attend(num_heads, self.head_dim, replace(config, temperature=False),
                             first_layer=first_layer, decoder=decoder)

    def _heads(self, role: str, proj: nn.Linear, x: Tensor) -> Tensor:
        y = proj(x) if self.temperature is None else self.temperature.project(role, x, proj.weight, proj.bias)
        return y.unflatten(-1, (self.num_heads, self.head_dim)).transpose(-2, -3)  # [..., H, L, d]

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        *,
        mask: Optional[Tensor] = None,
        causal: bool = False,
        prev_logits: Optional[Tensor] = None,
        need_maps: bool = False,
        query_positions: Optional[Tensor] = None,
        key_positions: Optional[Tensor] = None,
    ) -> tuple[Tensor, AttentionMaps]:
        """Output ``[B, Q, E]`` and the maps record; keyword arguments as in :meth:`Attend.forward`.

        ``mask`` broadcasts to ``[B, H, Q, K]`` (a key padding mask is ``[B, 1, 1, K]``).
        """
        if key is None:
            if value is not None:
                raise ValueError("value was given without key; pass key=... for cross-attention")
            key = value = query
        elif value is None:
            value = key
        q = self._heads("q", self.q_proj, query)
        k = self._heads("k", self.k_proj, key)
        v = self._heads("v", self.v_proj, value)
        out, maps = self.attend(q, k, v, mask=mask, causal=causal, prev_logits=prev_logits, need_maps=need_maps,
                                query_positions=query_positions, key_positions=key_positions)
        return self.out_proj(out.transpose(-2, -3).flatten(-2)), maps
