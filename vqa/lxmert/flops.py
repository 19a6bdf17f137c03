"""FLOPs of LXMERT per configuration, counted with ``torch.utils.flop_counter.FlopCounterMode``.

    python -m vqa.lxmert.flops [--out lxmert_flops.json]

counts one forward pass of the VQA model on the real 9-5-5 configuration (hidden 768, 12 heads,
random weights: FLOPs do not depend on them) for a question of 20 word pieces and 36 regions,
full and with every-other pruning of ``p`` layers per stack. The counter sees matrix products
(projections, ``q k^T``, ``weights v``, feed-forward layers, heads); element-wise work
(softmax, the entmax bisection, the span mask) is not counted. Attention runs on SDPA's math
backend while counting: the counter has no formula for the fused CPU kernel and would count
``q k^T`` and ``weights v`` as zero.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Sequence

from common.utils import atomic_write_json, console
from common.utils.extras import needs_extra

if TYPE_CHECKING:  # torch, transformers and the model are imported once the command line has been parsed
    import torch
    from omegaconf import DictConfig
    from transformers import LxmertConfig

    from .adapt import Adaptation, LayerDropOptions

NUM_ANSWERS = 3129


def dummy_inputs(config: LxmertConfig, batch: int = 1, words: int = 20, regions: int = 36) -> Dict[str, torch.Tensor]:
    """Full-length inputs (no padding) of the given sizes."""
    import torch

    corners = torch.rand(batch, regions, 2) * 0.5
    return {"input_ids": torch.randint(1, config.vocab_size, (batch, words)),
            "attention_mask": torch.ones(batch, words, dtype=torch.long),
            "visual_feats": torch.randn(batch, regions, config.visual_feat_dim),
            "visual_pos": torch.cat([corners, corners + 0.5], -1),
            "visual_attention_mask": torch.ones(batch, regions, dtype=torch.long)}


def count_flops(model: torch.nn.Module, inputs: Dict[str, torch.Tensor],
                prune: Optional[LayerDropOptions] = None) -> int:
    """FLOPs of one forward pass in eval mode, optionally with ``prune`` layers removed."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from .adapt import pruned_layers

    model.eval()
    with (pruned_layers(model, prune) if prune is not None else nullcontext()), torch.no_grad():
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            model(**inputs)
    return int(counter.get_total_flops())


def measure_flops(model: torch.nn.Module, cfg: DictConfig, adaptation: Adaptation,
                  device: torch.device) -> Dict[str, int]:
    """FLOPs of one question with ``data.max_words`` word pieces and ``data.max_regions`` regions (a run's model:
    full, and pruned when it has LayerDrop)."""
    inputs = {k: v.to(device) for k, v in dummy_inputs(model.config, 1, cfg.data.max_words,
                                                       cfg.data.max_regions).items()}
    flops = {"full": count_flops(model, inputs)}
    if adaptation.layerdrop.active:
        flops["pruned"] = count_flops(model, inputs, adaptation.layerdrop)
    return flops


def flops_report(config: LxmertConfig, drop: LayerDropOptions, words: int = 20, regions: int = 36) -> Dict:
    """Full and pruned FLOPs of ``config``; the pruned model drops ``drop`` layers per stack."""
    import torch

    from .adapt import Adaptation
    from .model import build_vqa_model

    torch.manual_seed(0)
    model = build_vqa_model(config, NUM_ANSWERS, Adaptation())
    inputs = dummy_inputs(config, words=words, regions=regions)
    full = count_flops(model, inputs)
    pruned = count_flops(model, inputs, drop)
    layers = (config.l_layers, config.r_layers, config.x_layers)
    kept = tuple(n - getattr(drop, s) for n, s in zip(layers, ("language", "vision", "cross")))
    return {"layers": "-".join(map(str, layers)), "pruned_layers": "-".join(map(str, kept)),
            "words": words, "regions": regions, "flops_full": full, "flops_pruned": pruned,
            "reduction_percent": 100 * (1 - pruned / full)}


def pretrained_shape() -> LxmertConfig:
    """The pretrained LXMERT's shape: 9-5-5 layers, hidden 768, 12 heads."""
    from transformers import LxmertConfig

    return LxmertConfig()


@needs_extra("lxmert")
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vqa.lxmert.flops", description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="also write the report (config, versions) to this JSON file")
    parser.add_argument("--drop", type=int, default=1, help="layers pruned per stack (the paper's p)")
    args = parser.parse_args(argv)
    from common.utils import results_record

    from .adapt import LayerDropOptions

    config = pretrained_shape()
    drop = LayerDropOptions(language=args.drop, vision=args.drop, cross=args.drop)
    report = flops_report(config, drop)
    print(f"LXMERT {report['layers']}: {report['flops_full'] / 1e9:.3f} GFLOPs; pruned to {report['pruned_layers']}: "
          f"{report['flops_pruned'] / 1e9:.3f} GFLOPs ({report['reduction_percent']:.2f}% fewer)")
    if args.out:  # nothing is written unless asked, and then only there
        atomic_write_json(Path(args.out), results_record({"drop": args.drop}, **report))
        console.files_written([args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
