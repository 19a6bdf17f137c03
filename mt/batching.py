"""Length-bucketed batches under a token budget, shuffled deterministically.

Sentence pairs are sorted by their longer side (random tie-break), cut into consecutive batches whose
padded size ``n_sentences * max(longest source, longest target)`` stays within
``max_tokens`` (and at most ``max_sentences`` pairs), and the batch order is shuffled with a
generator seeded by ``seed + epoch``: the same seed and epoch give the same batches on every
run, which is what an exact resume needs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

import torch
from torch import Tensor


def token_batches(src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int,
                  max_sentences: Optional[int] = None, shuffle: bool = True, seed: int = 0,
                  epoch: int = 0) -> List[List[int]]:
    """Lists of example indices, each batch within the token budget (padding included)."""
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths")
    longest = max(max(src_lengths, default=0), max(tgt_lengths, default=0))
    if longest > max_tokens:
        raise ValueError(f"max_tokens={max_tokens} is smaller than the longest sentence ({longest} tokens): "
                         "raise batching.max_tokens or filter long pairs with data.max_len")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    tie = torch.rand(len(src_lengths), generator=gen) if shuffle else torch.zeros(len(src_lengths))
    order = sorted(range(len(src_lengths)),
                   key=lambda i: (max(src_lengths[i], tgt_lengths[i]), src_lengths[i], tgt_lengths[i], float(tie[i])))
    batches, current, width = [], [], 0
    for i in order:
        new_width = max(width, src_lengths[i], tgt_lengths[i])
        full = max_sentences is not None and len(current) >= max_sentences
        if current and (new_width * (len(current) + 1) > max_tokens or full):
            batches.append(current)
            current, new_width = [], max(src_lengths[i], tgt_lengths[i])
        current.append(i)
        width = new_width
    if current:
        batches.append(current)
    if shuffle:
        batches = [batches[j] for j in torch.randperm(len(batches), generator=gen).tolist()]
    return batches


@dataclass
class Batch:
    """Padded id tensors: ``src [B, S]``, ``tgt_in [B, T]`` (bos ...), ``tgt_out [B, T]`` (... eos)."""

    src: Tensor
    src_mask: Tensor  # True = real token
    tgt_in: Tensor
    tgt_out: Tensor
    indices: List[int]


def pad_sequences(seqs: Sequence[Tensor], pad: int, multiple: int = 1) -> Tensor:
    """``[N, L]``: the sequences padded to the longest, rounded up to a multiple of ``multiple``."""
    padded = torch.nn.utils.rnn.pad_sequence(list(seqs), batch_first=True, padding_value=pad)
    extra = -padded.shape[1] % multiple
    return torch.nn.functional.pad(padded, (0, extra), value=pad) if extra else padded


def collate(src: Sequence[Tensor], tgt: Sequence[Tensor], indices: Sequence[int], src_pad: int,
            tgt_pad: int, multiple: int = 1) -> Batch:
    """Pad a batch; the target is split into decoder input (``bos y``) and output (``y eos``). With
    ``multiple`` the lengths are rounded up (the target's to one more than a multiple, so that decoder
    input and output are multiples): fewer distinct shapes, each a CUDA graph under ``reduce-overhead``."""
    src_t = pad_sequences([src[i] for i in indices], src_pad, multiple)
    tgt_t = pad_sequences([tgt[i] for i in indices], tgt_pad)
    extra = -(tgt_t.shape[1] - 1) % multiple
    if extra:
        tgt_t = torch.nn.functional.pad(tgt_t, (0, extra), value=tgt_pad)
    return Batch(src=src_t, src_mask=src_t.ne(src_pad), tgt_in=tgt_t[:, :-1], tgt_out=tgt_t[:, 1:],
                 indices=list(indices))


def iterate_batches(data, batches: List[List[int]], src_pad: int, tgt_pad: int, start: int = 0) -> Iterator[Batch]:
    """Collated batches of ``data`` (a :class:`~mt.data.ParallelData`), from batch ``start`` on."""
    for indices in batches[start:]:
        yield collate(data.src, data.tgt, indices, src_pad, tgt_pad)
