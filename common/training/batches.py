"""An epoch's batches for :meth:`common.training.Task.updates` when a DataLoader loads them."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Iterable, List, Union


class EpochBatches(Sequence):
    """An epoch's batches of dataset indices. An item is a batch; a slice (the engine's ``[start:]``, where a
    resumed epoch goes on) is ``loader(batches, start)``, e.g. a DataLoader over them whose workers load ahead
    (an empty slice is ``[]``: no loader is built, so none draws a seed)."""

    def __init__(self, batches: List[List[int]], loader: Callable[[List[List[int]], int], Iterable]):
        self.batches, self.loader = batches, loader

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index) -> Union[List[int], Iterable]:
        batches = self.batches[index]
        if not isinstance(index, slice) or not batches:
            return batches
        return self.loader(batches, index.start or 0)
