"""Copy region features from the format readers into one HDF5 file: resumable, published whole."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence, Union

from common.utils import console

from . import layout
from .errors import RegionFeatureError
from .formats._common import Entry
from .sources import Source, unrecorded
from .store import open_hdf5, read_options, read_sources
from .writer import Origins, RegionFeatureWriter, content_options

PathLike = Union[str, os.PathLike]


def up_to_date(output: Path, sources: Sequence[Source], options: Mapping) -> Optional[int]:
    """The image count of ``output`` if it is complete, was written with ``options``
    (``writer.content_options``) and records every one of ``sources`` unchanged (same path,
    size and file count; a stream by its path), else None."""
    if not sources or not output.exists() or layout.partial_path(output).exists():
        return None
    with open_hdf5(output, "r") as file:
        if int(file.attrs.get("version", -1)) != layout.VERSION or not file.attrs.get(layout.COMPLETE, False):
            return None
        if unrecorded(read_sources(file, output), sources) or read_options(file, output) != dict(options):
            return None
        return int(file[layout.IMAGE_IDS].shape[0])


def convert(entries: Iterable[Entry], output: PathLike, sources: Sequence[Source], feature_dim: int = 2048,
            dtype: str = "float16", total: Optional[int] = None, progress: bool = True, append: bool = False,
            overwrite: bool = False) -> dict:
    """Write every entry into ``output``, which appears only once complete (``writer.py``).

    Re-running resumes: entries that an interrupted run stored from the same place are
    skipped without being decoded (a stream is read again from its start, and its committed
    lines skipped); an image id met at two places is an error naming both. If ``output`` is
    complete, was written with the same dtype and feature_dim and records every one of
    ``sources`` unchanged, nothing is written and every image counts as skipped; a stream
    among them is read through to check that each of its images is stored from the same line.
    An existing ``output`` is otherwise refused unless ``append`` (same options) or
    ``overwrite`` (rebuilt from these inputs, replacing it only once complete).
    Returns ``{"written", "skipped", "images", "unchanged"}`` (images: the total in ``output``)."""
    output = Path(output)
    images = None if overwrite else up_to_date(output, sources, content_options(feature_dim, dtype))
    if images is not None and not any(source.get("stream") for source in sources):
        return {"written": 0, "skipped": images, "images": images, "unchanged": True}
    if images is not None:
        with open_hdf5(output, "r") as file:
            stored = Origins.of(file, output)
        return {**_read_through(entries, stored, output, total, progress), "images": images, "unchanged": True}
    counts = {"written": 0, "skipped": 0}
    with RegionFeatureWriter(output, feature_dim=feature_dim, dtype=dtype, append=append, overwrite=overwrite,
                             sources=sources) as writer, \
            console.progress(total=total, desc=output.name, enabled=progress, unit="img") as bar:
        for entry in entries:
            if writer.already_stored(entry.image_id, entry.place, entry.name):
                counts["skipped"] += 1
            else:
                item = entry.load()
                writer.add(item.image_id, item.features, item.boxes, *item.image_size, name=item.name,
                           origin=entry.place)
                counts["written"] += 1
            bar.update()
        counts["images"] = len(writer)
    return {**counts, "unchanged": False}


def _read_through(entries: Iterable[Entry], stored: Origins, output: Path, total: Optional[int],
                  progress: bool) -> dict:
    """Check that every entry is stored from its place (a complete store that records a stream)."""
    skipped = 0
    with console.progress(total=total, desc=f"{output.name} (checking)", enabled=progress, unit="img") as bar:
        for entry in entries:
            if not stored.stored(entry.image_id, entry.place, entry.name):
                raise RegionFeatureError(f"{output}: {entry.place} holds image id {entry.image_id}, which this store "
                                         f"does not hold: the input differs from the one it was converted from; "
                                         f"rebuild it with --overwrite, or write a new store with another --output")
            skipped += 1
            bar.update()
    return {"written": 0, "skipped": skipped}
