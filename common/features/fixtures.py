"""Deterministic synthetic region features, for tests and demos of every domain.

``random_region_features`` makes one image's regions (non-negative features like the
ReLU outputs of a detector, valid boxes inside the image); the same ``(seed, image_id)``
always gives the same values, whatever other images are generated with it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterable, Tuple, Union

import numpy as np
import torch

from . import formats
from .store import RegionFeatures
from .writer import RegionFeatureWriter

PathLike = Union[str, os.PathLike]
RegionCount = Union[int, Tuple[int, int]]


def random_region_features(image_id: int, num_regions: RegionCount = 36, feature_dim: int = 2048, seed: int = 0,
                           image_size: Tuple[int, int] = (480, 640)) -> RegionFeatures:
    """One image's synthetic regions; ``num_regions`` is a count or an inclusive (min, max)
    range (e.g. (10, 100) like the adaptive bottom-up features). Feature values are
    multiples of 1/64 in [0, 8), exact in float16, so they survive any storage dtype."""
    rng = np.random.default_rng([seed, image_id % 2**64])  # ids of hashed names are negative
    low, high = (num_regions, num_regions) if isinstance(num_regions, int) else num_regions
    n = int(rng.integers(low, high + 1))
    features = rng.integers(0, 512, size=(n, feature_dim)).astype(np.float32) / 64
    height, width = image_size
    corners = rng.uniform(0, 1, size=(n, 2, 2)) * np.array([width - 1, height - 1], dtype=np.float64)
    boxes = np.concatenate([corners.min(axis=1), corners.max(axis=1) + 1], axis=1).astype(np.float32)
    return RegionFeatures(image_id=int(image_id), features=torch.from_numpy(features),
                          boxes=torch.from_numpy(boxes), image_size=(int(height), int(width)))


def write_random_features(path: PathLike, image_ids: Iterable[int], num_regions: RegionCount = 36,
                          feature_dim: int = 2048, seed: int = 0, image_size: Tuple[int, int] = (480, 640),
                          dtype: str = "float16") -> Path:
    """Write ``random_region_features`` of every id into a region-feature HDF5 file."""
    with RegionFeatureWriter(path, feature_dim=feature_dim, dtype=dtype) as writer:
        for image_id in image_ids:
            item = random_region_features(image_id, num_regions, feature_dim, seed, image_size)
            writer.add(item.image_id, item.features, item.boxes, *item.image_size)
    return Path(path)


def write_format_fixtures(root: PathLike, image_ids: Iterable[int], num_regions: RegionCount = (10, 100),
                          feature_dim: int = 2048, seed: int = 0, image_size: Tuple[int, int] = (480, 640),
                          split: str = "val2014") -> Dict[str, Path]:
    """The same synthetic regions in every input format ``scripts/convert_features.py`` reads,
    laid out as their tools write them; returns the path of each:

    - ``bottom-up-tsv``: ``root/bottom_up.tsv`` (Anderson's TSV)
    - ``lxmert-tsv``: ``root/<split>_obj36.tsv`` (LXMERT)
    - ``selfcritical-npz``: ``root/selfcritical/`` with ``cocobu_att``, ``cocobu_fc``,
      ``cocobu_box`` and ``image_info.json``
    - ``mcan-npz``: ``root/mcan/<split>/COCO_<split>_<id>.jpg.npz``
    """
    root = Path(root)
    items = [random_region_features(i, num_regions, feature_dim, seed, image_size) for i in image_ids]
    return {
        "bottom-up-tsv": formats.bottom_up_tsv.write(root / "bottom_up.tsv", items),
        "lxmert-tsv": formats.lxmert_tsv.write(root / f"{split}_obj36.tsv", items, prefix=f"COCO_{split}_", seed=seed),
        "selfcritical-npz": formats.selfcritical_npz.write(root / "selfcritical", items),
        "mcan-npz": formats.mcan_npz.write(root / "mcan" / split, items, split=split),
    }
