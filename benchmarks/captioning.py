"""Att2in speed: images per second in cross-entropy training and in decoding (greedy, beam 5).

    python benchmarks/captioning.py [--threads 2] [--repeats 5] [--attention softmax bam-wc] [--name captioning]

The paper-sized model (self-critical's ``a2i2.yml``: LSTM 512, attention hidden 512, 2048-d
features, dropout 0.5) with a COCO-sized vocabulary (9,487 words + 4 specials) on synthetic
inputs: 36 regions per image (the ``trainval_36`` features), captions of 16 words. Data loading
is not included (``benchmarks/features.py`` measures the feature store).

* ``train``: one optimisation step on 10 images x 5 captions (the a2i2 batch): forward with
  scheduled sampling 0.25, NLL (+ BAM KL), backward, gradient clipping, Adam.
* ``greedy`` / ``beam5``: decoding 50 images to at most 16 words in eval mode.

Wall and process CPU times are medians of ``--repeats`` runs after a warm-up, written to
``benchmarks/results/captioning.json``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _measure import environment, write_json  # noqa: E402

from captioning.models import Att2in, Att2inConfig  # noqa: E402
from captioning.train import caption_nll  # noqa: E402
from common import attention  # noqa: E402

VOCAB = 9487 + 4
REGIONS, FEATURE_DIM, WORDS = 36, 2048, 16
PAD, UNK, BOS, EOS = 0, 1, 2, 3


def median_seconds(fn: Callable[[], None], repeats: int) -> dict:
    """Median wall seconds of ``fn`` and the median CPU seconds this process spent (all threads);
    on a CPU shared with other jobs, wall >> cpu / threads says the numbers are contended."""
    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"wall": statistics.median(wall), "cpu": statistics.median(cpu)}


def inputs(images: int, captions_per_image: int = 5):
    g = torch.Generator().manual_seed(0)
    features = torch.rand(images, REGIONS, FEATURE_DIM, generator=g)
    mask = torch.ones(images, REGIONS, dtype=torch.bool)
    captions = torch.randint(4, VOCAB, (images, captions_per_image, WORDS + 2), generator=g)
    captions[..., 0] = BOS
    captions[..., -1] = EOS
    return features, mask, captions


def measure(name: str, repeats: int) -> dict:
    torch.manual_seed(0)
    model = Att2in(Att2inConfig(vocab_size=VOCAB, attention=name), bos=BOS, pad=PAD)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
    features, mask, captions = inputs(10)

    def train_step():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        with attention.aux_losses() as aux:
            log_probs = model(features, mask, captions, ss_prob=0.25)
        loss = caption_nll(log_probs, captions, PAD) + aux.total() / log_probs.shape[1]
        loss.backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
        optimizer.step()

    eval_features, eval_mask, _ = inputs(50, 1)

    def decode(beam_size):
        def run():
            model.eval()
            model.generate(eval_features, eval_mask, EOS, WORDS, beam_size)
        return run

    # an untrained model rarely emits <eos>: every caption runs the full 16 steps (the worst case)
    seconds = {"train": median_seconds(train_step, repeats), "greedy": median_seconds(decode(1), repeats),
               "beam5": median_seconds(decode(5), repeats)}
    images = {"train": 10, "greedy": 50, "beam5": 50}
    return {name: {"images": images[name], "wall_seconds": t["wall"], "cpu_seconds": t["cpu"],
                   "images_per_second": images[name] / t["wall"]} for name, t in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--attention", nargs="+", default=["softmax", "bam-wc"])
    parser.add_argument("--name", default="captioning", help="writes benchmarks/results/<name>.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    report = {"setup": {"vocab": VOCAB, "regions": REGIONS, "feature_dim": FEATURE_DIM, "words": WORDS,
                        "rnn_size": 512, "train_batch": "10 images x 5 captions", "decode_batch": 50,
                        "repeats": args.repeats},
              "environment": environment(args.threads),
              "load_average_before": os.getloadavg(),  # other processes on a shared CPU slow every number
              "results": {name: measure(name, args.repeats) for name in args.attention}}
    report["load_average_after"] = os.getloadavg()
    for name, r in report["results"].items():
        print(f"{name}: train {r['train']['images_per_second']:.1f} img/s, greedy {r['greedy']['images_per_second']:.1f} "
              f"img/s, beam5 {r['beam5']['images_per_second']:.1f} img/s")
    print("wrote", write_json(args.name, report))


if __name__ == "__main__":
    main()
