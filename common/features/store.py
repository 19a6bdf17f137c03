"""Read region features from the HDF5 layout of ``layout.py``, lazily, one image at a time.

``RegionFeatureStore(path)`` reads the small index (image ids, offsets, sizes) once, on
construction, and opens the file for feature reads on first access in each process, so
a store built in the main process is safe to hand to DataLoader workers (forked or
spawned: the open handle is never pickled or shared).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple, Union

import h5py
import numpy as np
import torch

from . import layout

PathLike = Union[str, os.PathLike]
#: Elements converted per torch call: below torch's intra-op grain (32768), so the copy
#: runs on the calling thread. Waking the thread pool for every image made the float16 ->
#: float32 conversion of a 36 x 2048 image 4.5x slower on a loaded 2-core machine.
CONVERT_BLOCK = 16384


class RegionFeatureError(ValueError):
    """A region-feature file (or an input file being converted) is missing, corrupt or malformed."""


class MissingImageError(RegionFeatureError, KeyError):
    """The store has no features for the requested image id."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


@dataclass
class RegionFeatures:
    """The detected regions of one image: ``features`` [N, D] (float32 unless the store was
    asked for float16), ``boxes`` [N, 4] float32 as (x1, y1, x2, y2) in pixels,
    ``image_size`` as (height, width)."""

    image_id: int
    features: torch.Tensor
    boxes: torch.Tensor
    image_size: Tuple[int, int]

    @property
    def num_regions(self) -> int:
        return int(self.features.shape[0])


def open_hdf5(path: Path, mode: str) -> h5py.File:
    """``h5py.File`` whose failure to open names the file and says what to do."""
    try:
        return h5py.File(path, mode)
    except FileNotFoundError:
        raise RegionFeatureError(f"{path}: no such region-feature file; create it with "
                                 f"scripts/convert_features.py or scripts/extract_features.py") from None
    except OSError as err:
        if "already open" in str(err) or "lock file" in str(err):
            raise RegionFeatureError(f"{path}: cannot open with mode {mode!r} ({err}); the file is open elsewhere "
                                     f"(HDF5 allows no writer beside readers): close its RegionFeatureStore or "
                                     f"writer first") from err
        raise RegionFeatureError(f"{path}: cannot open as HDF5 ({err}); the file is truncated, corrupt or not "
                                 f"HDF5; delete it and re-run scripts/convert_features.py (or extract_features.py)"
                                 ) from err


def check_layout(file: h5py.File, path: Path) -> int:
    """Validate the datasets and attributes of ``layout.py``; returns the feature dimension."""
    fix = "delete it and re-run scripts/convert_features.py (or extract_features.py)"
    if file.attrs.get("format") != layout.FORMAT:
        raise RegionFeatureError(f"{path}: attribute 'format' is {file.attrs.get('format')!r}, expected "
                                 f"{layout.FORMAT!r}: not a region-feature file; {fix}")
    if int(file.attrs.get("version", -1)) != layout.VERSION:
        raise RegionFeatureError(f"{path}: attribute 'version' is {file.attrs.get('version')!r}, this code reads "
                                 f"version {layout.VERSION}; {fix}")
    missing = [name for name in (layout.FEATURES, layout.BOXES) + layout.INDEX if name not in file]
    if missing:
        raise RegionFeatureError(f"{path}: dataset(s) {missing} missing; {fix}")
    dim = int(file.attrs["feature_dim"])
    features, boxes = file[layout.FEATURES], file[layout.BOXES]
    if features.ndim != 2 or features.shape[1] != dim:
        raise RegionFeatureError(f"{path}: dataset 'features' has shape {features.shape}, expected [R, {dim}]; {fix}")
    if boxes.shape != (features.shape[0], 4):
        raise RegionFeatureError(f"{path}: dataset 'boxes' has shape {boxes.shape}, expected "
                                 f"({features.shape[0]}, 4) like 'features'; {fix}")
    count = file[layout.IMAGE_IDS].shape[0]
    for name in layout.INDEX:
        if file[name].shape[0] != count:
            raise RegionFeatureError(f"{path}: index dataset {name!r} has {file[name].shape[0]} rows but "
                                     f"'image_ids' has {count}; {fix}")
    return dim


