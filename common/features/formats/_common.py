"""Helpers the format readers share: base64 array fields of TSV rows, record validation."""
from __future__ import annotations

import base64
import binascii
import csv
import re
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Tuple

import numpy as np
import torch

from ..store import RegionFeatureError, RegionFeatures

Skip = Callable[[int], bool]
_TRAILING_DIGITS = re.compile(r"(\d+)$")


def trailing_image_id(name: str) -> Optional[int]:
    """The image id at the end of a COCO-style name (``COCO_val2014_000000273052`` -> 273052), or None."""
    match = _TRAILING_DIGITS.search(name)
    return int(match.group(1)) if match else None


def never(image_id: int) -> bool:
    return False


def tsv_rows(path: Path, fieldnames: Sequence[str]) -> Iterator[Tuple[int, dict]]:
    """(line number, row dict) of a headerless TSV whose fields can be hundreds of kB long.

    A short row (a truncated download) is an error naming the file and the line."""
    csv.field_size_limit(sys.maxsize)
    try:
        handle = open(path, newline="")
    except FileNotFoundError:
        raise RegionFeatureError(f"{path}: no such feature file") from None
    with handle:
        for line, row in enumerate(csv.DictReader(handle, delimiter="\t", fieldnames=list(fieldnames)), start=1):
            if row.get(fieldnames[-1]) is None or None in row:
                raise RegionFeatureError(f"{path}, line {line}: expected the {len(fieldnames)} tab-separated fields "
                                         f"{list(fieldnames)}; the line is truncated or not in this format")
            yield line, row


def decode_field(row: dict, field: str, dtype, shape: Tuple[int, ...], where: str) -> np.ndarray:
    """A base64 field as an array of ``shape`` (-1 allowed once), e.g. boxes (N, 4) float32."""
    try:
        raw = base64.b64decode(row[field], validate=True)
    except (binascii.Error, ValueError) as err:
        raise RegionFeatureError(f"{where}: field {field!r} is not valid base64 ({err}); the file is corrupt") from None
    array = np.frombuffer(raw, dtype=dtype)
    try:
        return array.reshape(shape)
    except ValueError:
        raise RegionFeatureError(f"{where}: field {field!r} holds {array.size} {np.dtype(dtype).name} values, "
                                 f"which do not form shape {shape}; the row is truncated or corrupt") from None


def encode_field(array: np.ndarray, dtype) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


def int_field(row: dict, field: str, where: str) -> int:
    try:
        return int(row[field])
    except (TypeError, ValueError):
        raise RegionFeatureError(f"{where}: field {field!r} is {row[field]!r}, expected an integer") from None


def record(image_id: int, features: np.ndarray, boxes: np.ndarray, height: int, width: int,
           where: str) -> RegionFeatures:
    """A validated ``RegionFeatures`` (float32 copies) from one input record."""
    if features.ndim != 2 or features.shape[0] < 1:
        raise RegionFeatureError(f"{where}: features have shape {features.shape}, expected [N >= 1, D]")
    if boxes.shape != (features.shape[0], 4):
        raise RegionFeatureError(f"{where}: boxes have shape {boxes.shape}, expected ({features.shape[0]}, 4) "
                                 f"to match the {features.shape[0]} feature rows")
    if height < 1 or width < 1:
        raise RegionFeatureError(f"{where}: image size {height}x{width} (height x width) must be positive")
    return RegionFeatures(image_id=int(image_id), features=torch.from_numpy(np.array(features, dtype=np.float32)),
                          boxes=torch.from_numpy(np.array(boxes, dtype=np.float32)),
                          image_size=(int(height), int(width)))


def tsv_record(row: dict, image_id: int, where: str, height_field: str, width_field: str) -> RegionFeatures:
    """One bottom-up-style TSV row (``num_boxes``, base64 float32 ``boxes`` and ``features``,
    the image size under the format's own field names) as validated ``RegionFeatures``."""
    where = f"{where} (image id {image_id})"
    count = int_field(row, "num_boxes", where)
    boxes = decode_field(row, "boxes", np.float32, (count, 4), where)
    features = decode_field(row, "features", np.float32, (count, -1), where)
    height, width = int_field(row, height_field, where), int_field(row, width_field, where)
    return record(image_id, features, boxes, height, width, where)


def npz_arrays(path: Path, keys: Sequence[str]) -> dict:
    """The named arrays of a ``.npz`` file; a missing key or a broken file names the file."""
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [key for key in keys if key not in data.files]
            if missing:
                raise RegionFeatureError(f"{path}: key(s) {missing} missing (found {data.files})")
            return {key: data[key] for key in keys}
    except RegionFeatureError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise RegionFeatureError(f"{path}: cannot read the .npz ({err}); the file is truncated or corrupt") from err
