"""Write region features into the HDF5 layout of ``layout.py``; resumable.

Images are buffered and appended in batches: features and boxes first, then the index
rows that make them visible. An interrupted conversion therefore leaves a file whose
index lists only complete images, and reopening it with the same path continues where
it stopped (``image_id in writer`` tells a converter what to skip).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Set, Union

import numpy as np
import torch

from . import layout
from .store import RegionFeatureError, check_layout, open_hdf5

PathLike = Union[str, os.PathLike]
ArrayLike = Union[np.ndarray, torch.Tensor]
#: Rows per HDF5 chunk of /features and /boxes. With 36 every image of the fixed-36 files
#: is exactly one chunk (read and checksummed once). ``benchmarks/features.py --chunk-rows
#: 16 36 64 128`` on 36 x 2048 float16, 2 shared cores under load: random reads from the page
#: cache ran 2,270 / 3,122 / 2,118 / 1,192 images/s. Chunks are not compressed: on synthetic
#: ReLU-like float16 features gzip (level 1) saved 30% of the file and lzf 12%, but random
#: reads fell from about 4,400 images/s to about 480 and 720.
CHUNK_ROWS = 36
#: Index rows per chunk (image ids, offsets, sizes).
INDEX_CHUNK = 4096
DTYPES = ("float16", "float32")


def _as_numpy(value: ArrayLike) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


class RegionFeatureWriter:
    """Append the regions of many images to one HDF5 file.

    >>> with RegionFeatureWriter("feats.h5") as writer:
    ...     if 42 not in writer:
    ...         writer.add(42, features, boxes, image_height=480, image_width=640)

    ``dtype`` is the storage type of the features ("float16" halves the size; values must
    stay within +-65504). Reopening an existing file resumes it; its feature dimension and
    dtype must match.
    """

    def __init__(self, path: PathLike, feature_dim: int = 2048, dtype: str = "float16",
                 chunk_rows: int = CHUNK_ROWS, buffer_rows: int = 8192):
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: choose one of {DTYPES}")
        if feature_dim < 1 or chunk_rows < 1 or buffer_rows < 1:
            raise ValueError(f"feature_dim ({feature_dim}), chunk_rows ({chunk_rows}) and buffer_rows "
                             f"({buffer_rows}) must be positive")
        self.path = Path(path)
        self.feature_dim = feature_dim
        self.dtype = np.dtype(dtype)
        self.chunk_rows = chunk_rows
        self.buffer_rows = buffer_rows
        self._file = None
        self._ids: Set[int] = set()
        self._pending: List[tuple] = []
        self._pending_rows = 0

    def __enter__(self) -> "RegionFeatureWriter":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open_hdf5(self.path, "a")
        try:
            if layout.FEATURES in self._file:
                self._resume()
            elif len(self._file) or len(self._file.attrs):
                raise RegionFeatureError(f"{self.path}: an HDF5 file that is not a region-feature file (it holds "
                                         f"{sorted(self._file)[:5]}); write to another path")
            else:
                self._create()
        except BaseException:
            self._file.close()
            self._file = None
            raise

    def _create(self) -> None:
        file, dim = self._file, self.feature_dim
        file.attrs.update(format=layout.FORMAT, version=layout.VERSION, feature_dim=dim)
        rows = self.chunk_rows
        file.create_dataset(layout.FEATURES, shape=(0, dim), maxshape=(None, dim), dtype=self.dtype,
                            chunks=(rows, dim), fletcher32=True)
        file.create_dataset(layout.BOXES, shape=(0, 4), maxshape=(None, 4), dtype=np.float32,
                            chunks=(rows, 4), fletcher32=True)
        for name, dtype, shape in ((layout.IMAGE_IDS, np.int64, ()), (layout.FIRST_REGION, np.int64, ()),
                                   (layout.NUM_REGIONS, np.int32, ()), (layout.IMAGE_SIZE, np.int32, (2,))):
            file.create_dataset(name, shape=(0,) + shape, maxshape=(None,) + shape, dtype=dtype,
                                chunks=(INDEX_CHUNK,) + shape, fletcher32=True)

    def _resume(self) -> None:
        file = self._file
        if all(name in file for name in layout.INDEX):  # an interrupted flush may leave index columns uneven
            complete = min(file[name].shape[0] for name in layout.INDEX)
            for name in layout.INDEX:
                file[name].resize(complete, axis=0)
        dim = check_layout(file, self.path)
        stored = np.dtype(file[layout.FEATURES].dtype)
        if dim != self.feature_dim or stored != self.dtype:
            raise RegionFeatureError(f"{self.path}: existing file stores {dim}-d {stored} features, this writer "
                                     f"was asked for {self.feature_dim}-d {self.dtype}; pass matching "
                                     f"feature_dim/dtype or write to a new path")
        self._ids = set(int(i) for i in file[layout.IMAGE_IDS][:])
        count = file[layout.NUM_REGIONS]
        end = int(file[layout.FIRST_REGION][-1] + count[-1]) if len(count) else 0
        # rows written by an interrupted run after its last indexed image are dropped
        file[layout.FEATURES].resize(end, axis=0)
        file[layout.BOXES].resize(end, axis=0)

    def __contains__(self, image_id) -> bool:
        return int(image_id) in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, image_id: int, features: ArrayLike, boxes: ArrayLike, image_height: int, image_width: int) -> None:
        """Queue one image: ``features`` [N, D], ``boxes`` [N, 4] (x1, y1, x2, y2 pixels)."""
        if self._file is None:
            raise RuntimeError(f"{self.path}: the writer is not open; use it as a context manager")
        image_id = int(image_id)
        where = f"{self.path}: image id {image_id}"
        if image_id in self._ids:
            raise RegionFeatureError(f"{where} is already stored; skip ids with `image_id in writer`")
        features, boxes = _as_numpy(features), _as_numpy(boxes)
        if features.ndim != 2 or features.shape[1] != self.feature_dim or features.shape[0] < 1:
            raise RegionFeatureError(f"{where}: features have shape {features.shape}, expected "
                                     f"[N >= 1, {self.feature_dim}]")
        if boxes.shape != (features.shape[0], 4):
            raise RegionFeatureError(f"{where}: boxes have shape {boxes.shape}, expected ({features.shape[0]}, 4)")
        if int(image_height) < 1 or int(image_width) < 1:
            raise RegionFeatureError(f"{where}: image size {image_height}x{image_width} must be positive")
        with np.errstate(over="ignore"):  # overflow becomes inf and is reported just below
            stored = features.astype(self.dtype)
        if not np.isfinite(stored).all():
            hint = " (float16 overflows above 65504: use dtype='float32')" if np.isfinite(features).all() else ""
            raise RegionFeatureError(f"{where}: features contain NaN or infinity{hint}")
        if not np.isfinite(boxes).all():
            raise RegionFeatureError(f"{where}: boxes contain NaN or infinity")
        self._pending.append((image_id, stored, boxes.astype(np.float32), (int(image_height), int(image_width))))
        self._ids.add(image_id)
        self._pending_rows += len(stored)
        if self._pending_rows >= self.buffer_rows:
            self.flush()

    def flush(self) -> None:
        """Write the queued images: regions first, then the index rows that publish them."""
        if not self._pending:
            return
        file = self._file
        features, boxes = file[layout.FEATURES], file[layout.BOXES]
        start = features.shape[0]
        counts = np.array([len(item[1]) for item in self._pending], dtype=np.int64)
        end = start + int(counts.sum())
        features.resize(end, axis=0)
        features[start:end] = np.concatenate([item[1] for item in self._pending])
        boxes.resize(end, axis=0)
        boxes[start:end] = np.concatenate([item[2] for item in self._pending])
        first = start + np.concatenate([[0], np.cumsum(counts)[:-1]])
        columns = {layout.IMAGE_IDS: [item[0] for item in self._pending], layout.FIRST_REGION: first,
                   layout.NUM_REGIONS: counts, layout.IMAGE_SIZE: [item[3] for item in self._pending]}
        for name, values in columns.items():
            dataset = file[name]
            old = dataset.shape[0]
            dataset.resize(old + len(self._pending), axis=0)
            dataset[old:] = np.asarray(values, dtype=dataset.dtype)
        file.flush()
        self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        if self._file is not None:
            try:
                self.flush()
            finally:
                self._file.close()
                self._file = None
