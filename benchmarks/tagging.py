"""The PoS tagger's training speed against a plain ``nn.TransformerEncoder`` tagger of the same size.

    python benchmarks/tagging.py [--treebank UD_English-GUM] [--batches 40] [--repeats 3] [--threads 1]
                                 [--variants pe-add pr conv1d conv2d temp] [--name tagging]

Every side trains on the same batches of the treebank (the first ``--batches`` of a bucketed epoch, as
``tagging.train`` draws them): forward, cross-entropy, backward and an RMSprop update. The reference
(``reference``) has the same inputs (word + added position embeddings + the character CNN), width,
layers and heads, as ``nn.TransformerEncoder`` layers (feed-forward width = model width, dropout 0.1,
post-norm): the standard PyTorch building block, with SDPA attention. Sides are timed in
alternation, ``--repeats`` rounds; per side the median wall and CPU seconds per update, the tokens (real
words) per second, the seconds one epoch takes at that rate, and the ratio to the reference. One torch
thread by default: the reproduction runs two single-thread trainings on the two cores.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._measure import environment, interleaved_wall_cpu, write_json  # noqa: E402
from common.utils import default_data_root  # noqa: E402
from tagging.config import load_config  # noqa: E402
from common.text.batching import bucketed_order  # noqa: E402
from tagging.data import batches, load_treebank  # noqa: E402
from tagging.model import Tagger  # noqa: E402
from tagging.predict import build_model  # noqa: E402


class ReferenceTagger(nn.Module):
    """The tagger's inputs (PE[add]) and output layer around ``nn.TransformerEncoder``."""

    def __init__(self, ours: Tagger, layers: int, heads: int, dropout: float):
        super().__init__()
        self.inputs = ours  # only its embeddings and character CNN are used
        width = ours.output.in_features // 2
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=width, dropout=dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.output = nn.Linear(2 * width, ours.output.out_features)

    def forward(self, words, chars, char_index, mask):
        x = self.inputs.embed(words, chars, char_index)
        return self.output(torch.cat([x, self.encoder(x, src_key_padding_mask=~mask)], -1))


def trainer(model: nn.Module, train_batches):
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3, alpha=0.9, eps=1e-7)
    model.train()

    def epoch_slice():
        for b in train_batches:
            logits = model(b.words, b.chars, b.char_index, b.mask)
            loss = F.cross_entropy(logits.flatten(0, 1), b.tags.flatten(), ignore_index=-100)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return epoch_slice


def parameters_outside_inputs(model: nn.Module, inputs: nn.Module) -> int:
    shared = {id(p) for p in inputs.parameters()} if inputs is not model else set()
    own = [p for name, p in model.named_parameters() if not name.startswith(("word_embed", "position_embed", "chars"))]
    return sum(p.numel() for p in own if id(p) not in shared)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--treebank", default="UD_English-GUM")
    parser.add_argument("--data-root")
    parser.add_argument("--batches", type=int, default=40, help="training batches per timed slice (default 40)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", nargs="+", default=["pe-add", "pr", "conv1d", "conv2d", "temp"])
    parser.add_argument("--name", default="tagging", help="writes benchmarks/results/<name>.json (default tagging)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_config([f"treebank={args.treebank}"])
    treebank = load_treebank(default_data_root(args.data_root), args.treebank)
    train = treebank.chunks["train"]
    order = bucketed_order([len(c.words) for c in train], cfg.train.batch_size, torch.Generator().manual_seed(0))
    per_epoch = len(order)
    slice_batches = list(batches(train, cfg.train.batch_size, order[:args.batches]))
    tokens = sum(int(b.mask.sum()) for b in slice_batches)
    fns, sizes = {}, {}
    for variant in args.variants:
        torch.manual_seed(0)
        cfg.variant = variant
        model = build_model(cfg, treebank.vocab)
        fns[variant] = trainer(model, slice_batches)
        sizes[variant] = parameters_outside_inputs(model, model)
    torch.manual_seed(0)
    cfg.variant = "pe-add"
    reference = ReferenceTagger(build_model(cfg, treebank.vocab), cfg.model.layers, cfg.model.heads, cfg.model.dropout)
    fns["reference"] = trainer(reference, slice_batches)
    sizes["reference"] = sum(p.numel() for n, p in reference.named_parameters()
                             if not n.startswith(("inputs.word_embed", "inputs.position_embed", "inputs.chars")))
    times = interleaved_wall_cpu(fns, args.repeats)
    ref = times["reference"]["wall_median_ms"]
    sides = {}
    for name, t in times.items():
        per_update = t["wall_median_ms"] / 1e3 / len(slice_batches)
        sides[name] = {**t, "seconds_per_update": per_update, "tokens_per_second": tokens / (t["wall_median_ms"] / 1e3),
                       "seconds_per_epoch": per_update * per_epoch, "ratio_to_reference": t["wall_median_ms"] / ref,
                       "parameters_beyond_inputs": sizes[name]}
        print(f"{name:10s} {per_update * 1e3:7.1f} ms/update  {sides[name]['tokens_per_second']:8.0f} tokens/s  "
              f"{sides[name]['seconds_per_epoch']:6.1f} s/epoch  {sides[name]['ratio_to_reference']:.2f}x reference")
    path = write_json(args.name,
                      {"treebank": treebank.name, "batches": len(slice_batches), "tokens": tokens,
                       "updates_per_epoch": per_epoch, "repeats": args.repeats,
                       "environment": environment(args.threads), "sides": sides})
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
