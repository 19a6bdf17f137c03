"""Karpathy's ``dataset_coco.json`` -> vocabulary and encoded captions.

    python -m captioning.prepare [--dataset-json PATH] [--data-root DIR] [--out DIR] [--min-count 5]

Writes ``<out>/vocab.json`` (:class:`common.text.Vocabulary`: ``<pad> <unk> <bos> <eos>`` and
the words seen at least ``min_count`` times in the training captions, ``train`` + ``restval``;
rarer words become ``<unk>``) and ``<out>/captions.json``: per image its COCO id, Karpathy
split, file path, raw reference sentences (for evaluation) and its captions as word ids,
truncated to ``max_length`` words (self-critical's ``prepro_labels.py``: 16).

Defaults: ``<data-root>/coco/dataset_coco.json`` -> ``<cache>/captioning/prepared-<hash of the
data root>``, where ``captioning.train`` looks when ``data.prepared`` is null: derived files
never go into the (possibly shared, read-only) data root. Get the file from Karpathy's
``caption_datasets.zip`` (``https://cs.stanford.edu/people/karpathy/deepimagesent/``).

Differences from ``prepro_labels.py``, which counts words over all splits and keeps those
seen *more than* ``count_thr`` = 5 times: here only training captions are counted (no test
words leak into the vocabulary) and the threshold is inclusive (``--min-count 6`` gives its rule).
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence, Union

from common.text import Vocabulary
from common.utils import atomic_write_json, cache_dir, console, default_data_root
from common.utils.inputs import read_json

SPLITS = ("train", "restval", "val", "test")
TRAIN_SPLITS = ("train", "restval")
FORMAT = "attention-suite/karpathy-captions"
VERSION = 1


class CaptionDataError(ValueError):
    """A captioning input file is missing or malformed (the message names the file and the fix)."""


#: Where a missing Karpathy file comes from.
KARPATHY_FIX = ("download Karpathy's caption_datasets.zip (https://cs.stanford.edu/people/karpathy/deepimagesent/) "
                "and put dataset_coco.json there")


def load_karpathy(path: Union[str, Path]) -> list[dict]:
    """The validated ``images`` of a Karpathy ``dataset_*.json``."""
    data = read_json(path, "Karpathy split", "images", KARPATHY_FIX, CaptionDataError)
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list):
        raise CaptionDataError(f"{path}: expected a JSON object with an 'images' list (Karpathy's format)")
    if not images:
        raise CaptionDataError(f"{path}: no images: its 'images' list is empty; {KARPATHY_FIX}")
    for i, image in enumerate(images):
        _check_image(path, i, image)
    return images


def _check_image(path: Path, i: int, image) -> None:
    where = f"{path}: images[{i}]"
    if not isinstance(image, dict):
        raise CaptionDataError(f"{where} is not an object")
    for key, kind in (("cocoid", int), ("split", str), ("filepath", str), ("filename", str), ("sentences", list)):
        if not isinstance(image.get(key), kind):
            raise CaptionDataError(f"{where} (cocoid {image.get('cocoid')}): field {key!r} must be a "
                                   f"{kind.__name__}, got {image.get(key)!r}; is this Karpathy's dataset_coco.json?")
    if image["split"] not in SPLITS:
        raise CaptionDataError(f"{where} (cocoid {image['cocoid']}): split {image['split']!r} is not one of {SPLITS}")
    if not image["sentences"]:
        raise CaptionDataError(f"{where} (cocoid {image['cocoid']}): 'sentences' is empty; every image needs captions")
    for j, sentence in enumerate(image["sentences"]):
        tokens = sentence.get("tokens") if isinstance(sentence, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens) \
                or not isinstance(sentence.get("raw"), str):
            raise CaptionDataError(f"{where} (cocoid {image['cocoid']}): sentences[{j}] needs 'tokens' "
                                   f"(a list of strings) and 'raw' (a string)")


def build_vocabulary(images: Sequence[dict], min_count: int = 5, source: Union[str, Path] = "the images"
                     ) -> Vocabulary:
    """Words seen at least ``min_count`` times in the ``train``/``restval`` captions of ``images`` (read from
    ``source``, which the errors name)."""
    counts = Counter(token for image in images if image["split"] in TRAIN_SPLITS
                     for sentence in image["sentences"] for token in sentence["tokens"])
    if not counts:
        raise CaptionDataError(f"{source}: no training captions (no image of split 'train' or 'restval') to build "
                               f"the vocabulary from; {KARPATHY_FIX}")
    vocab = Vocabulary.from_counts(counts, min_count=min_count)
    if len(vocab) == len(vocab.specials):
        word, count = counts.most_common(1)[0]
        raise CaptionDataError(f"{source}: no word of the training captions occurs {min_count} times (the most "
                               f"frequent, {word!r}, occurs {count}); lower --min-count")
    return vocab


def encode_images(images: Sequence[dict], vocab: Vocabulary, max_length: int = 16) -> list[dict]:
    """Per image: id, split, file path, raw references and word ids (``max_length`` at most)."""
    return [{
        "image_id": image["cocoid"],
        "split": image["split"],
        "file_path": f"{image['filepath']}/{image['filename']}",
        "references": [s["raw"] for s in image["sentences"]],
        "captions": [vocab.encode(s["tokens"][:max_length]) for s in image["sentences"]],
    } for image in images]


def prepare(dataset_json: Union[str, Path], out_dir: Union[str, Path], min_count: int = 5,
            max_length: int = 16) -> dict:
    """Write ``vocab.json`` and ``captions.json`` to ``out_dir``; returns a summary."""
    if min_count < 1 or max_length < 1:
        raise ValueError(f"min_count ({min_count}) and max_length ({max_length}) must be positive")
    images = load_karpathy(dataset_json)
    vocab = build_vocabulary(images, min_count, dataset_json)
    out_dir = Path(out_dir)
    vocab.save(out_dir / "vocab.json")
    encoded = encode_images(images, vocab, max_length)
    atomic_write_json(out_dir / "captions.json", {
        "format": FORMAT, "version": VERSION, "source": str(dataset_json), "min_count": min_count,
        "max_length": max_length, "vocab_size": len(vocab), "images": encoded,
    }, indent=None)
    words = [t for image in images if image["split"] in TRAIN_SPLITS for s in image["sentences"] for t in s["tokens"]]
    return {
        "out_dir": str(out_dir), "vocab_size": len(vocab),
        "images": dict(Counter(image["split"] for image in images)),
        "captions": sum(len(image["sentences"]) for image in images),
        "train_unk_rate": sum(w not in vocab for w in words) / max(len(words), 1),
    }


def default_dataset_json(data_root: Optional[str] = None) -> Path:
    """Karpathy's file that ``captioning.prepare`` reads by default: ``<data-root>/coco/dataset_coco.json``."""
    return default_data_root(data_root) / "coco" / "dataset_coco.json"