def _convert(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``array`` [N, D] as a ``dtype`` tensor, converted in blocks of at most ``CONVERT_BLOCK`` elements."""
    source = torch.from_numpy(array)
    if source.dtype == dtype:
        return source
    out = torch.empty(source.shape, dtype=dtype)
    rows = max(1, CONVERT_BLOCK // max(1, source.shape[1]))
    for start in range(0, source.shape[0], rows):
        out[start:start + rows].copy_(source[start:start + rows])
    return out


class RegionFeatureStore:
    """Random access to the region features of many images in one HDF5 file.

    >>> store = RegionFeatureStore("coco_trainval_36.h5")
    >>> item = store[273052]          # RegionFeatures, features as float32

    ``dtype=torch.float16`` returns the features as a float16 file stores them: half the
    bytes for DataLoader workers to send to the main process (convert on the device).
    """

    def __init__(self, path: PathLike, dtype: torch.dtype = torch.float32):
        if dtype not in (torch.float32, torch.float16):
            raise ValueError(f"dtype={dtype}: choose torch.float32 or torch.float16")
        self.path = Path(path)
        self.features_dtype = dtype
        with open_hdf5(self.path, "r") as file:
            self.feature_dim = check_layout(file, self.path)
            self.stored_dtype = np.dtype(file[layout.FEATURES].dtype)
            total_rows = file[layout.FEATURES].shape[0]
            try:
                self._ids = file[layout.IMAGE_IDS][:].astype(np.int64)
                self._first = file[layout.FIRST_REGION][:].astype(np.int64)
                self._count = file[layout.NUM_REGIONS][:].astype(np.int64)
                self._size = file[layout.IMAGE_SIZE][:].astype(np.int64)
            except OSError as err:
                raise RegionFeatureError(f"{self.path}: the image index cannot be read ({err}); the file is "
                                         f"corrupt; rebuild it with scripts/convert_features.py") from err
        self._row = {int(image_id): row for row, image_id in enumerate(self._ids)}
        if len(self._row) != len(self._ids):
            raise RegionFeatureError(f"{self.path}: dataset 'image_ids' repeats an image id; rebuild the file")
        beyond = np.flatnonzero((self._first < 0) | (self._count < 0) | (self._first + self._count > total_rows))
        if beyond.size:
            raise RegionFeatureError(f"{self.path}: image id {int(self._ids[beyond[0]])} points past the "
                                     f"{total_rows} stored regions; the file is truncated or corrupt; "
                                     f"rebuild it with scripts/convert_features.py")
        self._file = None
        self._pid = None
        self._open = None

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, image_id) -> bool:
        return int(image_id) in self._row

    @property
    def image_ids(self) -> List[int]:
        return self._ids.tolist()

    def num_regions(self, image_id: int) -> int:
        """The number of regions of ``image_id``, from the index (no feature read)."""
        return int(self._count[self._lookup(image_id)])

    def __getitem__(self, image_id: int) -> RegionFeatures:
        row = self._lookup(image_id)
        start, stop = int(self._first[row]), int(self._first[row] + self._count[row])
        features_data, boxes_data = self._datasets()
        try:
            features = features_data[start:stop]
            boxes = boxes_data[start:stop]
        except OSError as err:
            raise RegionFeatureError(f"{self.path}: the features of image id {int(image_id)} cannot be read "
                                     f"({err}); the file is corrupt; rebuild it with "
                                     f"scripts/convert_features.py") from err
        height, width = (int(v) for v in self._size[row])
        return RegionFeatures(image_id=int(image_id), features=_convert(features, self.features_dtype),
                              boxes=torch.from_numpy(boxes.astype(np.float32, copy=False)),
                              image_size=(height, width))

    def _lookup(self, image_id) -> int:
        try:
            return self._row[int(image_id)]
        except KeyError:
            raise MissingImageError(f"{self.path}: no features for image id {int(image_id)} "
                                    f"({len(self)} images stored); convert or extract the features of "
                                    f"that image into this file") from None

    def _datasets(self) -> Tuple[h5py.Dataset, h5py.Dataset]:
        """This process's open features and boxes (reopened after a fork: HDF5 handles are not fork-safe)."""
        if self._file is None or self._pid != os.getpid():
            self._file = open_hdf5(self.path, "r")
            self._pid = os.getpid()
            self._open = (self._file[layout.FEATURES], self._file[layout.BOXES])
        return self._open

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None
        self._open = None

    def __enter__(self) -> "RegionFeatureStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_file"], state["_pid"], state["_open"] = None, None, None
        return state

    def __repr__(self) -> str:
        return f"RegionFeatureStore({str(self.path)!r}, images={len(self)}, feature_dim={self.feature_dim})"
