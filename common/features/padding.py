"""Batch images with different numbers of regions: zero padding plus a boolean mask."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from .store import RegionFeatures


def _pad(arrays: Sequence[np.ndarray], length: int) -> torch.Tensor:
    # numpy copies run on the calling thread; B small torch copies each woke the intra-op
    # pool and took 15-650 ms per batch of 32 on a loaded 2-core machine, against 2-4 ms
    out = np.zeros((len(arrays), length) + arrays[0].shape[1:], dtype=arrays[0].dtype)
    for row, array in enumerate(arrays):
        out[row, :len(array)] = array[:length]
    return torch.from_numpy(out)


def pad_regions(items: Sequence[RegionFeatures], max_regions: Optional[int] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack ``items`` into ``features`` [B, N, D], ``boxes`` [B, N, 4] and ``mask`` [B, N]
    (True = a real region; padded rows are exact zeros). Items are CPU tensors, as the
    store returns them.

    ``N`` is the largest region count, or ``max_regions`` when given: every image is then
    padded to exactly that many and longer ones keep their first ``max_regions`` regions
    (MCAN pads its 10-100 boxes to 100 this way).
    """
    if not items:
        raise ValueError("pad_regions needs at least one RegionFeatures")
    dims = {item.features.shape[1] for item in items}
    if len(dims) != 1:
        raise ValueError(f"pad_regions: feature dimensions differ across the batch: {sorted(dims)} "
                         f"(image ids {[item.image_id for item in items]})")
    if max_regions is not None and max_regions < 1:
        raise ValueError(f"max_regions={max_regions} must be positive")
    length = max_regions if max_regions is not None else max(item.num_regions for item in items)
    counts = torch.tensor([min(item.num_regions, length) for item in items])
    features = _pad([item.features.numpy() for item in items], length)
    boxes = _pad([item.boxes.numpy() for item in items], length)
    return features, boxes, torch.arange(length) < counts[:, None]
