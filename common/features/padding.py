"""Batch images with different numbers of regions: zero padding plus a boolean mask."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from .store import RegionFeatures


def pad_regions(items: Sequence[RegionFeatures], max_regions: Optional[int] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack ``items`` into ``features`` [B, N, D], ``boxes`` [B, N, 4] and ``mask`` [B, N]
    (True = a real region; padded rows are exact zeros).

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
    batch = len(items)
    features = items[0].features.new_zeros(batch, length, dims.pop())
    boxes = items[0].boxes.new_zeros(batch, length, 4)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for i, item in enumerate(items):
        n = min(item.num_regions, length)
        features[i, :n] = item.features[:n]
        boxes[i, :n] = item.boxes[:n]
        mask[i, :n] = True
    return features, boxes, mask
