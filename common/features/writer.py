"""Write region features into the HDF5 layout of ``layout.py``: build aside, then publish; resumable.

A writer for ``out.h5`` works on ``out.h5.partial`` (``partial.py``: locked, safe to kill)
and renames it to ``out.h5`` only on a clean close, after marking it complete, so a file
under the final name is always whole. Images are buffered and appended in batches; a batch
counts (``/committed``) once its regions and index rows are flushed. Opening a writer again
continues the partial file from its committed images; ``already_stored`` tells a converter
what to skip, and reports an image id met at two places.

The file records the options that shaped it (``options``: dtype, feature_dim, and any others
the caller names, such as an extraction's region limits). Adding to a finished file needs
``append=True`` and the same options: the writer copies its images into the partial file and
publishes that, so the original stays whole and readable until the rename. ``overwrite=True``
rebuilds it from these inputs alone, published by the same rename.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, List, Mapping, Optional, Union

import h5py
import numpy as np
import torch

from . import layout
from .errors import RegionFeatureError
from .names import numeric_id
from .partial import WriterLock, new_file, open_for_writing, open_killed, replace, staging_path
from .sources import Source, describe, dumps, merge, unrecorded
from .store import check_layout, open_hdf5, read_options, read_sources

PathLike = Union[str, os.PathLike]
ArrayLike = Union[np.ndarray, torch.Tensor]
#: Rows per HDF5 chunk of /features and /boxes. With 36 every image of the fixed-36 files
#: is exactly one chunk (read and checksummed once). ``benchmarks/features.py --chunk-rows
#: 16 36 64 128`` on 36 x 2048 float16, 2 shared cores under load: random reads from the page
#: cache ran 2,270 / 3,122 / 2,118 / 1,192 images/s. Chunks are not compressed: on synthetic
#: ReLU-like float16 features gzip (level 1) saved 30% of the file and lzf 12%, but random
#: reads fell from about 4,400 images/s to about 480 and 720.
CHUNK_ROWS = 36
DTYPES = ("float16", "float32")


def _as_numpy(value: ArrayLike) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def content_options(feature_dim: int, dtype: str, extra: Optional[Mapping] = None) -> dict:
    """The options a file records as shaping its content: ``dtype``, ``feature_dim`` and ``extra``."""
    return {"dtype": np.dtype(dtype).name, "feature_dim": int(feature_dim), **(extra or {})}


def differences(recorded: Mapping, wanted: Mapping, where: str) -> List[str]:
    """``--dtype float16 in out.h5, float32 in this command`` for each option whose values differ."""
    keys = list(wanted) + [key for key in recorded if key not in wanted]
    return [f"--{key.replace('_', '-')} {recorded.get(key, 'unrecorded')} in {where}, "
            f"{wanted.get(key, 'unset')} in this command" for key in keys if recorded.get(key) != wanted.get(key)]


class Origins:
    """Where each stored image came from (``/origins``): what to skip, and the errors for an image
    id met at two places or a place (a file and line) that now holds another image."""

    def __init__(self, path: Path, ids: Iterable[int] = (), origins: Iterable[str] = ()):
        self.path = path
        self._by_id = dict(zip(ids, origins))
        self._by_place = {origin: image_id for image_id, origin in self._by_id.items() if origin}

    @classmethod
    def of(cls, file: h5py.File, path: Path) -> "Origins":
        return cls(path, file[layout.IMAGE_IDS][:].tolist(), file[layout.ORIGINS].asstr()[:].tolist())

    def __contains__(self, image_id) -> bool:
        return int(image_id) in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, image_id: int) -> Optional[str]:
        return self._by_id.get(int(image_id))

    def add(self, image_id: int, origin: str) -> None:
        self._by_id[int(image_id)] = origin
        if origin:
            self._by_place[origin] = int(image_id)

    def stored(self, image_id: int, origin: str, name: Optional[str] = None) -> bool:
        """Whether ``image_id`` is stored from ``origin``. An id stored from another place is a
        duplicate, and another id stored from ``origin`` a changed input: errors naming both."""
        image_id = int(image_id)
        stored = self._by_id.get(image_id)
        if stored is None and origin not in self._by_place:
            return False
        if stored in (origin, ""):  # "": a file of layout version 1 recorded no origins
            return True
        what = f"image {name!r} (id {image_id})" if name else f"image id {image_id}"
        if stored is None:
            raise RegionFeatureError(f"{self.path}: {origin} holds {what}, but image id {self._by_place[origin]} was "
                                     f"stored from there: the input changed since it was read; re-run with the "
                                     f"input it was written from, or rebuild with --overwrite")
        raise RegionFeatureError(f"{self.path}: {what} appears twice, at {stored} and at {origin}; a store keeps "
                                 f"one image per id, so one of them would be lost. Remove the duplicate from the "
                                 f"inputs, or convert them into separate stores")


class RegionFeatureWriter:
    """Append the regions of many images to one HDF5 file, published when the writer closes.

    >>> with RegionFeatureWriter("feats.h5") as writer:
    ...     if not writer.already_stored(42, origin="a.tsv, line 1"):
    ...         writer.add(42, features, boxes, image_height=480, image_width=640, origin="a.tsv, line 1")

    ``dtype`` is the storage type of the features ("float16" halves the size; values must
    stay within +-65504). Leaving the ``with`` block normally marks the file complete and
    renames ``<path>.partial`` to ``path``; leaving it by an exception keeps the partial file,
    which the next writer of ``path`` resumes (its options and ``sources`` must match). An
    existing ``path`` is refused unless ``append=True`` (same options) or ``overwrite=True``.
    ``sources`` are the inputs' records (``sources.py``), kept in the file; ``options``, other
    settings that shape the content (an extraction's region limits), recorded with ``dtype``
    and ``feature_dim``.
    """

    def __init__(self, path: PathLike, feature_dim: int = 2048, dtype: str = "float16",
                 chunk_rows: int = CHUNK_ROWS, buffer_rows: int = 8192, append: bool = False,
                 sources: Iterable[Source] = (), overwrite: bool = False, options: Optional[Mapping] = None):
        if append and overwrite:
            raise ValueError("append=True and overwrite=True exclude each other")
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: choose one of {DTYPES}")
        if feature_dim < 1 or chunk_rows < 1 or buffer_rows < 1:
            raise ValueError(f"feature_dim ({feature_dim}), chunk_rows ({chunk_rows}) and buffer_rows "
                             f"({buffer_rows}) must be positive")
        self.path = Path(path)
        self.partial = layout.partial_path(self.path)
        self.feature_dim = feature_dim
        self.dtype = np.dtype(dtype)
        self.chunk_rows = chunk_rows
        self.buffer_rows = buffer_rows
        self.append = append
        self.overwrite = overwrite
        self.sources = list(sources)
        self.options = content_options(feature_dim, dtype, options)
        self._file = None
        self._lock = WriterLock(self.partial)
        self._origins = Origins(self.path)
        self._pending: List[tuple] = []
        self._pending_rows = 0
        self._prepared_now = False
        self._added_now = 0

    def __enter__(self) -> "RegionFeatureWriter":
        self.open()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
            return
        self.suspend()
        if isinstance(exc, RegionFeatureError) and self.partial.exists():
            raise RegionFeatureError(f"{exc}\n{self.partial} keeps the {len(self)} images written so far. A "
                                     f"re-run resumes it only while the inputs are unchanged: once you have fixed "
                                     f"the input, re-run the command with --overwrite (or delete it and re-run)"
                                     ) from exc

    # --- opening: a new, copied or resumed partial file ---

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            staging_path(self.partial).unlink(missing_ok=True)  # left by a run killed while building it
            published = self._check_published()
            expected = merge(published or [], self.sources)
            if not self.partial.exists():
                self._prepare(expected, appending=published is not None)
            self._file = self._open_partial()
            mismatch = self._mismatch(expected)
            if mismatch and self.overwrite:  # a rebuild starts over, whatever an earlier run left
                self._file.close()
                self._file = None
                self.partial.unlink()
                self._prepare(expected, appending=False)
                self._file = self._open_partial()
            elif mismatch:
                raise RegionFeatureError(mismatch)
            self._file.attrs[layout.COMPLETE] = False  # in case a run stopped between marking it and renaming it
            self._origins = Origins.of(self._file, self.path)
        except BaseException:
            if self._file is not None:
                self._file.close()
                self._file = None
            self._lock.release()
            raise

    def _check_published(self) -> Optional[List[Source]]:
        """The recorded inputs of the file at ``path`` to append to (None: there is none, or it is
        rebuilt), after checking that this writer may write it."""
        if not self.path.exists():
            return None
        with open_hdf5(self.path, "r") as file:
            if file.attrs.get("format") != layout.FORMAT:
                raise RegionFeatureError(f"{self.path}: an HDF5 file that is not a region-feature file (it holds "
                                         f"{sorted(file)[:5]}); write to another path")
            if self.overwrite:
                return None
            check_layout(file, self.path, legacy=True)
            legacy = int(file.attrs["version"]) == layout.LEGACY_VERSION
            recorded = read_sources(file, self.path)
            changed = differences(read_options(file, self.path), self.options, self.path.name)
            count = file[layout.IMAGE_IDS].shape[0]
        if self.append and not changed:
            return recorded
        rebuild = ("--overwrite (overwrite=True) to rebuild it from these inputs (the old store stays whole until "
                   "the new one replaces it), or write a new store with another --output")
        if self.append:
            raise RegionFeatureError(f"{self.path}: cannot append with other options ({'; '.join(changed)}); "
                                     f"append with the store's options, pass {rebuild}")
        state = ("written by an earlier version without a completeness record" if legacy else
                 f"{count} images from {describe(recorded)}")
        new = unrecorded(recorded, self.sources)
        differs = changed + ([f"inputs {describe(new)} not in it"] if new else [])
        interrupted = (f"; {self.partial} holds an interrupted append or rebuild: re-run that command (with "
                       f"--append or --overwrite) to finish it" if self.partial.exists() else "")
        append = "" if changed else "--append (append=True) to add these inputs to it, "
        raise RegionFeatureError(f"{self.path} already exists ({state})" + (f" and differs from this command: "
                                 f"{'; '.join(differs)}" if differs else "") + f"; pass {append}{rebuild}{interrupted}")

    def _prepare(self, expected: List[Source], appending: bool) -> None:
        """Make the partial file: an empty one, or one holding the published file's images."""
        staging = staging_path(self.partial)
        if appending:
            with open_hdf5(self.path, "r") as published:
                new_file(staging, self.feature_dim, self.dtype, self.chunk_rows, dumps(expected),
                         json.dumps(self.options), source=published)
        else:
            new_file(staging, self.feature_dim, self.dtype, self.chunk_rows, dumps(expected), json.dumps(self.options))
        replace(staging, self.partial)
        self._prepared_now = True

    def _open_partial(self) -> h5py.File:
        """The partial file, open for writing; first rebuilt if a killed writer left it open."""
        try:
            return open_for_writing(self.partial)
        except OSError as err:
            if "already open for write" not in str(err):
                raise RegionFeatureError(f"{self.partial}: cannot open the work file ({err}); it is damaged: delete "
                                         f"it and re-run the command to start over") from err
        staging = staging_path(self.partial)  # this writer holds the lock: the one that left it open was killed
        with open_killed(self.partial) as killed:
            features = killed[layout.FEATURES]
            new_file(staging, features.shape[1], features.dtype, features.chunks[0],
                     killed[layout.SOURCES].asstr()[()], json.dumps(read_options(killed, self.partial)), source=killed)
        replace(staging, self.partial)
        return open_for_writing(self.partial)

    def _mismatch(self, expected: List[Source]) -> Optional[str]:
        """Why the partial file cannot be resumed by this writer (other inputs or options), or None."""
        file = self._file
        check_layout(file, self.partial)
        recorded = read_sources(file, self.partial)
        changed = differences(read_options(file, self.partial), self.options, self.partial.name)
        if recorded != expected:
            changed.append(f"it reads {describe(recorded)}, this command {describe(expected)}")
        if not changed:
            return None
        return (f"{self.partial}: an unfinished conversion with other inputs or options ({'; '.join(changed)}). "
                f"Re-run the command that started it to finish it, or start over with --overwrite (or by deleting "
                f"{self.partial})")

    # --- adding images ---

    def __contains__(self, image_id) -> bool:
        return int(image_id) in self._origins

    def __len__(self) -> int:
        return len(self._origins)

    def already_stored(self, image_id: int, origin: str, name: Optional[str] = None) -> bool:
        """Whether ``image_id`` is stored from ``origin`` (by an interrupted run: skip it).

        An id stored from another place is a duplicate (a store keeps one image per id, so one
        of the two would be lost), and another id stored from ``origin`` a changed input:
        errors naming both (``Origins.stored``)."""
        return self._origins.stored(image_id, origin, name)

    def add(self, image_id: int, features: ArrayLike, boxes: ArrayLike, image_height: int, image_width: int,
            name: Optional[str] = None, origin: str = "") -> None:
        """Queue one image: ``features`` [N, D], ``boxes`` [N, 4] (x1, y1, x2, y2 pixels); ``name``
        its name in the source (then ``image_id`` must be ``names.numeric_id(name)``), ``origin``
        where it comes from (a file and line), for resuming and for error messages."""
        if self._file is None:
            raise RuntimeError(f"{self.path}: the writer is not open; use it as a context manager")
        image_id = int(image_id)
        where = f"{self.path}: image id {image_id}" + (f" ({origin})" if origin else "")
        if name and numeric_id(name) != image_id:
            raise RegionFeatureError(f"{where}: named {name!r}, whose numeric id is {numeric_id(name)}; "
                                     f"pass image_id=names.numeric_id(name)")
        if image_id in self._origins:
            stored = self._origins.get(image_id)
            raise RegionFeatureError(f"{where} is already stored{f' (from {stored})' if stored else ''}; skip "
                                     f"ids with `writer.already_stored(image_id, origin)`")
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
        self._pending.append((image_id, stored, boxes.astype(np.float32), (int(image_height), int(image_width)),
                              name or "", origin))
        self._origins.add(image_id, origin)
        self._added_now += 1
        self._pending_rows += len(stored)
        if self._pending_rows >= self.buffer_rows:
            self.flush()

    def flush(self) -> None:
        """Write the queued images: regions and index rows, then the count that commits them."""
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
                   layout.NUM_REGIONS: counts, layout.IMAGE_SIZE: [item[3] for item in self._pending],
                   layout.IMAGE_NAMES: [item[4] for item in self._pending],
                   layout.ORIGINS: [item[5] for item in self._pending]}
        for name, values in columns.items():
            dataset = file[name]
            old = dataset.shape[0]
            dataset.resize(old + len(self._pending), axis=0)
            dataset[old:] = values if dataset.dtype.kind == "O" else np.asarray(values, dtype=dataset.dtype)
        file.flush()  # the batch is on disk before the count that makes it part of the file
        file[layout.COMMITTED][0] = file[layout.IMAGE_IDS].shape[0]
        file.flush()
        self._pending, self._pending_rows = [], 0

    # --- closing: publish, or keep the partial file for a resume ---

    def close(self) -> None:
        """Write what is queued, mark the file complete and publish it under ``path``."""
        if self._file is None:
            return
        try:
            try:
                self.flush()
                self._file.attrs.update({layout.NUM_IMAGES: len(self), layout.COMPLETE: True})
            finally:
                self._file.close()
                self._file = None
            replace(self.partial, self.path)
        finally:
            self._lock.release()

    def suspend(self) -> None:
        """Write what is queued and close, leaving ``<path>.partial`` unpublished for a resume
        (removed if this writer made it and added nothing: a failed start leaves no output)."""
        if self._file is None:
            return
        try:
            self.flush()
        finally:
            self._file.close()
            self._file = None
            if self._prepared_now and not self._added_now:
                self.partial.unlink()
            self._lock.release()


def mark_complete(path: PathLike) -> int:
    """Mark a file of layout version 1 complete, on its owner's word; returns its image count.

    Version 1 did not record whether a conversion finished; use this only for a file known
    to hold all its inputs (re-running its conversion with ``--append`` checks instead). The
    file is rewritten as version 2 under a staging name and renamed over the original."""
    path = Path(path)
    with open_hdf5(path, "r") as file:
        check_layout(file, path, legacy=True)
        count = file[layout.IMAGE_IDS].shape[0]
        if int(file.attrs["version"]) != layout.LEGACY_VERSION:
            if file.attrs.get(layout.COMPLETE, False):
                return count
            raise RegionFeatureError(f"{path}: an unfinished conversion, which cannot be marked complete by hand; "
                                     f"re-run the command that started it to finish it")
        staging = staging_path(path)
        features = file[layout.FEATURES]
        new_file(staging, features.shape[1], features.dtype, features.chunks[0], dumps([]),
                 json.dumps(read_options(file, path)), source=file, complete=True)
    replace(staging, path)
    return count
