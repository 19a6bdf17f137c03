"""Prepared captions (``captioning.prepare``) plus region features, as batches for training and decoding.

A batch (``collate``) holds ``image_ids [B]``, ``features [B, K, D]``, ``boxes [B, K, 4]``,
``mask [B, K]`` (True = real region) and ``captions [B, S, L+2]``: S captions per image, each
``<bos> w_1 .. w_n <eos> <pad> ..``. Images with more than S captions give a random S of them
per epoch, images with fewer repeat some (self-critical's ``seq_per_img`` = 5).
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
from torch.utils.data import Dataset

from common.features import RegionFeatureStore, pad_regions
from common.text import Vocabulary

from .prepare import FORMAT, TRAIN_SPLITS, CaptionDataError

#: The Karpathy splits behind each name a run can ask for.
SPLIT_GROUPS = {"train": TRAIN_SPLITS, "val": ("val",), "test": ("test",), "restval": ("restval",)}


class CaptionCorpus:
    """``vocab.json`` and ``captions.json`` of a prepared directory."""

    def __init__(self, prepared_dir: Union[str, Path]):
        self.dir = Path(prepared_dir)
        path = self.dir / "captions.json"
        if not path.is_file():
            raise CaptionDataError(f"{path} does not exist: run `python -m captioning.prepare --out {self.dir}` first")
        rebuild = "rebuild it with `python -m captioning.prepare`"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise CaptionDataError(f"{path} is not valid JSON ({err}); {rebuild}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CaptionDataError(f"{path}: field 'format' is {data.get('format') if isinstance(data, dict) else None!r}, "
                                   f"expected {FORMAT!r}; {rebuild}")
        missing = [key for key in ("vocab_size", "max_length", "images") if key not in data]
        if missing:
            raise CaptionDataError(f"{path}: fields {missing} are missing; {rebuild}")
        self.vocab = Vocabulary.load(self.dir / "vocab.json")
        if data["vocab_size"] != len(self.vocab):
            raise CaptionDataError(f"{path} was encoded with {data['vocab_size']} words but {self.dir / 'vocab.json'} "
                                   f"has {len(self.vocab)}; rerun captioning.prepare so both come from one run")
        self.max_length = int(data["max_length"])
        self.images = data["images"]

    def split(self, name: str, max_images: Optional[int] = None) -> list[dict]:
        """The images of ``train`` (Karpathy train + restval), ``val``, ``test`` or ``restval``."""
        if name not in SPLIT_GROUPS:
            raise ValueError(f"split must be one of {sorted(SPLIT_GROUPS)}, got {name!r}")
        images = [image for image in self.images if image["split"] in SPLIT_GROUPS[name]]
        if not images:
            raise CaptionDataError(f"{self.dir / 'captions.json'} has no images in split {name!r}")
        return images[:max_images] if max_images else images

    def references(self, images: Sequence[dict]) -> dict[int, list[str]]:
        return {image["image_id"]: image["references"] for image in images}


class CaptionDataset(Dataset):
    """Items ``{"image_id", "regions": RegionFeatures, "captions": LongTensor[S, L+2] or None}``."""

    def __init__(self, images: Sequence[dict], features: RegionFeatureStore, vocab: Vocabulary, max_length: int,
                 seq_per_img: int = 5, with_captions: bool = True):
        missing = [image["image_id"] for image in images if image["image_id"] not in features]
        if missing:
            raise CaptionDataError(f"{features.path}: no region features for {len(missing)} of {len(images)} images "
                                   f"(first ids: {missing[:5]}); convert the features of every image with "
                                   f"scripts/convert_features.py")
        self.images = list(images)
        self.features = features
        self.vocab = vocab
        self.length = max_length + 2
        self.seq_per_img = seq_per_img
        self.with_captions = with_captions

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict:
        image = self.images[index]
        item = {"image_id": image["image_id"], "regions": self.features[image["image_id"]], "captions": None}
        if self.with_captions:
            item["captions"] = self._captions(image["captions"])
        return item

    def _captions(self, captions: list[list[int]]) -> torch.Tensor:
        if len(captions) >= self.seq_per_img:
            chosen = random.sample(captions, self.seq_per_img)
        else:
            chosen = captions + random.choices(captions, k=self.seq_per_img - len(captions))
        out = torch.full((self.seq_per_img, self.length), self.vocab.pad, dtype=torch.long)
        for row, ids in zip(out, chosen):
            encoded = [self.vocab.bos, *ids, self.vocab.eos]
            row[: len(encoded)] = torch.tensor(encoded)
        return out


def collate(items: Sequence[dict]) -> dict:
    features, boxes, mask = pad_regions([item["regions"] for item in items])
    captions = None if items[0]["captions"] is None else torch.stack([item["captions"] for item in items])
    return {"image_ids": torch.tensor([item["image_id"] for item in items]), "features": features, "boxes": boxes,
            "mask": mask, "captions": captions}
