"""The on-disk layout of a region-feature file (HDF5), shared by the writer and the store.

One file holds every image, ragged: the regions of all images are concatenated along
dim 0 and an index says where each image's rows start and how many there are::

    /features     [R, D]  float16 (or float32), chunked by rows, Fletcher-32 checksummed
    /boxes        [R, 4]  float32, (x1, y1, x2, y2) in pixels
    /image_ids    [M]     int64   (``names.numeric_id`` of the name when the source had names)
    /first_region [M]     int64   row of the image's first region in /features
    /num_regions  [M]     int32
    /image_size   [M, 2]  int32   (height, width)
    /image_names  [M]     str     the source's name of the image (LXMERT ``img_id``, an MCAN or
                                  image file stem); "" when the source gave only a number
    /origins      [M]     str     where the image came from (``/data/a.tsv, line 3``); "" if unknown
    /sources      scalar  str     JSON list of the inputs: {"path", "format", "bytes"[, "files"]}
    /committed    [1]     int64   images whose regions and index rows are fully written
    attrs: format, version, feature_dim, complete, num_images,
           options  JSON object of the options that shaped the content: dtype, feature_dim and,
                    for an extraction, the region limits (min_boxes, max_boxes, conf_thresh, nms_thresh)

Files use HDF5's 1.10 format (``LIBVER``), which the writer's single-writer/multiple-reader
mode needs; HDF5 libraries from 1.10 on read them. A writer works on ``<path>.partial``
(``partial_path``), with ``complete`` false, and renames it to ``<path>`` only after setting
``complete`` and ``num_images``: a file under its final name is whole. In a partial file
left by a killed run, index rows past ``committed`` and regions past the last committed
image are not part of its content (the writer drops them when it resumes).

A version-2 file written before ``options`` was recorded has only the dtype and feature_dim
of its datasets as options (``store.read_options``).

Version 1 (before completeness was recorded) had no names, origins, sources, committed,
``complete`` or ``num_images``: the store refuses it; ``writer.mark_complete`` or an append
(``--append``) rewrites it as version 2.
"""
from pathlib import Path

import h5py
import numpy as np

FORMAT = "attention-suite/region-features"
VERSION = 2
LEGACY_VERSION = 1
FEATURES = "features"
BOXES = "boxes"
IMAGE_IDS = "image_ids"
FIRST_REGION = "first_region"
NUM_REGIONS = "num_regions"
IMAGE_SIZE = "image_size"
IMAGE_NAMES = "image_names"
ORIGINS = "origins"
SOURCES = "sources"
COMMITTED = "committed"
#: HDF5 format bounds: SWMR writing needs at least the 1.10 format, and 1.10 libraries can read it.
LIBVER = ("v110", "latest")
INDEX = (IMAGE_IDS, FIRST_REGION, NUM_REGIONS, IMAGE_SIZE, IMAGE_NAMES, ORIGINS)
LEGACY_INDEX = INDEX[:4]
COMPLETE = "complete"
NUM_IMAGES = "num_images"
OPTIONS = "options"
PARTIAL_SUFFIX = ".partial"
#: Index rows per chunk (image ids, offsets, sizes, names, origins).
INDEX_CHUNK = 4096
_NUMERIC_INDEX = ((IMAGE_IDS, np.int64, ()), (FIRST_REGION, np.int64, ()), (NUM_REGIONS, np.int32, ()),
                  (IMAGE_SIZE, np.int32, (2,)))


def partial_path(path: Path) -> Path:
    """Where a writer builds ``path`` before publishing it: ``path`` + ``.partial``."""
    return path.with_name(path.name + PARTIAL_SUFFIX)


def final_path(path: Path) -> Path:
    """``path`` without the ``.partial`` suffix (``path`` itself if it has none)."""
    return path.with_name(path.name[: -len(PARTIAL_SUFFIX)]) if path.name.endswith(PARTIAL_SUFFIX) else path


def committed(file: h5py.File) -> int:
    """The number of whole images in ``file`` (every indexed image of a version-1 file)."""
    if COMMITTED in file:
        return int(file[COMMITTED][0])
    return int(file[IMAGE_IDS].shape[0])


def create(file: h5py.File, feature_dim: int, dtype: np.dtype, chunk_rows: int) -> None:
    """The empty datasets and attributes of an incomplete version-2 file."""
    file.attrs.update(format=FORMAT, version=VERSION, feature_dim=feature_dim, complete=False, num_images=0)
    file.create_dataset(FEATURES, shape=(0, feature_dim), maxshape=(None, feature_dim), dtype=dtype,
                        chunks=(chunk_rows, feature_dim), fletcher32=True)
    file.create_dataset(BOXES, shape=(0, 4), maxshape=(None, 4), dtype=np.float32, chunks=(chunk_rows, 4),
                        fletcher32=True)
    for name, column_dtype, shape in _NUMERIC_INDEX:
        file.create_dataset(name, shape=(0,) + shape, maxshape=(None,) + shape, dtype=column_dtype,
                            chunks=(INDEX_CHUNK,) + shape, fletcher32=True)
    for name in (IMAGE_NAMES, ORIGINS):  # variable-length strings take no Fletcher-32 filter in HDF5
        file.create_dataset(name, shape=(0,), maxshape=(None,), dtype=h5py.string_dtype(), chunks=(INDEX_CHUNK,),
                            fillvalue="")
    file.create_dataset(SOURCES, data="[]", dtype=h5py.string_dtype())
    file.create_dataset(COMMITTED, data=np.zeros(1, dtype=np.int64))

