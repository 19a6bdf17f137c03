"""Batched translation of id tensors with ``common.decoding`` (greedy or beam search)."""
from __future__ import annotations

from typing import List, Sequence

import torch
from torch import Tensor, nn

from common.decoding import beam_search, greedy_search
from common.text import Vocabulary
from common.utils import console

from .batching import pad_sequences


@torch.no_grad()
def translate_ids(model: nn.Module, sources: Sequence[Tensor], src_pad: int, tgt_vocab: Vocabulary,
                  beam_size: int = 5, length_penalty: float = 1.0, max_len_a: float = 1.5, max_len_b: int = 10,
                  batch_size: int = 64, progress: bool = False) -> List[List[int]]:
    """Output ids (no bos/eos) for every source, in input order.

    Sources are sorted by length and decoded ``batch_size`` at a time, each batch up to
    ``max_len_a * longest source + max_len_b`` tokens; ``beam_size=1`` is greedy search.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: List[List[int]] = [[] for _ in sources]
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for chunk in console.progress(chunks, desc="translating batch", enabled=progress):
        src = pad_sequences([sources[i] for i in chunk], src_pad).to(device)
        state = model.encode(src, src.ne(src_pad))
        max_len = int(max_len_a * src.shape[1] + max_len_b)
        common = dict(batch_size=len(chunk), bos=tgt_vocab.bos, eos=tgt_vocab.eos, max_len=max_len,
                      pad=tgt_vocab.pad)
        if beam_size == 1:
            hyps = greedy_search(model.decode_step, state, **common)
        else:
            hyps, _ = beam_search(model.decode_step, state, beam_size=beam_size, length_penalty=length_penalty,
                                  **common)
        for i, row in zip(chunk, hyps.tolist()):
            outputs[i] = row[: row.index(tgt_vocab.eos)] if tgt_vocab.eos in row else row
    model.train(was_training)
    return outputs


def ids_to_text(ids: Sequence[Sequence[int]], vocab: Vocabulary) -> List[str]:
    return [" ".join(vocab.decode(row)) for row in ids]
