"""LXMERT's ``*_obj36.tsv`` (read by ``src/utils.py: load_obj_tsv``).

Tab-separated, no header: ``img_id, img_h, img_w, objects_id, objects_conf, attrs_id,
attrs_conf, num_boxes, boxes, features``; the array fields are base64 of int64
(``*_id``), float32 (``*_conf``, ``boxes`` [N, 4], ``features`` [N, D]). ``img_id`` is a
name such as ``COCO_val2014_000000273052``; its trailing digits are the image id.
Detector labels and confidences are not stored (no domain uses them).
"""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Iterable, Iterator, Union

import numpy as np

from ..store import RegionFeatureError, RegionFeatures
from ._common import Skip, encode_field, never, trailing_image_id, tsv_record, tsv_rows

FIELDNAMES = ("img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id", "attrs_conf", "num_boxes",
              "boxes", "features")
PathLike = Union[str, os.PathLike]


def image_id_of(name: str, where: str) -> int:
    """``COCO_val2014_000000273052`` -> 273052 (the trailing digits of LXMERT's ``img_id``)."""
    image_id = trailing_image_id(name)
    if image_id is None:
        raise RegionFeatureError(f"{where}: field 'img_id' is {name!r}, which does not end in the numeric image id")
    return image_id


def read(path: PathLike, skip: Skip = never) -> Iterator[RegionFeatures]:
    path = Path(path)
    for line, row in tsv_rows(path, FIELDNAMES):
        where = f"{path}, line {line}"
        image_id = image_id_of(row["img_id"], where)
        if not skip(image_id):
            yield tsv_record(row, image_id, where, "img_h", "img_w")


def write(path: PathLike, items: Iterable[RegionFeatures], prefix: str = "COCO_val2014_", seed: int = 0) -> Path:
    """Write ``items`` as LXMERT's TSV (for fixtures and tests), with random detector labels
    (1600 objects, 400 attributes, as Anderson's Visual Genome vocabularies)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, delimiter="\t", fieldnames=FIELDNAMES, lineterminator="\n")
        for item in items:
            rng = np.random.default_rng([seed, item.image_id])
            n = item.num_regions
            height, width = item.image_size
            writer.writerow({
                "img_id": f"{prefix}{item.image_id:012d}", "img_h": height, "img_w": width,
                "objects_id": encode_field(rng.integers(0, 1600, n), np.int64),
                "objects_conf": encode_field(rng.uniform(0, 1, n), np.float32),
                "attrs_id": encode_field(rng.integers(0, 400, n), np.int64),
                "attrs_conf": encode_field(rng.uniform(0, 1, n), np.float32),
                "num_boxes": n, "boxes": encode_field(item.boxes.numpy(), np.float32),
                "features": encode_field(item.features.numpy(), np.float32)})
    return path
