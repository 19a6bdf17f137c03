"""Batches of similar lengths for training on variable-length text (dynamic padding)."""
from __future__ import annotations

from typing import List, Sequence

import torch


def bucketed_order(lengths: Sequence[int], batch_size: int, generator: torch.Generator, pool: int = 50
                   ) -> List[List[int]]:
    """Training batches of similar lengths in a random order: shuffle, sort each pool of ``pool`` batches by
    length, cut it into batches, shuffle the batches (a bucket iterator). Padding shrinks several times
    compared with random batches, and every example is seen once per epoch."""
    perm = torch.randperm(len(lengths), generator=generator).tolist()
    out = []
    for lo in range(0, len(perm), pool * batch_size):
        group = sorted(perm[lo:lo + pool * batch_size], key=lambda i: lengths[i])
        out.extend(group[i:i + batch_size] for i in range(0, len(group), batch_size))
    return [out[i] for i in torch.randperm(len(out), generator=generator).tolist()]


def epoch_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int, bucket: bool = True
                  ) -> List[List[int]]:
    """The training batches of ``epoch``, a function of the seed and the epoch only (a resumed epoch replays them):
    :func:`bucketed_order` when ``bucket``, else random batches of a fresh permutation."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    if bucket:
        return bucketed_order(lengths, batch_size, generator)
    perm = torch.randperm(len(lengths), generator=generator).tolist()
    return [perm[i:i + batch_size] for i in range(0, len(perm), batch_size)]


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> List[List[int]]:
    """Evaluation batches of examples sorted by length (least padding; the order changes no metric)."""
    ranked = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [ranked[i:i + batch_size] for i in range(0, len(ranked), batch_size)]