def default_prepared_dir(data_root: Optional[str] = None) -> Path:
    """Where ``captioning.prepare`` writes by default: the user cache, one directory per data root
    (``<cache>/captioning/prepared-<hash>``), never the data root itself."""
    coco = str((default_data_root(data_root) / "coco").resolve())
    return cache_dir() / "captioning" / f"prepared-{hashlib.sha1(coco.encode()).hexdigest()[:10]}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m captioning.prepare", description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", help="data directory (default: $ATTN_DATA_ROOT, else the user cache)")
    parser.add_argument("--dataset-json", help="Karpathy's file (default <data-root>/coco/dataset_coco.json)")
    parser.add_argument("--out", help="output directory (default <cache>/captioning/prepared-<data root hash>, "
                                      "where captioning.train looks; elsewhere, set data.prepared to it)")
    parser.add_argument("--min-count", type=int, default=5, help="keep words seen at least this often (default 5)")
    parser.add_argument("--max-length", type=int, default=16, help="truncate captions to this many words (default 16)")
    args = parser.parse_args(argv)
    try:
        summary = prepare(args.dataset_json or default_dataset_json(args.data_root),
                          args.out or default_prepared_dir(args.data_root),
                          args.min_count, args.max_length)
    except (CaptionDataError, ValueError) as err:
        return console.fail(err)
    print(f"{summary['captions']} captions of {sum(summary['images'].values())} images {summary['images']}; "
          f"vocabulary {summary['vocab_size']} (training words unknown: {100 * summary['train_unk_rate']:.2f}%) "
          f"-> {summary['out_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
