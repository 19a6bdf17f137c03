"""Helpers the format readers share: entries, base64 array fields of TSV rows, record validation.

Every error names the file, the line (or the .npz file) and the field at fault.
"""
from __future__ import annotations

import base64
import binascii
import csv
import os
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import sources
from ..errors import RegionFeatureError
from ..sources import Source
from ..store import RegionFeatures

TRUNCATED = "the row is truncated or corrupt"


@dataclass
class Entry:
    """One image of an input, not decoded yet: ``load()`` decodes and validates it.

    ``place`` (``/data/a.tsv, line 3``, or an .npz path) is where error messages point, and
    the origin the store records for the image; ``name`` the source's name of the image, if
    it has one (``image_id`` is then ``names.numeric_id(name)``)."""

    image_id: int
    place: str
    load: Callable[[], RegionFeatures]
    name: Optional[str] = None


def absolute(path) -> Path:
    """``path`` made absolute (not resolved): places stay the same whatever the working directory."""
    return Path(os.path.abspath(path))


def tsv_rows(source: Source, fieldnames: Sequence[str]) -> Iterator[Tuple[int, dict]]:
    """(line number, row dict) of the headerless TSV ``source`` (``sources.text_input``: a file, a
    zip member or a stream, read once; gzip decompressed), whose fields can be hundreds of kB long
    (blank lines are skipped, and counted).

    A short row (a truncated download) is an error naming the input and the line; so is an
    input without a single row, or one that cannot be read (a truncated .gz)."""
    csv.field_size_limit(sys.maxsize)
    where = sources.label(source)
    rows = 0
    with sources.open_text(source) as handle:
        reader = csv.DictReader(handle, delimiter="\t", fieldnames=list(fieldnames))
        try:
            for row in reader:
                line = reader.line_num
                if row.get(fieldnames[-1]) is None or None in row:
                    raise RegionFeatureError(f"{where}, line {line}: expected the {len(fieldnames)} tab-separated "
                                             f"fields {list(fieldnames)}; the line is truncated or not in this format")
                rows += 1
                yield line, row
        except (OSError, EOFError, zlib.error, zipfile.BadZipFile, UnicodeDecodeError, csv.Error) as err:
            raise RegionFeatureError(f"{where}, line {reader.line_num + 1}: cannot be read ({err}); the input is "
                                     f"truncated or corrupt") from err
    if not rows:
        empty = "the stream ended before its first line" if source.get("stream") else "the file holds only blank lines"
        raise RegionFeatureError(f"{where}: no rows ({empty}); expected one image per line with the fields "
                                 f"{list(fieldnames)}")


def decode_field(row: dict, field: str, dtype, where: str) -> np.ndarray:
    """A base64 field as a flat array of ``dtype``."""
    try:
        raw = base64.b64decode(row[field], validate=True)
    except (binascii.Error, ValueError) as err:
        raise RegionFeatureError(f"{where}: field {field!r} is not valid base64 ({err}); {TRUNCATED}") from None
    size = np.dtype(dtype).itemsize
    if len(raw) % size:
        raise RegionFeatureError(f"{where}: field {field!r} decodes to {len(raw)} bytes, not a whole number of "
                                 f"{size}-byte {np.dtype(dtype).name} values; {TRUNCATED}")
    return np.frombuffer(raw, dtype=dtype)


def feature_rows(values: np.ndarray, count: int, feature_dim: Optional[int], where: str, field: str,
                 first: bool) -> np.ndarray:
    """Flat ``values`` as ``count`` feature rows, checked by ``check_width``."""
    if values.size % count:
        raise RegionFeatureError(f"{where}: field {field!r} holds {values.size} float32 values, not {count} rows "
                                 f"(num_boxes) of equal width; {TRUNCATED}")
    return check_width(values.reshape(count, -1), feature_dim, where, field, first)


def check_width(features: np.ndarray, feature_dim: Optional[int], where: str, field: str, first: bool) -> np.ndarray:
    """``features`` [N, D], if D is ``feature_dim`` (or that is None).

    Another width is a truncated record unless the record is the input's first (``first``):
    then the whole input may hold features of that width."""
    count, width = features.shape
    if feature_dim is None or width == feature_dim:
        return features
    found = (f"{where}: field {field!r} holds {count} x {width} values, expected {count} x {feature_dim} "
             f"({count} regions of --feature-dim {feature_dim})")
    if first:
        raise RegionFeatureError(f"{found}; if this input holds {width}-d features, convert it with "
                                 f"--feature-dim {width} into a new --output")
    raise RegionFeatureError(f"{found}, as the records before it; {TRUNCATED}")


def encode_field(array: np.ndarray, dtype) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


def int_field(row: dict, field: str, where: str) -> int:
    try:
        return int(row[field])
    except (TypeError, ValueError):
        raise RegionFeatureError(f"{where}: field {field!r} is {row[field]!r}, expected an integer") from None


def record(image_id: int, features: np.ndarray, boxes: np.ndarray, height: int, width: int, where: str,
           fields: Tuple[str, str] = ("features", "boxes"), name: Optional[str] = None) -> RegionFeatures:
    """A validated ``RegionFeatures`` (float32 copies) from one input record; ``fields`` name
    the features and boxes in the input, for the messages."""
    if features.ndim != 2 or features.shape[0] < 1:
        raise RegionFeatureError(f"{where}: field {fields[0]!r} has shape {features.shape}, expected [N >= 1, D]")
    if boxes.shape != (features.shape[0], 4):
        raise RegionFeatureError(f"{where}: field {fields[1]!r} has shape {boxes.shape}, expected "
                                 f"({features.shape[0]}, 4) to match the {features.shape[0]} rows of {fields[0]!r}")
    if height < 1 or width < 1:
        raise RegionFeatureError(f"{where}: image size {height}x{width} (height x width) must be positive")
    return RegionFeatures(image_id=int(image_id), features=torch.from_numpy(np.array(features, dtype=np.float32)),
                          boxes=torch.from_numpy(np.array(boxes, dtype=np.float32)),
                          image_size=(int(height), int(width)), name=name)


def tsv_record(row: dict, image_id: int, where: str, size_fields: Tuple[str, str], feature_dim: Optional[int],
               first: bool, name: Optional[str] = None) -> RegionFeatures:
    """One bottom-up-style TSV row (``num_boxes``, base64 float32 ``boxes`` and ``features``,
    the image size under the format's own (height, width) field names) as validated ``RegionFeatures``."""
    where = f"{where} (image id {image_id})"
    count = int_field(row, "num_boxes", where)
    if count < 1:
        raise RegionFeatureError(f"{where}: field 'num_boxes' is {count}, expected at least 1 region")
    boxes = decode_field(row, "boxes", np.float32, where)
    if boxes.size != count * 4:
        raise RegionFeatureError(f"{where}: field 'boxes' holds {boxes.size} float32 values, expected num_boxes x 4 "
                                 f"= {count * 4}; {TRUNCATED}")
    features = feature_rows(decode_field(row, "features", np.float32, where), count, feature_dim, where, "features",
                            first)
    height, width = (int_field(row, field, where) for field in size_fields)
    return record(image_id, features, boxes.reshape(count, 4), height, width, where, name=name)


def scalar_int(data: dict, key: str, where: str) -> int:
    """The integer held by ``data[key]`` (a 0-d or one-element array)."""
    value = np.asarray(data[key])
    if value.size != 1 or value.dtype.kind not in "iuf":
        raise RegionFeatureError(f"{where}: field {key!r} has shape {value.shape} and dtype {value.dtype}, "
                                 f"expected a single integer")
    return int(value.reshape(()))


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
