"""Prior and posterior attention over an image's boxes at every generated word (BAM paper, Fig. 1).

    python -m captioning.visualize runs/captioning/bam-wc --image-id 273052 \\
        --image COCO_val2014_000000273052.jpg --out attention.png

The first panel shows BAM's contextual prior ``pi`` (the same for every step; only for
``bam-wc``/``bam-lc``), then one panel per generated word with the posterior attention used
to predict it (eval mode: the posterior mean). Each pixel's brightness is the summed weight of
the boxes covering it, scaled to the panel's maximum.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np
from omegaconf import OmegaConf

from common.utils import atomic_save_figure, console
from common.utils.cli import add_runtime_options, runtime_from

from .config import data_path
from .evaluate import load_checkpoint

if TYPE_CHECKING:  # torch and the features are imported once the command line has been checked
    from common.utils.runtime import Runtime


def box_heatmap(boxes: np.ndarray, weights: np.ndarray, height: int, width: int) -> np.ndarray:
    """``[height, width]`` map: each pixel sums the weights of the boxes (x1, y1, x2, y2) covering it."""
    heat = np.zeros((height, width), dtype=np.float64)
    for (x1, y1, x2, y2), w in zip(boxes, weights):
        c1, r1 = max(int(math.floor(x1)), 0), max(int(math.floor(y1)), 0)
        c2, r2 = min(int(math.ceil(x2)), width), min(int(math.ceil(y2)), height)
        heat[r1:r2, c1:c2] += w
    return heat


def plot_attention(image: np.ndarray, boxes: np.ndarray, words: Sequence[str], posterior: np.ndarray,
                   prior: Optional[np.ndarray], path: Union[str, Path], columns: int = 4) -> Path:
    """Write the figure to ``path`` (PNG). ``posterior [T, K]`` for ``words`` (T of them), ``prior [K]``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if posterior.shape != (len(words), len(boxes)):
        raise ValueError(f"posterior must be [words={len(words)}, boxes={len(boxes)}], got {posterior.shape}")
    image = np.asarray(image, dtype=np.float64)
    image = image / 255.0 if image.max() > 1 else image
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=2)
    height, width = image.shape[:2]
    panels = ([("prior", prior)] if prior is not None else []) + list(zip(words, posterior))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3.2 * rows * height / width + 0.4 * rows),
                             squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (title, weights) in zip(axes.flat, panels):
        heat = box_heatmap(boxes, weights, height, width)
        heat = heat / heat.max() if heat.max() > 0 else heat
        ax.imshow(image[..., :3] * (0.15 + 0.85 * heat[..., None]))
        best = int(np.argmax(weights))
        x1, y1, x2, y2 = boxes[best]
        ax.add_patch(plt.Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, color="yellow", linewidth=1.5))
        ax.set_title(title, fontsize=11, fontweight="bold" if title == "prior" else "normal")
    fig.tight_layout()
    return atomic_save_figure(fig, path, dpi=100)


def attention_figure(checkpoint: Path, image_id: int, image_path: Path, out: Path, data_root: Optional[str] = None,
                     max_length: int = 16, runtime: Optional[Runtime] = None) -> dict:
    """Caption image ``image_id`` greedily and plot its prior/posterior attention; returns the caption."""
    import torch

    from common.features import RegionFeatureError, RegionFeatureStore, pad_regions
    from common.utils.runtime import Runtime

    runtime = runtime or Runtime(torch.device("cpu"))
    model, ckpt, vocab = load_checkpoint(checkpoint)
    model.to(runtime.device)
    cfg = OmegaConf.create(ckpt["config"])
    if data_root is not None:
        cfg.data_root = data_root
    regions = RegionFeatureStore(data_path(cfg, cfg.data.features))[image_id]
    features, boxes, mask = pad_regions([regions])
    features, mask = runtime.to_device(features), runtime.to_device(mask)
    model.eval()
    with torch.no_grad(), runtime.autocast():
        tokens = model.generate(features, mask, vocab.eos, max_length)
        words = vocab.decode(tokens[0].tolist(), strip_specials=False, stop_at_eos=False)
        length = words.index("<eos>") + 1 if "<eos>" in words else len(words)
        maps = model.attention_maps(features, mask, tokens[:, :length])
    maps = {name: None if value is None else value.float().cpu() for name, value in maps.items()}
    prior = None if maps["prior"] is None else maps["prior"][0].numpy()
    import matplotlib.image as mpimg

    image = mpimg.imread(image_path)
    if image.shape[:2] != tuple(regions.image_size):
        raise RegionFeatureError(f"{image_path} is {image.shape[1]}x{image.shape[0]} pixels but the features of image "
                                 f"{image_id} were extracted at {regions.image_size[1]}x{regions.image_size[0]}; "
                                 f"pass the image the features came from")
    plot_attention(image, boxes[0].numpy(), words[:length], maps["posterior"][0].numpy(), prior, out)
    return {"caption": " ".join(vocab.decode(tokens[0].tolist())), "figure": str(out)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m captioning.visualize", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a captioning.train output directory or its best.pt")
    parser.add_argument("--image-id", type=int, required=True, help="COCO id of the image (must be in the features)")
    parser.add_argument("--image", type=Path, required=True, help="the image file (jpg/png)")
    parser.add_argument("--out", type=Path, default=Path("attention.png"), help="PNG to write (default attention.png)")
    parser.add_argument("--data-root", help="data directory (default: the one used in training)")
    add_runtime_options(parser)
    args = parser.parse_args(argv)
    from common.features import RegionFeatureError
    from common.utils.runtime import DeviceError

    try:
        result = attention_figure(args.checkpoint, args.image_id, args.image, args.out, args.data_root,
                                  runtime=runtime_from(args))
    except (FileNotFoundError, RegionFeatureError, DeviceError, ValueError) as err:
        return console.fail(err)
    print(f"{args.image_id}: \"{result['caption']}\"")
    console.files_written([result["figure"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
