"""Tiny random LXMERT pieces for the LXMERT tests (hidden 32, 2 heads, 2-1-2 layers, ~100 words)."""
from __future__ import annotations

import torch
from transformers import LxmertConfig

NUM_ANSWERS = 6


def tiny_config(**overrides) -> LxmertConfig:
    values = dict(vocab_size=100, hidden_size=32, num_attention_heads=2, intermediate_size=64, l_layers=2,
                  x_layers=2, r_layers=1, visual_feat_dim=16, max_position_embeddings=32, num_qa_labels=9)
    values.update(overrides)
    return LxmertConfig(**values)


def tiny_inputs(config: LxmertConfig, batch: int = 3, words: int = 7, regions: int = 5, seed: int = 0) -> dict:
    """Random inputs with padded words and regions in the last example."""
    g = torch.Generator().manual_seed(seed)
    attention_mask = torch.ones(batch, words, dtype=torch.long)
    attention_mask[-1, words - 3:] = 0
    visual_attention_mask = torch.ones(batch, regions, dtype=torch.long)
    visual_attention_mask[-1, regions - 2:] = 0
    corners = torch.rand(batch, regions, 2, generator=g) * 0.5
    return {
        "input_ids": torch.randint(1, config.vocab_size, (batch, words), generator=g) * attention_mask,
        "attention_mask": attention_mask,
        "visual_feats": torch.randn(batch, regions, config.visual_feat_dim, generator=g),
        "visual_pos": torch.cat([corners, corners + 0.4], -1),
        "visual_attention_mask": visual_attention_mask,
    }
