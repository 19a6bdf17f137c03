"""Caption a Karpathy split with a trained Att2in and score it with pycocoevalcap.

    python -m captioning.evaluate runs/captioning/softmax [--split test] [--beam-size 5]

Loads ``best.pt`` of a ``captioning.train`` run (or the checkpoint given), decodes every image
of the split (beam search, self-critical's evaluation setting: beam 5, at most 16 words),
and writes beside the checkpoint ``captions_<split>.json`` (the COCO results format,
``[{"image_id", "caption"}]``) and ``results_<split>.json`` (BLEU-1..4, METEOR, ROUGE-L,
CIDEr, SPICE when installed, with the config and library versions). It names the checkpoint scored and,
where training has not finished (no ``results.json`` beside it), says so and marks ``results_<split>.json``
(``finished``, ``unfinished_seeds``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from omegaconf import OmegaConf

from common.text import Vocabulary
from common.utils import atomic_write_json, console
from common.utils.cli import add_runtime_options, runtime_from
from common.utils.extras import needs_extra

from .config import build_model, data_path, prepared_dir
from .metrics import METRICS, coco_results, format_scores, score_captions
from .prepare import CaptionDataError

if TYPE_CHECKING:  # torch, the data and the model are imported once the command line has been checked
    from common.utils.runtime import Runtime

    from .data import CaptionDataset
    from .models import Att2in


def caption_images(model: Att2in, dataset: CaptionDataset, vocab: Vocabulary, beam_size: int = 1,
                   max_length: int = 16, batch_size: int = 50, progress: bool = True,
                   length_penalty: float = 0.0, runtime: Optional[Runtime] = None) -> dict[int, str]:
    """``{image_id: caption}`` for every image of ``dataset`` (model in eval mode: BAM's posterior mean),
    decoded on the model's device under the ``runtime``'s precision."""
    import torch
    from torch.utils.data import DataLoader

    from common.utils.runtime import Runtime

    from .data import collate

    runtime = runtime or Runtime(next(model.parameters()).device)
    model.eval()
    # its own generator: creating the iterator must not draw from (and so change) the training RNG
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate,
                        generator=torch.Generator(), pin_memory=runtime.pin_memory)
    captions = {}
    for batch in console.progress(loader, desc=f"decoding (beam {beam_size}) batch", enabled=progress):
        features, mask = runtime.to_device(batch["features"]), runtime.to_device(batch["mask"])
        with runtime.autocast():
            tokens = model.generate(features, mask, vocab.eos, max_length, beam_size, length_penalty)
        for image_id, row in zip(batch["image_ids"].tolist(), tokens.tolist()):
            captions[image_id] = " ".join(vocab.decode(row))
    return captions


def checkpoint_file(path: Path) -> Path:
    """``path``, or the ``best.pt`` of a run directory."""
    return path / "best.pt" if path.is_dir() else path


def load_checkpoint(path: Path) -> tuple[Att2in, dict, Vocabulary]:
    """Model, checkpoint dict and vocabulary of a ``best.pt`` written by ``captioning.train``."""
    path = checkpoint_file(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; pass a `python -m captioning.train` output "
                                f"directory or its best.pt")
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    missing = [key for key in ("model", "config", "vocab", "feature_dim") if key not in checkpoint]
    if missing:
        raise ValueError(f"{path} holds no {missing}: pass the best.pt that captioning.train writes (the "
                         f"checkpoints/step_<update>.pt files are for resuming training)")
    vocab = Vocabulary(**checkpoint["vocab"])
    model = build_model(OmegaConf.create(checkpoint["config"]), vocab, checkpoint["feature_dim"])
    model.load_state_dict(checkpoint["model"])
    return model, checkpoint, vocab


def evaluate_checkpoint(path: Path, split: str = "test", beam_size: int = 5, max_length: int = 16,
                        data_root: Optional[str] = None, max_images: Optional[int] = None,
                        metrics: Sequence[str] = METRICS, batch_size: int = 50, progress: bool = True,
                        length_penalty: float = 0.0, runtime: Optional[Runtime] = None) -> dict:
    """Decode and score ``split``; writes ``captions_<split>.json`` and ``results_<split>.json``."""
    import torch

    from common.features import RegionFeatureStore
    from common.utils import results_record
    from common.utils.runs import ScoredSeed, unfinished_seeds
    from common.utils.runtime import Runtime

    from .data import CaptionCorpus, CaptionDataset

    runtime = runtime or Runtime(torch.device("cpu"))
    model, checkpoint, vocab = load_checkpoint(path)
    scored = ScoredSeed.of(checkpoint["config"]["seed"], checkpoint_file(path),
                           checkpoint_file(path).parent / "results.json")
    model.to(runtime.device)
    cfg = OmegaConf.create(checkpoint["config"])
    if data_root is not None:
        cfg.data_root = data_root
    corpus = CaptionCorpus(prepared_dir(cfg))
    if corpus.vocab != vocab:
        raise CaptionDataError(f"{corpus.dir / 'vocab.json'} differs from the vocabulary the checkpoint was trained "
                               f"with; evaluate with the prepared directory used in training")
    images = corpus.split(split, max_images)
    store = RegionFeatureStore(data_path(cfg, cfg.data.features))
    dataset = CaptionDataset(images, store, vocab, corpus.max_length, with_captions=False)
    start = time.perf_counter()
    captions = caption_images(model, dataset, vocab, beam_size, max_length, batch_size, progress, length_penalty,
                              runtime)
    decode_seconds = time.perf_counter() - start
    scores = score_captions(captions, corpus.references(images), metrics)
    out_dir = (path if path.is_dir() else path.parent)
    atomic_write_json(out_dir / f"captions_{split}.json", coco_results(captions))
    results = results_record(checkpoint["config"], **scored.record(), unfinished_seeds=unfinished_seeds([scored]),
                             split=split, images=len(images),
                             beam_size=beam_size, length_penalty=length_penalty, max_length=max_length, scores=scores,
                             decode_seconds=decode_seconds, images_per_second=len(images) / decode_seconds,
                             runtime=runtime.describe())
    atomic_write_json(out_dir / f"results_{split}.json", results)
    return results


@needs_extra("captioning")
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m captioning.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a captioning.train output directory or its best.pt")
    parser.add_argument("--split", default="test", help="test (default), val, train or restval")
    parser.add_argument("--beam-size", type=int, default=5, help="1 = greedy (default 5)")
    parser.add_argument("--max-length", type=int, default=16, help="generated words at most (default 16)")
    parser.add_argument("--length-penalty", type=float, default=0.0,
                        help="beams ranked by sum log p / length ** this (default 0: the sum, as self-critical)")
    parser.add_argument("--max-images", type=int, help="only the first N images of the split")
    parser.add_argument("--metrics", nargs="+", default=list(METRICS), choices=METRICS)
    parser.add_argument("--data-root", help="data directory (default: the one used in training)")
    add_runtime_options(parser)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    from common.features import RegionFeatureError
    from common.utils.runs import ScoredSeed, print_unfinished
    from common.utils.runtime import DeviceError

    try:
        results = evaluate_checkpoint(args.checkpoint, args.split, args.beam_size, args.max_length, args.data_root,
                                      args.max_images, args.metrics, progress=not args.no_progress,
                                      length_penalty=args.length_penalty, runtime=runtime_from(args))
    except (FileNotFoundError, CaptionDataError, RegionFeatureError, DeviceError, ValueError) as err:
        return console.fail(err)
    scored = ScoredSeed.from_record(results)
    console.say(scored.line())
    print(f"{args.split} ({results['images']} images, beam {args.beam_size}): {format_scores(results['scores'])}")
    for name, reason in results["scores"].get("skipped", {}).items():
        print(f"note: {reason}")
    print_unfinished([scored], [], "python -m captioning.train")
    out_dir = args.checkpoint if args.checkpoint.is_dir() else args.checkpoint.parent
    console.files_written([out_dir / f"captions_{args.split}.json", out_dir / f"results_{args.split}.json"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
