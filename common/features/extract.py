"""Bottom-up feature extraction around a detector, writing the HDF5 store.

The detector is anything with ``detect(image) -> Proposals`` (``detectron2_detector.py``
wraps a detectron2 Faster R-CNN; tests use a fake). Region selection follows Anderson et
al.'s ``tools/generate_tsv.py``: every proposal gets ``max_conf`` = its highest class score
among the (class, proposal) pairs that survive per-class NMS (IoU 0.3) over the proposal
boxes; proposals with ``max_conf >= conf_thresh`` (0.2) are kept, and the count is
clamped to [min_boxes, max_boxes] by descending ``max_conf`` (10-100 adaptive; 36-36 for
the fixed files). Boxes are the proposals themselves, not the class-regressed boxes.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, List, Protocol, Sequence, Tuple, Union

import numpy as np
import torch

from common.utils import console

from .convert import up_to_date
from .errors import RegionFeatureError
from .names import numeric_id
from .sources import Source, directory_record, input_file
from .writer import RegionFeatureWriter, content_options

PathLike = Union[str, os.PathLike]
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


@dataclass
class Proposals:
    """A detector's output for one image: ``boxes`` [R, 4] (x1, y1, x2, y2 pixels of the
    original image), ``class_scores`` [R, 1 + C] probabilities with background in column 0,
    ``features`` [R, D] pooled region features."""

    boxes: torch.Tensor
    class_scores: torch.Tensor
    features: torch.Tensor


class Detector(Protocol):
    def detect(self, image: np.ndarray) -> Proposals:
        """``image``: [H, W, 3] uint8, RGB."""


@dataclass
class Selection:
    """Anderson et al.'s region selection (their defaults: adaptive 10-100 boxes)."""

    min_boxes: int = 10
    max_boxes: int = 100
    conf_thresh: float = 0.2
    nms_thresh: float = 0.3

    def __post_init__(self):
        if not 1 <= self.min_boxes <= self.max_boxes:
            raise ValueError(f"need 1 <= min_boxes ({self.min_boxes}) <= max_boxes ({self.max_boxes})")


def box_iou(boxes: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU [R, R] of (x1, y1, x2, y2) boxes (continuous coordinates)."""
    area = (boxes[:, 2] - boxes[:, 0]).clamp(min=0) * (boxes[:, 3] - boxes[:, 1]).clamp(min=0)
    low = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    high = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (high - low).clamp(min=0).prod(-1)
    union = area[:, None] + area[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=torch.finfo(boxes.dtype).tiny), torch.zeros_like(inter))


def nms_keep(iou: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """Greedy NMS for every class at once over shared boxes: ``scores`` [C, R] -> keep [C, R] bool.

    Per class, boxes are visited by descending score; a box is kept unless a kept,
    higher-scoring box overlaps it with IoU > ``threshold``. One step per rank, all classes
    in parallel, so 1600 classes cost R vectorised steps."""
    classes, count = scores.shape
    order = scores.argsort(dim=1, descending=True)  # [C, R]
    overlaps = iou > threshold  # [R, R]
    suppressed = torch.zeros(classes, count, dtype=torch.bool)
    keep = torch.zeros(classes, count, dtype=torch.bool)
    rows = torch.arange(classes)
    for rank in range(count):
        box = order[:, rank]  # the rank-th best box of each class
        alive = ~suppressed[rows, box]
        keep[rows, box] = alive
        suppressed |= alive[:, None] & overlaps[box]
    return keep


def select_regions(proposals: Proposals, selection: Selection = Selection()) -> torch.Tensor:
    """Indices of the kept proposals, by descending ``max_conf`` when the count is clamped."""
    scores = proposals.class_scores[:, 1:].t().float()  # [C, R], background dropped
    keep = nms_keep(box_iou(proposals.boxes.float()), scores, selection.nms_thresh)
    max_conf = torch.where(keep, scores, torch.zeros_like(scores)).amax(dim=0)
    kept = torch.nonzero(max_conf >= selection.conf_thresh).flatten()
    if selection.min_boxes <= len(kept) <= selection.max_boxes:
        return kept
    limit = selection.min_boxes if len(kept) < selection.min_boxes else selection.max_boxes
    return torch.argsort(max_conf, descending=True, stable=True)[:limit]


def load_image(path: PathLike) -> np.ndarray:
    """[H, W, 3] uint8 RGB, read with Pillow."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("reading images needs Pillow: pip install pillow") from None
    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))
    except (OSError, ValueError) as err:
        raise RegionFeatureError(f"{path}: cannot read the image ({err})") from err


