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
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Mapping, Tuple, Union

import numpy as np

from ..store import RegionFeatureError, RegionFeatures
from ._common import Skip, never, npz_arrays, record

PathLike = Union[str, os.PathLike]
_NAME = re.compile(r"^(\d+)\.npz$")


def load_image_sizes(path: PathLike) -> Dict[int, Tuple[int, int]]:
    """``{image id: (height, width)}`` from a JSON whose ``images`` entries have ``id`` (or
    ``cocoid``), ``width`` and ``height``."""
    path = Path(path)
    try:
        images = json.loads(path.read_text())["images"]
    except FileNotFoundError:
        raise RegionFeatureError(f"{path}: no such image-size JSON") from None
    except (json.JSONDecodeError, KeyError, TypeError) as err:
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
    att_dir = Path(att_dir)
    if not att_dir.is_dir():
        raise RegionFeatureError(f"{att_dir}: no such directory of self-critical <id>.npz features (cocobu_att)")
    found = sorted((int(match.group(1)), path) for path in att_dir.iterdir() if (match := _NAME.match(path.name)))
    if not found:
        raise RegionFeatureError(f"{att_dir}: no <image id>.npz files found")
    return found


def read(att_dir: PathLike, box_dir: PathLike, image_sizes: Mapping[int, Tuple[int, int]],
         skip: Skip = never) -> Iterator[RegionFeatures]:
    box_dir = Path(box_dir)
    for image_id, path in files(att_dir):
        if skip(image_id):
            continue
        where = f"{path} (image id {image_id})"
        feat = npz_arrays(path, ("feat",))["feat"]
        box_path = box_dir / f"{image_id}.npy"
        try:
            boxes = np.load(box_path, allow_pickle=False)
        except FileNotFoundError:
            raise RegionFeatureError(f"{where}: its boxes {box_path} are missing; make_bu_data.py writes them "
                                     f"to cocobu_box") from None
        except (OSError, ValueError, EOFError) as err:
            raise RegionFeatureError(f"{box_path} (image id {image_id}): cannot read the boxes ({err}); "
                                     f"the file is truncated or corrupt") from err
        if image_id not in image_sizes:
            raise RegionFeatureError(f"{where}: no image size for this id in the image-size JSON; pass COCO's "
                                     f"annotation file of the image's split")
        yield record(image_id, feat, boxes, *image_sizes[image_id], where)


def count(att_dir: PathLike) -> int:
    return len(files(att_dir))


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
