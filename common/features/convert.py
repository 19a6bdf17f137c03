"""Copy region features from the format readers into one HDF5 file: resumable, published whole."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from tqdm import tqdm

from . import layout
from .formats._common import Entry
from .sources import Source, unrecorded
from .store import open_hdf5, read_sources
from .writer import RegionFeatureWriter

PathLike = Union[str, os.PathLike]


def up_to_date(output: Path, sources: Sequence[Source]) -> Optional[int]:
    """The image count of ``output`` if it is complete and records every one of ``sources``
    unchanged (same path, size and file count), else None."""
    if not sources or not output.exists() or layout.partial_path(output).exists():
        return None
    with open_hdf5(output, "r") as file:
        if int(file.attrs.get("version", -1)) != layout.VERSION or not file.attrs.get(layout.COMPLETE, False):
            return None
        if unrecorded(read_sources(file, output), sources):
            return None
        return int(file[layout.IMAGE_IDS].shape[0])


def convert(entries: Iterable[Entry], output: PathLike, sources: Sequence[Source], feature_dim: int = 2048,
            dtype: str = "float16", total: Optional[int] = None, progress: bool = True, append: bool = False) -> dict:
    """Write every entry into ``output``, which appears only once complete (``writer.py``).

    Re-running resumes: entries that an interrupted run stored from the same place are
    skipped without being decoded; an image id met at two places is an error naming both.
    If ``output`` is complete and records every one of ``sources`` unchanged, nothing is
    done. An existing ``output`` is otherwise refused unless ``append``.
    Returns ``{"written", "skipped", "images", "unchanged"}`` (images: the total in ``output``)."""
    output = Path(output)
    images = up_to_date(output, sources)
    if images is not None:
        return {"written": 0, "skipped": 0, "images": images, "unchanged": True}
    counts = {"written": 0, "skipped": 0}
    with RegionFeatureWriter(output, feature_dim=feature_dim, dtype=dtype, append=append, sources=sources) as writer, \
            tqdm(total=total, unit="img", desc=output.name, disable=not progress) as bar:
        for entry in entries:
            if writer.already_stored(entry.image_id, entry.place, entry.name):
                counts["skipped"] += 1
            else:
                item = entry.load()
                writer.add(item.image_id, item.features, item.boxes, *item.image_size, name=item.name,
                           origin=entry.place)
                counts["written"] += 1
            bar.update(1)
        counts["images"] = len(writer)
    return {**counts, "unchanged": False}
