"""Att2in speed: images per second in cross-entropy training and in decoding (greedy, beam 5).

    python benchmarks/captioning.py [--threads 2] [--repeats 5] [--attention softmax bam-wc] [--name captioning]
    python benchmarks/captioning.py --device cuda --precision fp32 bf16 --compile off on

The paper-sized model (self-critical's ``a2i2.yml``: LSTM 512, attention hidden 512, 2048-d
features, dropout 0.5) with a COCO-sized vocabulary (9,487 words + 4 specials) on synthetic
inputs: 36 regions per image (the ``trainval_36`` features), captions of 16 words. Data loading
is not included (``benchmarks/features.py`` measures the feature store).

* ``train``: one optimisation step on 10 images x 5 captions (the a2i2 batch): forward with
  scheduled sampling 0.25, NLL (+ BAM KL), backward, gradient clipping, Adam.
* ``greedy`` / ``beam5``: decoding 50 images to at most 16 words in eval mode.

Every attention variant is measured in every ``--precision`` and ``--compile`` setting (the
training step's forward compiled with ``torch.compile``; on CUDA the timings are synchronised).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import environment, write_json  # noqa: E402

from captioning.models import Att2in, Att2inConfig  # noqa: E402
from captioning.models import caption_nll  # noqa: E402
from common import attention  # noqa: E402
from common.utils.runtime import Runtime  # noqa: E402

VOCAB = 9487 + 4
REGIONS, FEATURE_DIM, WORDS = 36, 2048, 16
PAD, UNK, BOS, EOS = 0, 1, 2, 3


def median_seconds(fn: Callable[[], None], repeats: int, runtime: Runtime) -> dict:
    """Median wall seconds of ``fn`` and the median CPU seconds this process spent (all threads);
    on a CPU shared with other jobs, wall >> cpu / threads says the numbers are contended."""
    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        runtime.synchronize()
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        runtime.synchronize()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"wall": statistics.median(wall), "cpu": statistics.median(cpu)}


def inputs(images: int, runtime: Runtime, captions_per_image: int = 5):
    g = torch.Generator().manual_seed(0)
    features = torch.rand(images, REGIONS, FEATURE_DIM, generator=g)
    mask = torch.ones(images, REGIONS, dtype=torch.bool)
    captions = torch.randint(4, VOCAB, (images, captions_per_image, WORDS + 2), generator=g)
    captions[..., 0] = BOS
    captions[..., -1] = EOS
    return runtime.to_device((features, mask, captions))


def measure(name: str, repeats: int, runtime: Runtime) -> dict:
    torch.manual_seed(0)
    model = Att2in(Att2inConfig(vocab_size=VOCAB, attention=name), bos=BOS, pad=PAD).to(runtime.device)
    forward = runtime.compile(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
    features, mask, captions = inputs(10, runtime)

    def train_step():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        with runtime.autocast(), attention.aux_losses() as aux:
            log_probs = forward(features, mask, captions, ss_prob=0.25)
        loss = caption_nll(log_probs, captions, PAD) + aux.total() / log_probs.shape[1]
        runtime.backward_step(loss, optimizer, clip=lambda: torch.nn.utils.clip_grad_value_(model.parameters(), 0.1))

    eval_features, eval_mask, _ = inputs(50, runtime, 1)

    def decode(beam_size):
        def run():
            model.eval()
            with runtime.autocast():
                model.generate(eval_features, eval_mask, EOS, WORDS, beam_size)
        return run

    # an untrained model rarely emits <eos>: every caption runs the full 16 steps (the worst case)
    seconds = {"train": median_seconds(train_step, repeats, runtime),
               "greedy": median_seconds(decode(1), repeats, runtime),
               "beam5": median_seconds(decode(5), repeats, runtime)}
    images = {"train": 10, "greedy": 50, "beam5": 50}
    return {name: {"images": images[name], "wall_seconds": t["wall"], "cpu_seconds": t["cpu"],
                   "images_per_second": images[name] / t["wall"]} for name, t in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--attention", nargs="+", default=["softmax", "bam-wc"])
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--compile", nargs="+", default=["off"], choices=("off", "on"))
    parser.add_argument("--name", default="captioning", help="writes benchmarks/results/<name>.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = Runtime.create(args.device).device
    report = {"setup": {"vocab": VOCAB, "regions": REGIONS, "feature_dim": FEATURE_DIM, "words": WORDS,
                        "rnn_size": 512, "train_batch": "10 images x 5 captions", "decode_batch": 50,
                        "repeats": args.repeats},
              "environment": environment(args.threads) | Runtime(device).describe(),
              "load_average_before": os.getloadavg(),  # other processes on a shared CPU slow every number
              "results": {f"{name}/{precision}/compile-{compiled}": measure(
                  name, args.repeats, Runtime(device, precision, compiled == "on"))
                  for name in args.attention for precision in args.precision for compiled in args.compile}}
    report["load_average_after"] = os.getloadavg()
    for name, r in report["results"].items():
        print(f"{name}: train {r['train']['images_per_second']:.1f} img/s, greedy {r['greedy']['images_per_second']:.1f} "
              f"img/s, beam5 {r['beam5']['images_per_second']:.1f} img/s")
    print("wrote", write_json(args.name, report))


if __name__ == "__main__":
    main()
