"""Copy region features from any reader of ``formats`` into one HDF5 file, resumably."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

from tqdm import tqdm

from .store import RegionFeatureError, RegionFeatures
from .writer import RegionFeatureWriter

PathLike = Union[str, os.PathLike]
#: ``read(skip) -> records``: a format reader with its paths bound.
Reader = Callable[[Callable[[int], bool]], Iterable[RegionFeatures]]


def convert(read: Reader, output: PathLike, feature_dim: int = 2048, dtype: str = "float16",
            total: Optional[int] = None, progress: bool = True) -> dict:
    """Write every record of ``read`` into ``output``. Images already stored (by an
    interrupted run, or earlier in the input) are skipped without being decoded.
    Returns ``{"written", "skipped", "images"}`` (images: the total now in ``output``)."""
    counts = {"written": 0, "skipped": 0}
    with RegionFeatureWriter(output, feature_dim=feature_dim, dtype=dtype) as writer, \
            tqdm(total=total, unit="img", desc=Path(output).name, disable=not progress) as bar:

        def already_stored(image_id: int) -> bool:
            if image_id in writer:
                counts["skipped"] += 1
                bar.update(1)
                return True
            return False

        for item in read(already_stored):
            if item.features.shape[1] != feature_dim:
                raise RegionFeatureError(f"image id {item.image_id}: {item.features.shape[1]}-d features, but "
                                         f"{output} holds {feature_dim}-d ones; pass --feature-dim "
                                         f"{item.features.shape[1]} (with a new output file)")
            writer.add(item.image_id, item.features, item.boxes, *item.image_size)
            counts["written"] += 1
            bar.update(1)
        counts["images"] = len(writer)
    return counts
