"""A small, faithful stand-in for COCO captioning data, for tests and demos.

``write_karpathy_fixture(root)`` writes

* ``<root>/coco/dataset_coco.json`` in Karpathy's format: ``{"dataset": "coco", "images": [{
  "filepath", "filename", "imgid", "split", "cocoid", "sentids", "sentences": [{"tokens",
  "raw", "imgid", "sentid"}]}]}``, 5 captions per image, splits ``train``/``restval``/``val``/
  ``test``. With ``split_lists`` (the directory of Up-Down's ``karpathy_{val,test}_images.txt``)
  the val and test images are real Karpathy ids and file names; ``restval`` holds the real
  val2014 demo image 273052 (in neither list) when asked; other train ids are made up.
* ``<root>/coco/features/trainval_36.h5`` (:class:`common.features.RegionFeatureWriter`) whose regions
  are *informative*: each image shows a few concepts (attribute, object, action, scene),
  and one region per concept carries that concept's fixed random vector plus a little noise,
  so a tiny captioner can learn the captions quickly. The other regions are noise.

Captions come from five templates over the image's concepts, e.g. "A red dog sitting on the
grass." (tokens: lower case, no punctuation, as in Karpathy's file).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Dict, Optional, Union

import numpy as np

from common.features import RegionFeatureWriter
from common.utils import atomic_write_json

ATTRIBUTES = ("red", "blue", "green", "white", "black", "small", "large", "wooden")
OBJECTS = ("dog", "cat", "man", "woman", "bus", "train", "horse", "bird", "boat", "bicycle")
ACTIONS = ("sitting", "standing", "running", "parked", "waiting", "resting")
SCENES = (("on", "grass"), ("on", "street"), ("in", "kitchen"), ("near", "beach"), ("in", "field"),
          ("near", "building"))
TEMPLATES = (
    "A {a} {o} {v} {p} the {s}.",
    "The {a} {o} is {v} {p} a {s}.",
    "There is a {a} {o} {v} {p} the {s}.",
    "A {o} that is {a} {v} {p} the {s}.",
    "A {a} {o} {v} {p} a {s}.",
)
DEMO_IMAGE_ID = 273052  # COCO_val2014_000000273052.jpg: Karpathy restval, staged in the shared data
DEMO_IMAGE_SIZE = (334, 500)  # height, width


def tokenize(raw: str) -> list[str]:
    """Karpathy's tokens: lower case, punctuation removed, split on spaces."""
    return "".join(ch for ch in raw.lower() if ch.isalnum() or ch.isspace()).split()


def _split_ids(split_lists: Optional[Path], name: str, count: int, start: int) -> list[tuple[int, str]]:
    """``(cocoid, "val2014/COCO_val2014_....jpg")`` for ``count`` images of a Karpathy list."""
    if split_lists is None:
        return [(start + i, f"val2014/COCO_val2014_{start + i:012d}.jpg") for i in range(count)]
    path = Path(split_lists) / f"karpathy_{name}_images.txt"
    lines = path.read_text(encoding="utf-8").split("\n")[:count]
    return [(int(cocoid), file) for file, cocoid in (line.split() for line in lines)]


def write_karpathy_fixture(
    root: Union[str, Path],
    num_images: Optional[Dict[str, int]] = None,
    split_lists: Union[str, Path, None] = None,
    include_demo_image: bool = False,
    feature_dim: int = 64,
    num_regions: tuple[int, int] = (6, 12),
    noise: float = 0.1,
    seed: int = 0,
) -> Dict[str, Path]:
    """Write ``coco/dataset_coco.json`` and ``coco/features/trainval_36.h5`` under ``root``; returns their paths.

    ``num_images`` per split (default ``{"train": 20, "val": 5, "test": 5}``; ``restval`` is
    also accepted). ``include_demo_image`` adds COCO image 273052 to ``restval`` with boxes
    inside its real size, for attention plots on the real picture.
    """
    num_images = dict(num_images or {"train": 20, "val": 5, "test": 5})
    rng = random.Random(seed)
    concepts = sorted({*ATTRIBUTES, *OBJECTS, *ACTIONS, *(s for _, s in SCENES)})
    vectors = np.random.default_rng(seed).normal(size=(len(concepts), feature_dim)).astype(np.float32)
    vectors = dict(zip(concepts, np.abs(vectors)))  # bottom-up features are post-ReLU
    split_dir = Path(split_lists) if split_lists is not None else None

    entries = []  # (split, cocoid, file path, height, width)
    for split in ("train", "restval", "val", "test"):
        count = num_images.get(split, 0)
        if split in ("val", "test"):
            ids = _split_ids(split_dir, split, count, start=900_000 if split == "val" else 950_000)
        else:
            prefix = "train2014/COCO_train2014" if split == "train" else "val2014/COCO_val2014"
            base = 100_000 if split == "train" else 800_000
            ids = [(base + i, f"{prefix}_{base + i:012d}.jpg") for i in range(count)]
        entries += [(split, cocoid, file, 480, 640) for cocoid, file in ids]
    if include_demo_image:
        entries.append(("restval", DEMO_IMAGE_ID, f"val2014/COCO_val2014_{DEMO_IMAGE_ID:012d}.jpg",
                        *DEMO_IMAGE_SIZE))

    combos = [(a, o, v, s) for a in ATTRIBUTES for o in OBJECTS for v in ACTIONS for s in range(len(SCENES))]
    chosen = rng.sample(combos, len(entries))
    root = Path(root) / "coco"
    features_path = root / "features" / "trainval_36.h5"
    features_path.unlink(missing_ok=True)
    images, sentid = [], 1
    noise_rng = np.random.default_rng(seed + 1)
    with RegionFeatureWriter(features_path, feature_dim=feature_dim, dtype="float32") as writer:
        for imgid, ((split, cocoid, file, height, width), (a, o, v, s)) in enumerate(zip(entries, chosen)):
            prep, scene = SCENES[s]
            sentences = []
            for template in TEMPLATES:
                raw = template.format(a=a, o=o, v=v, p=prep, s=scene)
                sentences.append({"tokens": tokenize(raw), "raw": raw, "imgid": imgid, "sentid": sentid})
                sentid += 1
            filepath, filename = file.split("/")
            images.append({"filepath": filepath, "sentids": [x["sentid"] for x in sentences], "filename": filename,
                           "imgid": imgid, "split": split, "sentences": sentences, "cocoid": cocoid})
            n = rng.randint(*num_regions)
            feats = noise_rng.normal(scale=noise, size=(n, feature_dim)).astype(np.float32)
            for row, word in zip(rng.sample(range(n), 4), (a, o, v, scene)):
                feats[row] += vectors[word]
            writer.add(cocoid, feats, _random_boxes(noise_rng, n, height, width), height, width)
    dataset = atomic_write_json(root / "dataset_coco.json", {"images": images, "dataset": "coco"})
    return {"dataset": dataset, "features": features_path}


def _random_boxes(rng: np.random.Generator, n: int, height: int, width: int) -> np.ndarray:
    x1 = rng.uniform(0, width * 0.7, n)
    y1 = rng.uniform(0, height * 0.7, n)
    x2 = np.minimum(x1 + rng.uniform(width * 0.1, width * 0.5, n), width - 1)
    y2 = np.minimum(y1 + rng.uniform(height * 0.1, height * 0.5, n), height - 1)
    return np.stack([x1, y1, x2, y2], axis=1).astype(np.float32)

