"""MCAN's per-image bottom-up features: ``COCO_<split>_<id:012d>.jpg.npz`` in one directory.

Keys: ``x`` [D, N] (transposed: MCAN's ``proc_img_feat`` reads ``x.transpose((1, 0))``),
``bbox`` [N, 4] pixels, ``num_bbox``, ``image_h``, ``image_w``. The name of an image is
its file name without ``.jpg.npz``; its id is ``names.numeric_id`` of it (the COCO id).
"""
from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Union

import numpy as np

from ..errors import RegionFeatureError
from ..names import numeric_id
from ..sources import Source, directory_record, input_directory
from ..store import RegionFeatures
from ._common import Entry, absolute, check_width, npz_arrays, record, scalar_int

FORMAT = "mcan-npz"
SUFFIX = ".jpg.npz"
KEYS = ("x", "bbox", "image_h", "image_w")
WHAT = "MCAN COCO_<split>_<id>.jpg.npz features"
PathLike = Union[str, os.PathLike]


def _name(path: Path) -> str:
    return path.name[: -len(SUFFIX)]


def files(directory: PathLike) -> List[Path]:
    """Every ``*.jpg.npz`` in ``directory``, by image id."""
    directory = absolute(input_directory(directory, WHAT))
    found = [path for path in directory.iterdir() if path.name.endswith(SUFFIX)]
    if not found:
        raise RegionFeatureError(f"{directory}: no COCO_<split>_<id>.jpg.npz files found")
    return sorted(found, key=lambda path: (numeric_id(_name(path)), path.name))


def source(directory: PathLike) -> Source:
    """The record of the input ``directory``; a missing or empty one, or a file, is an error."""
    return directory_record(directory, FORMAT, files(directory))


def entries(directory: PathLike, feature_dim: Optional[int] = None) -> Iterator[Entry]:
    """The images of one directory, by image id; ``load()`` reads an .npz, checking ``feature_dim``."""
    for path in files(directory):
        name = _name(path)
        image_id = numeric_id(name)
        yield Entry(image_id, str(path), partial(_load, path, image_id, name, feature_dim), name=name)


def _load(path: Path, image_id: int, name: str, feature_dim: Optional[int]) -> RegionFeatures:
    data = npz_arrays(path, KEYS)
    where = f"{path} (image id {image_id})"
    x, boxes = data["x"], data["bbox"]
    if x.ndim != 2 or boxes.ndim != 2 or x.shape[1] != len(boxes):
        raise RegionFeatureError(f"{where}: field 'x' has shape {x.shape}, expected [D, N] with N = {len(boxes)} "
                                 f"boxes in 'bbox' (MCAN stores features transposed)")
    features = check_width(x.T, feature_dim, where, "x", first=True)
    height, width = scalar_int(data, "image_h", where), scalar_int(data, "image_w", where)
    return record(image_id, features, boxes, height, width, where, fields=("x", "bbox"), name=name)


def write(directory: PathLike, items: Iterable[RegionFeatures], split: str = "val2014") -> Path:
    """Write ``items`` as MCAN's per-image ``.npz`` files (for fixtures and tests)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for item in items:
        height, width = item.image_size
        np.savez(directory / f"COCO_{split}_{item.image_id:012d}{SUFFIX}", x=item.features.numpy().T,
                 bbox=item.boxes.numpy(), num_bbox=item.num_regions, image_h=height, image_w=width)
    return directory
