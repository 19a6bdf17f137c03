"""Translation throughput: training tokens/s and decoding sentences/s (batched beam vs one sentence at a time).

    python benchmarks/mt.py [--data-root DIR] [--run RUN_DIR ...] [--threads 1] [--out NAME]

1. ``train``: target tokens per second of full training steps (forward, label-smoothed loss,
   backward, clipping, Adam) for the CPU presets' models (``lstm-cpu``, ``transformer-cpu``)
   on real Multi30k batches of ``--max-tokens`` padded tokens (the first ``--batches``
   batches of epoch 0).
2. ``decode``: sentences per second translating the first ``--sentences`` Multi30k
   validation sentences with batched beam search (``--beam``), with greedy search, and with
   beam search run one sentence at a time (what an unbatched implementation costs). With
   ``--run`` the trained model of that run directory (per architecture) is used (realistic
   output lengths); otherwise untrained models, which decode up to the length limit.

The machine is shared: the 1-minute load average before and after is recorded, and the
numbers are medians over ``--repeats``. Output: ``benchmarks/results/<out>.json``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _measure import environment, write_json  # noqa: E402

from common.utils import default_data_root  # noqa: E402
from mt.batching import iterate_batches, token_batches  # noqa: E402
from mt.config import load_config, to_dict  # noqa: E402
from mt.data import ensure_prepared, load_split  # noqa: E402
from mt.run import RunFiles, load_model, new_model  # noqa: E402
from mt.translation import translate_ids  # noqa: E402


def train_tokens_per_second(model, batches, pad: int, repeats: int) -> float:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()

    def step(batch):
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=pad, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()

    step(batches[0])  # warm-up
    tokens = sum(int(b.tgt_out.ne(pad).sum()) for b in batches)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            step(batch)
        rates.append(tokens / (time.perf_counter() - start))
    return statistics.median(rates)


def sentences_per_second(fn, n: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--run", type=Path, action="append", default=[],
                        help="a trained mt run directory for decoding (repeatable: one per architecture)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=3000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="mt")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load_before = os.getloadavg()[0]
    prepared = ensure_prepared("multi30k", default_data_root(args.data_root))
    train = load_split(prepared, "train", 125)
    batches = list(iterate_batches(train, token_batches(train.src_lengths, train.tgt_lengths, args.max_tokens,
                                                        seed=0)[: args.batches], prepared.src_vocab.pad,
                                   prepared.tgt_vocab.pad))
    valid = load_split(prepared, "val").src[: args.sentences]
    result = {"train_tokens_per_second": {}, "decode_sentences_per_second": {}}
    for preset in ("lstm-cpu", "transformer-cpu"):
        cfg = to_dict(load_config(preset))
        model = new_model(cfg, prepared.src_vocab, prepared.tgt_vocab)
        result["train_tokens_per_second"][preset] = train_tokens_per_second(model, batches, prepared.tgt_vocab.pad,
                                                                            args.repeats)
        trained = [run for run in args.run if RunFiles(run).config()["model"]["arch"] == cfg["model"]["arch"]]
        decoder = load_model(RunFiles(trained[0])) if trained else model
        decoder.eval()
        common = dict(sources=valid, src_pad=prepared.src_vocab.pad, tgt_vocab=prepared.tgt_vocab)
        n = len(valid)
        result["decode_sentences_per_second"][preset] = {
            "trained_run": str(trained[0]) if trained else None,
            f"beam{args.beam}_batched": sentences_per_second(
                lambda: translate_ids(decoder, beam_size=args.beam, batch_size=64, **common), n, args.repeats),
            f"beam{args.beam}_one_sentence_at_a_time": sentences_per_second(
                lambda: translate_ids(decoder, beam_size=args.beam, batch_size=1, **common), n, 1),
            "greedy_batched": sentences_per_second(
                lambda: translate_ids(decoder, beam_size=1, batch_size=64, **common), n, args.repeats),
        }
    payload = {"benchmark": "mt", "settings": vars(args) | {"run": [str(r) for r in args.run]},
               "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
               "environment": environment(args.threads), **result}
    print(write_json(args.out, payload))
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
