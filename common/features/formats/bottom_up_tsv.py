"""Anderson et al.'s bottom-up TSV (``tools/generate_tsv.py``, read by ``tools/read_tsv.py``).

One image per line, tab-separated, no header: ``image_id, image_w, image_h, num_boxes,
boxes, features``; ``boxes`` and ``features`` are base64 of float32 arrays [num_boxes, 4]
and [num_boxes, D] (the ``trainval_36`` files have 36 boxes, the adaptive ones 10-100).
"""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Iterable, Iterator, Union

import numpy as np

from ..store import RegionFeatures
from ._common import Skip, encode_field, int_field, never, tsv_record, tsv_rows

FIELDNAMES = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
PathLike = Union[str, os.PathLike]


def read(path: PathLike, skip: Skip = never) -> Iterator[RegionFeatures]:
    path = Path(path)
    for line, row in tsv_rows(path, FIELDNAMES):
        where = f"{path}, line {line}"
        image_id = int_field(row, "image_id", where)
        if not skip(image_id):
            yield tsv_record(row, image_id, where, "image_h", "image_w")


def write(path: PathLike, items: Iterable[RegionFeatures]) -> Path:
    """Write ``items`` as Anderson's TSV (for fixtures and tests)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, delimiter="\t", fieldnames=FIELDNAMES, lineterminator="\n")
        for item in items:
            height, width = item.image_size
            writer.writerow({"image_id": item.image_id, "image_w": width, "image_h": height,
                             "num_boxes": item.num_regions, "boxes": encode_field(item.boxes.numpy(), np.float32),
                             "features": encode_field(item.features.numpy(), np.float32)})
    return path
