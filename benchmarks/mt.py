"""Translation throughput: training tokens/s and decoding sentences/s (batched beam vs one sentence at a time).

    python benchmarks/mt.py [--data-root DIR] [--run RUN_DIR ...] [--threads 1] [--out NAME]
    python benchmarks/mt.py --device cuda --precision fp32 bf16 --compile off default --presets transformer-base

1. ``train``: target tokens per second of full training steps (forward, label-smoothed loss,
   backward, clipping, Adam) for each preset's model (default: the CPU presets ``lstm-cpu``,
   ``transformer-cpu``) on real Multi30k batches of ``--max-tokens`` padded tokens (the first
   ``--batches`` batches of epoch 0), in every ``--precision`` and ``--compile`` setting. Each
   Transformer preset is measured beside a plain ``torch.nn.Transformer`` of the same size
   (embeddings, sinusoidal positions, pre/post-norm, tied output, the same batches, loss and
   optimiser), timings interleaved: ``vs_torch_transformer`` is our tokens/s over its.
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
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._measure import environment, write_json  # noqa: E402

from common.utils import default_data_root  # noqa: E402
from mt.batching import iterate_batches, token_batches  # noqa: E402
from mt.config import load_config, to_dict  # noqa: E402
from common.utils.runtime import COMPILE_MODES, Runtime  # noqa: E402
from mt.data import ensure_prepared, load_split  # noqa: E402
from mt.models.transformer import sinusoidal_positions  # noqa: E402
from mt.run import RunFiles, load_model, new_model  # noqa: E402
from mt.translation import translate_ids  # noqa: E402


class TorchTransformer(nn.Module):
    """The reference: ``torch.nn.Transformer`` with our Transformer's sizes, embeddings and output."""

    def __init__(self, src_vocab: int, tgt_vocab: int, src_pad: int, tgt_pad: int, dim: int, heads: int,
                 ffn_dim: int, enc_layers: int, dec_layers: int, dropout: float, pre_norm: bool = False,
                 tie_output: bool = True, **_attention_options):
        super().__init__()
        self.dim = dim
        self.src_embed = nn.Embedding(src_vocab, dim, padding_idx=src_pad)
        self.tgt_embed = nn.Embedding(tgt_vocab, dim, padding_idx=tgt_pad)
        self.register_buffer("positions", sinusoidal_positions(1024, dim), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.core = nn.Transformer(dim, heads, enc_layers, dec_layers, ffn_dim, dropout, batch_first=True,
                                   norm_first=pre_norm)
        self.output = nn.Linear(dim, tgt_vocab, bias=False)
        if tie_output:
            self.output.weight = self.tgt_embed.weight

    def _embed(self, embed: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        return self.dropout(embed(tokens) * self.dim ** 0.5 + self.positions[: tokens.shape[1]])

    def forward(self, src, src_mask, tgt_in):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1], device=tgt_in.device)
        hidden = self.core(self._embed(self.src_embed, src), self._embed(self.tgt_embed, tgt_in), tgt_mask=causal,
                           src_key_padding_mask=~src_mask, memory_key_padding_mask=~src_mask, tgt_is_causal=True)
        return self.output(hidden)


def training_step(model, runtime: Runtime, pad: int):
    """One update on a batch: forward under the runtime's precision, label-smoothed CE, backward,
    clipping, Adam."""
    forward = runtime.compile(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()

    def step(batch):
        with runtime.autocast():
            logits = forward(batch.src, batch.src_mask, batch.tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=pad,
                               label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        runtime.backward_step(loss, optimizer, clip=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0))

    return step


def train_tokens_per_second(steps: dict, batches, pad: int, repeats: int, runtime: Runtime) -> dict:
    """Target tokens per second of each ``name -> step`` over ``batches``, the passes interleaved;
    medians over ``repeats`` (after one warm-up pass, which also compiles)."""
    tokens = sum(int(b.tgt_out.ne(pad).sum()) for b in batches)
    rates = {name: [] for name in steps}
    for round_ in range(repeats + 1):
        for name, step in steps.items():
            runtime.synchronize()
            start = time.perf_counter()
            for batch in batches:
                step(batch)
            runtime.synchronize()
            if round_:  # the first round warms up
                rates[name].append(tokens / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in rates.items()}


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
    parser.add_argument("--presets", nargs="+", default=["lstm-cpu", "transformer-cpu"])
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--compile", nargs="+", default=["off"], choices=("off", "on", *COMPILE_MODES[1:]),
                        help="torch.compile modes (on = default; reduce-overhead: CUDA graphs, CUDA only)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=3000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-decode", action="store_true", help="training throughput only")
    parser.add_argument("--out", default="mt")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load_before = os.getloadavg()[0]
    prepared = ensure_prepared("multi30k", default_data_root(args.data_root))
    train = load_split(prepared, "train", 125)
    plain = Runtime.create(args.device)
    batches = [plain.to_device(b) for b in iterate_batches(
        train, token_batches(train.src_lengths, train.tgt_lengths, args.max_tokens, seed=0)[: args.batches],
        prepared.src_vocab.pad, prepared.tgt_vocab.pad)]
    valid = load_split(prepared, "val").src[: args.sentences]
    pad = prepared.tgt_vocab.pad
    result = {"train_tokens_per_second": {}, "decode_sentences_per_second": {}}
    for preset in args.presets:
        cfg = to_dict(load_config(preset))
        model = new_model(cfg, prepared.src_vocab, prepared.tgt_vocab).to(plain.device)
        reference = None
        if cfg["model"]["arch"] == "transformer":
            options = {k: v for k, v in cfg["model"].items() if k != "arch"}
            reference = TorchTransformer(len(prepared.src_vocab), len(prepared.tgt_vocab), prepared.src_vocab.pad,
                                         pad, **options).to(plain.device)
        for precision in args.precision:
            for compiled in args.compile:
                runtime = Runtime(plain.device, precision, "default" if compiled == "on" else compiled)
                steps = {"ours": training_step(model, runtime, pad)}
                if reference is not None:
                    steps["torch.nn.Transformer"] = training_step(reference, runtime, pad)
                rates = train_tokens_per_second(steps, batches, pad, args.repeats, runtime)
                if reference is not None:
                    rates["vs_torch_transformer"] = rates["ours"] / rates["torch.nn.Transformer"]
                result["train_tokens_per_second"][f"{preset}/{precision}/compile-{compiled}"] = rates
        if args.no_decode:
            continue
        trained = [run for run in args.run if RunFiles(run).config()["model"]["arch"] == cfg["model"]["arch"]]
        decoder = (load_model(RunFiles(trained[0])) if trained else model).to(plain.device)
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
               "environment": environment(args.threads) | plain.describe(), **result}
    print(write_json(args.out, payload))
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
