"""LXMERT's ``*_obj36.tsv`` (read by ``src/utils.py: load_obj_tsv``).

Tab-separated, no header: ``img_id, img_h, img_w, objects_id, objects_conf, attrs_id,
attrs_conf, num_boxes, boxes, features``; the array fields are base64 of int64
(``*_id``), float32 (``*_conf``, ``boxes`` [N, 4], ``features`` [N, D]). ``img_id`` is a
name such as ``COCO_val2014_000000273052``, ``2410371`` (Visual Genome) or
``train-10171-0-img0`` (NLVR2): the store keeps it whole, under the numeric id of
``names.numeric_id`` (273052 for the COCO name). Detector labels and confidences are not
stored (no domain uses them).
"""
from __future__ import annotations

import csv
import os
from functools import partial
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

import numpy as np

from ..errors import RegionFeatureError
from ..names import numeric_id
from ..sources import Source, label, text_input
from ..store import RegionFeatures
from ._common import Entry, encode_field, tsv_record, tsv_rows

FORMAT = "lxmert-tsv"
FIELDNAMES = ("img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id", "attrs_conf", "num_boxes",
              "boxes", "features")
PathLike = Union[str, os.PathLike]


def source(path: PathLike, member: Optional[str] = None) -> Source:
    """The record of the input ``path`` (a file, ``.tsv.gz``, ``.zip`` (``member``), FIFO, pipe or
    ``-``); a missing, empty or directory path is an error."""
    return text_input(path, FORMAT, "an LXMERT *_obj36.tsv file", member)


def entries(tsv: Union[PathLike, Source], feature_dim: Optional[int] = None) -> Iterator[Entry]:
    """The images of one TSV (a path or its ``source`` record), in file order, read once;
    ``load()`` decodes a row, checking ``feature_dim``."""
    tsv = tsv if isinstance(tsv, dict) else source(tsv)
    for position, (line, row) in enumerate(tsv_rows(tsv, FIELDNAMES)):
        place = f"{label(tsv)}, line {line}"
        name = row["img_id"]
        if not name.strip():
            raise RegionFeatureError(f"{place}: field 'img_id' is empty, expected the image's name")
        image_id = numeric_id(name)
        yield Entry(image_id, place, partial(tsv_record, row, image_id, f"{place} ({name!r})", ("img_h", "img_w"),
                                             feature_dim, first=position == 0, name=name), name=name)


def write(path: PathLike, items: Iterable[RegionFeatures], prefix: str = "COCO_val2014_", seed: int = 0) -> Path:
    """Write ``items`` as LXMERT's TSV (for fixtures and tests), with random detector labels
    (1600 objects, 400 attributes, as Anderson's Visual Genome vocabularies); ``img_id`` is
    an item's ``name``, else ``prefix`` and the zero-padded image id."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, delimiter="\t", fieldnames=FIELDNAMES, lineterminator="\n")
        for item in items:
            rng = np.random.default_rng([seed, item.image_id % 2**64])
            n = item.num_regions
            height, width = item.image_size
            writer.writerow({
                "img_id": item.name or f"{prefix}{item.image_id:012d}", "img_h": height, "img_w": width,
                "objects_id": encode_field(rng.integers(0, 1600, n), np.int64),
                "objects_conf": encode_field(rng.uniform(0, 1, n), np.float32),
                "attrs_id": encode_field(rng.integers(0, 400, n), np.int64),
                "attrs_conf": encode_field(rng.uniform(0, 1, n), np.float32),
                "num_boxes": n, "boxes": encode_field(item.boxes.numpy(), np.float32),
                "features": encode_field(item.features.numpy(), np.float32)})
    return path
