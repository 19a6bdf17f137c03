"""Read region features from the HDF5 layout of ``layout.py``, lazily, one image at a time.

``RegionFeatureStore(path)`` reads the small index (image ids, names, offsets, sizes)
once, on construction, and opens the file for feature reads on first access in each
process, so a store built in the main process is safe to hand to DataLoader workers
(forked or spawned: the open handle is never pickled or shared).

The store opens only files marked complete: a conversion that stopped midway, or a file
written before completeness was recorded (layout version 1), is refused with what to do.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple, Union

import h5py
import numpy as np
import torch

from . import layout, sources
from .errors import MissingImageError, RegionFeatureError
from .names import numeric_id

__all__ = ["MissingImageError", "RegionFeatureError", "RegionFeatureStore", "RegionFeatures", "check_layout",
           "open_hdf5"]

PathLike = Union[str, os.PathLike]
ImageKey = Union[int, str]
#: Elements converted per torch call: below torch's intra-op grain (32768), so the copy
#: runs on the calling thread. Waking the thread pool for every image made the float16 ->
#: float32 conversion of a 36 x 2048 image 4.5x slower on a loaded 2-core machine.
CONVERT_BLOCK = 16384
REBUILD = "delete it and re-run scripts/convert_features.py (or extract_features.py)"


@dataclass
class RegionFeatures:
    """The detected regions of one image: ``features`` [N, D] (float32 unless the store was
    asked for float16), ``boxes`` [N, 4] float32 as (x1, y1, x2, y2) in pixels,
    ``image_size`` as (height, width); ``name`` the source's name of the image, if it had
    one (``image_id`` is then ``names.numeric_id(name)``)."""

    image_id: int
    features: torch.Tensor
    boxes: torch.Tensor
    image_size: Tuple[int, int]
    name: Optional[str] = None

    @property
    def num_regions(self) -> int:
        return int(self.features.shape[0])


def open_hdf5(path: Path, mode: str, **options) -> h5py.File:
    """``h5py.File`` whose failure to open names the file and says what to do.

    A partial file that a writer has open, or left open when it was killed, is opened for
    reading in SWMR mode (``partial.py``), so that its state can be reported."""
    try:
        return h5py.File(path, mode, **options)
    except FileNotFoundError:
        partial = layout.partial_path(path)
        if partial.exists():
            raise RegionFeatureError(f"{path}: not written yet: the conversion writing it stopped before the end and "
                                     f"its work so far is in {partial}; re-run the same command to resume") from None
        raise RegionFeatureError(f"{path}: no such region-feature file; create it with "
                                 f"scripts/convert_features.py or scripts/extract_features.py") from None
    except OSError as err:
        if mode == "r" and "already open for write" in str(err):
            try:
                return h5py.File(path, "r", swmr=True, libver=layout.LIBVER)
            except OSError:
                pass
        if "already open" in str(err) or "unable to lock file" in str(err):
            raise RegionFeatureError(f"{path}: cannot open with mode {mode!r} ({err}); the file is open elsewhere "
                                     f"(HDF5 allows no writer beside readers, and one writer at a time): close its "
                                     f"RegionFeatureStore, or wait for the other conversion writing it") from err
        raise RegionFeatureError(f"{path}: cannot open as HDF5 ({err}); the file is truncated, corrupt or not "
                                 f"HDF5; {REBUILD}") from err


def legacy_message(path: Path) -> str:
    return (f"{path}: written by an earlier version of the suite (layout version {layout.LEGACY_VERSION}), which did "
            f"not record whether its conversion finished, so it may hold only part of its inputs. Re-run the command "
            f"that wrote it with --append: the images already stored are kept, missing ones are added and the store "
            f"is marked complete. If you know it is complete, mark it so with: python scripts/convert_features.py "
            f"mark-complete {path}")


def check_layout(file: h5py.File, path: Path, legacy: bool = False) -> int:
    """Validate the datasets and attributes of ``layout.py`` (of version 1 too when ``legacy``);
    returns the feature dimension."""
    if file.attrs.get("format") != layout.FORMAT:
        raise RegionFeatureError(f"{path}: attribute 'format' is {file.attrs.get('format')!r}, expected "
                                 f"{layout.FORMAT!r}: not a region-feature file; {REBUILD}")
    version = int(file.attrs.get("version", -1))
    if version == layout.LEGACY_VERSION and not legacy:
        raise RegionFeatureError(legacy_message(path))
    if version not in (layout.VERSION, layout.LEGACY_VERSION):
        raise RegionFeatureError(f"{path}: attribute 'version' is {file.attrs.get('version')!r}, this code reads "
                                 f"version {layout.VERSION}; {REBUILD}")
    index = layout.INDEX if version == layout.VERSION else layout.LEGACY_INDEX
    missing = [name for name in (layout.FEATURES, layout.BOXES) + index if name not in file]
    if version == layout.VERSION:
        missing += [name for name in (layout.SOURCES, layout.COMMITTED) if name not in file]
    if missing:
        raise RegionFeatureError(f"{path}: dataset(s) {missing} missing; {REBUILD}")
    dim = int(file.attrs["feature_dim"])
    features, boxes = file[layout.FEATURES], file[layout.BOXES]
    if features.ndim != 2 or features.shape[1] != dim:
        raise RegionFeatureError(f"{path}: dataset 'features' has shape {features.shape}, expected [R, {dim}]; "
                                 f"{REBUILD}")
    if boxes.shape != (features.shape[0], 4):
        raise RegionFeatureError(f"{path}: dataset 'boxes' has shape {boxes.shape}, expected "
                                 f"({features.shape[0]}, 4) like 'features'; {REBUILD}")
    count = file[layout.IMAGE_IDS].shape[0]
    for name in index:
        if file[name].shape[0] != count:
            raise RegionFeatureError(f"{path}: index dataset {name!r} has {file[name].shape[0]} rows but "
                                     f"'image_ids' has {count}; {REBUILD}")
    return dim


def check_complete(file: h5py.File, path: Path) -> None:
    """Refuse a file whose writer has not finished (``complete`` unset) or whose image count disagrees."""
    count = file[layout.IMAGE_IDS].shape[0]
    if not file.attrs.get(layout.COMPLETE, False):
        raise RegionFeatureError(f"{path}: not marked complete: the conversion (or extraction) writing it stopped "
                                 f"before the end, with {layout.committed(file)} images so far. Re-run the same "
                                 f"command to resume; it publishes {layout.final_path(path)} when done")
    recorded = int(file.attrs.get(layout.NUM_IMAGES, -1))
    if recorded != count:
        raise RegionFeatureError(f"{path}: attribute 'num_images' is {recorded} but the index lists {count} images; "
                                 f"the file is corrupt; {REBUILD}")


def read_sources(file: h5py.File, path: Path) -> List[dict]:
    """The inputs recorded in ``/sources`` (empty for a version-1 file)."""
    if layout.SOURCES not in file:
        return []
    return sources.loads(file[layout.SOURCES].asstr()[()], str(path))


def read_options(file: h5py.File, path: Path) -> dict:
    """The options that shaped the content (``layout.OPTIONS``); for a file that did not record
    them, the dtype and feature_dim of its datasets."""
    derived = {"dtype": np.dtype(file[layout.FEATURES].dtype).name, "feature_dim": int(file.attrs["feature_dim"])}
    try:
        recorded = json.loads(file.attrs.get(layout.OPTIONS, "{}"))
    except json.JSONDecodeError as err:
        raise RegionFeatureError(f"{path}: attribute 'options' is not JSON ({err}); the file is corrupt; "
                                 f"{REBUILD}") from None
    return {**derived, **recorded}


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


def image_key(key: ImageKey) -> int:
    """The numeric id of ``key``: an int as is, a name by ``names.numeric_id``."""
    return numeric_id(key) if isinstance(key, str) else int(key)


class RegionFeatureStore:
    """Random access to the region features of many images in one HDF5 file.

    >>> store = RegionFeatureStore("coco_trainval_36.h5")
    >>> item = store[273052]          # RegionFeatures, features as float32
    >>> item = store["COCO_val2014_000000273052"]    # by name: the same image
    >>> item = store["train-10171-0-img0"]           # NLVR2 (a store converted from LXMERT's TSV)

    ``dtype=torch.float16`` returns the features as a float16 file stores them: half the
    bytes for DataLoader workers to send to the main process (convert on the device).
    ``sources`` lists the inputs the file was converted from (path, format, bytes), ``options``
    the options that shaped it (``{"dtype": "float16", "feature_dim": 2048}``, plus the region
    limits of an extraction).
    """

    def __init__(self, path: PathLike, dtype: torch.dtype = torch.float32):
        if dtype not in (torch.float32, torch.float16):
            raise ValueError(f"dtype={dtype}: choose torch.float32 or torch.float16")
        self.path = Path(path)
        self.features_dtype = dtype
        with open_hdf5(self.path, "r") as file:
            self.feature_dim = check_layout(file, self.path)
            check_complete(file, self.path)
            self.stored_dtype = np.dtype(file[layout.FEATURES].dtype)
            self.sources = read_sources(file, self.path)
            self.options = read_options(file, self.path)
            total_rows = file[layout.FEATURES].shape[0]
            try:
                self._ids = file[layout.IMAGE_IDS][:].astype(np.int64)
                self._first = file[layout.FIRST_REGION][:].astype(np.int64)
                self._count = file[layout.NUM_REGIONS][:].astype(np.int64)
                self._size = file[layout.IMAGE_SIZE][:].astype(np.int64)
                self._names = file[layout.IMAGE_NAMES].asstr()[:]
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

    def __contains__(self, key: ImageKey) -> bool:
        return image_key(key) in self._row

    @property
    def image_ids(self) -> List[int]:
        return self._ids.tolist()

    @property
    def image_names(self) -> List[str]:
        """The source's name of each image, in the order of ``image_ids`` ("" for an unnamed one)."""
        return self._names.tolist()

    def num_regions(self, key: ImageKey) -> int:
        """The number of regions of image ``key`` (id or name), from the index (no feature read)."""
        return int(self._count[self._lookup(key)])

    def __getitem__(self, key: ImageKey) -> RegionFeatures:
        row = self._lookup(key)
        image_id = int(self._ids[row])
        start, stop = int(self._first[row]), int(self._first[row] + self._count[row])
        features_data, boxes_data = self._datasets()
        try:
            features = features_data[start:stop]
            boxes = boxes_data[start:stop]
        except OSError as err:
            raise RegionFeatureError(f"{self.path}: the features of image id {image_id} cannot be read "
                                     f"({err}); the file is corrupt; rebuild it with "
                                     f"scripts/convert_features.py") from err
        height, width = (int(v) for v in self._size[row])
        return RegionFeatures(image_id=image_id, features=_convert(features, self.features_dtype),
                              boxes=torch.from_numpy(boxes.astype(np.float32, copy=False)),
                              image_size=(height, width), name=self._names[row] or None)

    def _lookup(self, key: ImageKey) -> int:
        try:
            return self._row[image_key(key)]
        except KeyError:
            what = f"image {key!r} (id {image_key(key)})" if isinstance(key, str) else f"image id {int(key)}"
            raise MissingImageError(f"{self.path}: no features for {what} ({len(self)} images stored); convert "
                                    f"or extract the features of that image into this file") from None

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
