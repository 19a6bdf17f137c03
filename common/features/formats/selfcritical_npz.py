"""self-critical.pytorch's bottom-up features (``scripts/make_bu_data.py``).

``cocobu_att/<id>.npz`` holds ``feat`` [N, D]; ``cocobu_box/<id>.npy`` the boxes [N, 4];
``cocobu_fc/<id>.npy`` the mean feature (not needed: it is ``feat.mean(0)``). The image
sizes are not in these files: they come from a JSON with ``images: [{id, width,
height}]``, as COCO's annotation files (``captions_val2014.json``) and self-critical's
``cocotalk.json`` (when ``prepro_labels.py`` ran with ``--images_root``) have them.
"""
from __future__ import annotations

import json
import os
import re
from functools import partial
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import RegionFeatureError
from ..sources import Source, directory_record, input_directory, input_file
from ..store import RegionFeatures
from ._common import Entry, absolute, check_width, npz_arrays, record

FORMAT = "selfcritical-npz"
PathLike = Union[str, os.PathLike]
_NAME = re.compile(r"([0-9]+)\.npz")
_BOX_NAME = re.compile(r"[0-9]+\.npy")


def load_image_sizes(path: PathLike) -> Dict[int, Tuple[int, int]]:
    """``{image id: (height, width)}`` from a JSON whose ``images`` entries have ``id`` (or
    ``cocoid``), ``width`` and ``height``."""
    path = Path(path)
    input_file(path, "image-info", "a JSON with images: [{id, width, height}]")
    try:
        images = json.loads(path.read_text())["images"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise RegionFeatureError(f"{path}: expected JSON with a list 'images' ({err!r})") from None
    sizes = {}
    for position, image in enumerate(images):
        try:
            image_id = image["id"] if "id" in image else image["cocoid"]
            sizes[int(image_id)] = (int(image["height"]), int(image["width"]))
        except (KeyError, TypeError, ValueError):
            raise RegionFeatureError(
                f"{path}: images[{position}] needs 'id' (or 'cocoid'), 'width' and 'height'; COCO's annotation "
                f"files (captions_<split>2014.json) have them, and so does cocotalk.json when prepro_labels.py "
                f"ran with --images_root") from None
    return sizes


def files(att_dir: PathLike) -> List[Tuple[int, Path]]:
    """(image id, path) of every ``<id>.npz`` in ``att_dir``, by image id."""
    att_dir = absolute(input_directory(att_dir, "self-critical <id>.npz features (cocobu_att)"))
    found = sorted((int(match.group(1)), path) for path in att_dir.iterdir()
                   if (match := _NAME.fullmatch(path.name)))
    if not found:
        raise RegionFeatureError(f"{att_dir}: no <image id>.npz files found")
    return found


def sources(att_dir: PathLike, box_dir: PathLike, image_info: Sequence[PathLike]) -> List[Source]:
    """The records of the inputs; a missing, empty or wrong-kind path is an error."""
    box_dir = input_directory(box_dir, "self-critical <id>.npy boxes (cocobu_box)")
    boxes = [path for path in box_dir.iterdir() if _BOX_NAME.fullmatch(path.name)]
    return ([directory_record(att_dir, FORMAT, [path for _, path in files(att_dir)]),
             directory_record(box_dir, FORMAT, boxes)] +
            [input_file(path, "image-info", "a JSON with images: [{id, width, height}]") for path in image_info])


def entries(att_dir: PathLike, box_dir: PathLike, image_sizes: Mapping[int, Tuple[int, int]],
            feature_dim: Optional[int] = None) -> Iterator[Entry]:
    """The images of ``att_dir``, by image id; ``load()`` reads the features and boxes."""
    box_dir = absolute(box_dir)
    for image_id, path in files(att_dir):
        yield Entry(image_id, str(path), partial(_load, path, box_dir / f"{image_id}.npy", image_id, image_sizes,
                                                 feature_dim))


def _load(path: Path, box_path: Path, image_id: int, image_sizes: Mapping[int, Tuple[int, int]],
          feature_dim: Optional[int]) -> RegionFeatures:
    where = f"{path} (image id {image_id})"
    feat = npz_arrays(path, ("feat",))["feat"]
    if feat.ndim != 2:
        raise RegionFeatureError(f"{where}: field 'feat' has shape {feat.shape}, expected [N, D]")
    feat = check_width(feat, feature_dim, where, "feat", first=True)
    try:
        boxes = np.load(box_path, allow_pickle=False)
    except FileNotFoundError:
        raise RegionFeatureError(f"{where}: its boxes {box_path} are missing; make_bu_data.py writes them "
                                 f"to cocobu_box") from None
    except (OSError, ValueError, EOFError) as err:
        raise RegionFeatureError(f"{box_path} (image id {image_id}): cannot read the boxes ({err}); "
                                 f"the file is truncated or corrupt") from err
    if boxes.shape != (len(feat), 4):
        raise RegionFeatureError(f"{box_path} (image id {image_id}): the boxes have shape {boxes.shape}, expected "
                                 f"({len(feat)}, 4) to match the {len(feat)} rows of 'feat' in {path}")
    if image_id not in image_sizes:
        raise RegionFeatureError(f"{where}: no image size for this id in the image-size JSON; pass COCO's "
                                 f"annotation file of the image's split")
    return record(image_id, feat, boxes, *image_sizes[image_id], where, fields=("feat", "boxes"))


def write(root: PathLike, items: Iterable[RegionFeatures]) -> Path:
    """Write ``items`` as make_bu_data.py does (``cocobu_att``, ``cocobu_fc``, ``cocobu_box``
    under ``root``) plus ``image_info.json`` with the sizes (for fixtures and tests)."""
    root = Path(root)
    for name in ("cocobu_att", "cocobu_fc", "cocobu_box"):
        (root / name).mkdir(parents=True, exist_ok=True)
    images = []
    for item in items:
        features = item.features.numpy()
        np.savez_compressed(root / "cocobu_att" / str(item.image_id), feat=features)
        np.save(root / "cocobu_fc" / str(item.image_id), features.mean(0))
        np.save(root / "cocobu_box" / str(item.image_id), item.boxes.numpy())
        height, width = item.image_size
        images.append({"id": item.image_id, "width": width, "height": height})
    (root / "image_info.json").write_text(json.dumps({"images": images}))
    return root
