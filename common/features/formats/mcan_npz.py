"""MCAN's per-image bottom-up features: ``COCO_<split>_<id:012d>.jpg.npz`` in one directory.

Keys: ``x`` [D, N] (transposed: MCAN's ``proc_img_feat`` reads ``x.transpose((1, 0))``),
``bbox`` [N, 4] pixels, ``num_bbox``, ``image_h``, ``image_w``.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Iterator, List, Tuple, Union

import numpy as np

from ..store import RegionFeatureError, RegionFeatures
from ._common import Skip, never, npz_arrays, record

PathLike = Union[str, os.PathLike]
_NAME = re.compile(r"(\d+)\.jpg\.npz$")
KEYS = ("x", "bbox", "image_h", "image_w")


def files(directory: PathLike) -> List[Tuple[int, Path]]:
    """(image id, path) of every ``*.jpg.npz`` in ``directory``, by image id."""
    directory = Path(directory)
    if not directory.is_dir():
        raise RegionFeatureError(f"{directory}: no such directory of MCAN .npz features")
    found = sorted((int(match.group(1)), path) for path in directory.iterdir() if (match := _NAME.search(path.name)))
    if not found:
        raise RegionFeatureError(f"{directory}: no COCO_<split>_<id>.jpg.npz files found")
    return found


def read(directory: PathLike, skip: Skip = never) -> Iterator[RegionFeatures]:
    for image_id, path in files(directory):
        if skip(image_id):
            continue
        data = npz_arrays(path, KEYS)
        where = f"{path} (image id {image_id})"
        x, boxes = data["x"], data["bbox"]
        if x.ndim != 2 or x.shape[1] != len(boxes):
            raise RegionFeatureError(f"{where}: key 'x' has shape {x.shape}, expected [D, N] with N = {len(boxes)} "
                                     f"boxes in 'bbox' (MCAN stores features transposed)")
        yield record(image_id, x.T, boxes, int(data["image_h"]), int(data["image_w"]), where)


def count(directory: PathLike) -> int:
    return len(files(directory))


def write(directory: PathLike, items: Iterable[RegionFeatures], split: str = "val2014") -> Path:
    """Write ``items`` as MCAN's per-image ``.npz`` files (for fixtures and tests)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for item in items:
        height, width = item.image_size
        np.savez(directory / f"COCO_{split}_{item.image_id:012d}.jpg.npz", x=item.features.numpy().T,
                 bbox=item.boxes.numpy(), num_bbox=item.num_regions, image_h=height, image_w=width)
    return directory