def _images(path: Path) -> List[Path]:
    """``path`` if it is an image file, the image files in it if it is a directory."""
    if not path.exists():
        raise RegionFeatureError(f"{path}: no such image file or directory; check the path")
    candidates = sorted(path.iterdir()) if path.is_dir() else [path]
    return [candidate for candidate in candidates if candidate.suffix.lower() in IMAGE_SUFFIXES]


def image_files(paths: Iterable[PathLike]) -> List[Tuple[int, Path]]:
    """(image id, path) of the given images and of the images in the given directories; the id
    is ``names.numeric_id`` of the file name's stem (``COCO_val2014_000000273052.jpg`` -> 273052,
    ``2410371.jpg`` -> 2410371; another name gets a hashed id and is kept as the image's name)."""
    paths = [Path(path) for path in paths]
    found = [(numeric_id(image.stem), image) for path in paths for image in _images(path)]
    if not found:
        raise RegionFeatureError(f"no {'/'.join(IMAGE_SUFFIXES)} images in {[str(p) for p in paths]}")
    return found


def image_sources(paths: Iterable[PathLike]) -> List[Source]:
    """The records of the extraction's inputs (image files and directories) that the store keeps."""
    return [directory_record(path, "images", _images(path)) if path.is_dir() else input_file(path, "images", "an image")
            for path in map(Path, paths)]


def extract(images: Iterable[Tuple[int, Path]], detector: Detector, output: PathLike,
            selection: Selection = Selection(), feature_dim: int = 2048, dtype: str = "float16",
            progress: bool = True, append: bool = False, sources: Sequence[Source] = (),
            overwrite: bool = False) -> dict:
    """Detect, select and store the regions of every image not yet in ``output``. Resumable,
    published only when complete, and a no-op when ``output`` already records ``sources``
    (``image_sources``) and the same options (dtype, feature_dim, ``selection``), as
    ``convert.convert``; ``append`` adds to an existing ``output``, ``overwrite`` rebuilds it."""
    images = list(images)
    options = asdict(selection)
    done = None if overwrite else up_to_date(Path(output), list(sources), content_options(feature_dim, dtype, options))
    if done is not None:
        return {"written": 0, "skipped": done, "images": done, "unchanged": True}
    counts = {"written": 0, "skipped": 0}
    with RegionFeatureWriter(output, feature_dim=feature_dim, dtype=dtype, append=append, overwrite=overwrite,
                             sources=sources, options=options) as writer:
        for image_id, path in console.progress(images, unit="img", desc=Path(output).name, enabled=progress):
            origin = os.path.abspath(path)
            name = path.stem if numeric_id(path.stem) == image_id else None  # ids of image_files are named
            if writer.already_stored(image_id, origin, name):
                counts["skipped"] += 1
                continue
            image = load_image(path)
            with torch.inference_mode():
                proposals = detector.detect(image)
                kept = select_regions(proposals, selection)
            writer.add(image_id, proposals.features[kept].float().cpu(), proposals.boxes[kept].float().cpu(),
                       image_height=image.shape[0], image_width=image.shape[1], name=name, origin=origin)
            counts["written"] += 1
        counts["images"] = len(writer)
    return {**counts, "unchanged": False}
