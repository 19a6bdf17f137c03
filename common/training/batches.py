"""An epoch's batches for :meth:`common.training.Task.updates` when a DataLoader loads them."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, List, Optional, Union

import torch
from torch.utils.data import DataLoader


class EpochBatches(Sequence):
    """An epoch's batches of indices into ``dataset``. An item is a batch; a slice (the engine's ``[start:]``, where
    a resumed epoch goes on) is a DataLoader over those batches, whose ``num_workers`` load ahead (an empty slice is
    ``[]``: no loader is built, so none draws a seed). The loader's generator is ``generator()`` where one is given;
    else torch's global one for a whole epoch (the workers' base seed drawn at the epoch's start, as a loader over a
    sampler draws it) and one of its own for an epoch resumed inside, since the restored global state already holds
    that draw."""

    def __init__(self, batches: List[List[int]], dataset, collate: Callable, num_workers: int = 0,
                 pin_memory: bool = False, generator: Optional[Callable[[], torch.Generator]] = None):
        self.batches, self.dataset, self.collate, self.generator = batches, dataset, collate, generator
        self.num_workers, self.pin_memory = num_workers, pin_memory

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index) -> Union[List[int], DataLoader]:
        batches = self.batches[index]
        if not isinstance(index, slice) or not batches:
            return batches
        generator = self.generator() if self.generator else torch.Generator() if index.start else None
        return DataLoader(self.dataset, batch_sampler=batches, collate_fn=self.collate, num_workers=self.num_workers,
                          pin_memory=self.pin_memory, generator=generator)
