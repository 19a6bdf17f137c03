"""Anderson et al.'s bottom-up TSV (``tools/generate_tsv.py``, read by ``tools/read_tsv.py``).

One image per line, tab-separated, no header: ``image_id, image_w, image_h, num_boxes,
boxes, features``; ``boxes`` and ``features`` are base64 of float32 arrays [num_boxes, 4]
and [num_boxes, D] (the ``trainval_36`` files have 36 boxes, the adaptive ones 10-100).
"""
from __future__ import annotations

import csv
import os
from functools import partial
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

import numpy as np

from ..sources import Source, label, text_input
from ..store import RegionFeatures
from ._common import Entry, encode_field, int_field, tsv_record, tsv_rows

FORMAT = "bottom-up-tsv"
FIELDNAMES = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
PathLike = Union[str, os.PathLike]


def source(path: PathLike, member: Optional[str] = None) -> Source:
    """The record of the input ``path`` (a file, ``.tsv.gz``, ``.zip`` (``member``), FIFO, pipe or
    ``-``); a missing, empty or directory path is an error."""
    return text_input(path, FORMAT, "a bottom-up TSV file", member)


def entries(tsv: Union[PathLike, Source], feature_dim: Optional[int] = None) -> Iterator[Entry]:
    """The images of one TSV (a path or its ``source`` record), in file order, read once;
    ``load()`` decodes a row, checking ``feature_dim``."""
    tsv = tsv if isinstance(tsv, dict) else source(tsv)
    for position, (line, row) in enumerate(tsv_rows(tsv, FIELDNAMES)):
        place = f"{label(tsv)}, line {line}"
        image_id = int_field(row, "image_id", place)
        yield Entry(image_id, place, partial(tsv_record, row, image_id, place, ("image_h", "image_w"), feature_dim,
                                             first=position == 0))


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
