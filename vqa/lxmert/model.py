"""The VQA model: ``transformers.LxmertForQuestionAnswering`` with adapted attention.

The answer head is LXMERT's own (``Linear(h, 2h) -> GeLU -> LayerNorm -> Linear(2h, A)`` on the
pooled output), over the ``A`` answers of the answer vocabulary (3,129 for VQA v2). Training
uses binary cross-entropy on the soft scores, times ``A`` as in the LXMERT code (:func:`vqa_loss`).

A pretrained checkpoint in the Hugging Face format (``config.json`` + weights, as written by
``save_pretrained``) loads from a local directory, from an ``LxmertModel`` or from the
``LxmertForPreTraining`` checkpoint (``unc-nlp/lxmert-base-uncased``): every backbone weight
is used; only the pre-training heads (``cls.*``, ``obj_predict_head.*``) are left out, and the
answer head's last layer is new whenever the checkpoint's answer count differs. :func:`predict` gives the
answer logits of every question of a loader, with the LayerDrop layers pruned when asked.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
import transformers
from torch import Tensor
from torch.utils.data import DataLoader
from transformers import LxmertConfig, LxmertForQuestionAnswering

from common.utils import console
from common.utils.runtime import Runtime

from .adapt import Adaptation, adapt_lxmert, adaptive_attention, attention_label, pruned_layers
from .data import model_inputs

PRETRAINING_HEADS = ("cls.", "obj_predict_head.")
DOWNLOAD_HINT = ("download a Hugging Face LXMERT checkpoint into it, e.g. "
                 "`huggingface-cli download unc-nlp/lxmert-base-uncased --local-dir <dir>`")

#: What a missing pretrained directory needs.
PRETRAINED_FIX = f"model.pretrained must be a local directory in the Hugging Face format; {DOWNLOAD_HINT}"


class PretrainedError(ValueError):
    """A pretrained directory that is missing or cannot be used."""


@dataclass
class LoadReport:
    """How a pretrained checkpoint mapped onto the model."""

    checkpoint: str
    loaded: int                                                  # tensors taken from the checkpoint
    unused: List[str] = field(default_factory=list)              # pre-training heads only
    initialised: List[str] = field(default_factory=list)         # answer-head tensors that are new
    answers_from_pretraining: Optional[int] = None               # classifier rows copied from the QA head


def vqa_loss(logits: Tensor, target: Tensor) -> Tensor:
    """``A * mean BCE(sigmoid(logits), target)``: the sum over answers, averaged over the batch."""
    return F.binary_cross_entropy_with_logits(logits, target) * logits.shape[-1]


def build_vqa_model(config: LxmertConfig, num_answers: int, adaptation: Adaptation) -> LxmertForQuestionAnswering:
    """A randomly initialised adapted model (to restore a fine-tuned checkpoint into, or to count FLOPs)."""
    config = LxmertConfig.from_dict({**config.to_dict(), "num_qa_labels": num_answers})
    return adapt_lxmert(LxmertForQuestionAnswering(config), adaptation)


def load_vqa_model(pretrained: Union[str, Path], num_answers: int,
                   adaptation: Adaptation) -> Tuple[LxmertForQuestionAnswering, LoadReport]:
    """Load ``pretrained`` (a local Hugging Face directory), resize the answer head, adapt the attention. The weights
    are float32 whatever the checkpoint stores (``train.precision`` chooses the arithmetic)."""
    path = Path(pretrained)
    if not (path / "config.json").is_file():
        raise PretrainedError(f"{path / 'config.json'} does not exist: {PRETRAINED_FIX}")
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # we check and report the loading below
    try:
        model, info = LxmertForQuestionAnswering.from_pretrained(
            path, num_qa_labels=num_answers, ignore_mismatched_sizes=True, output_loading_info=True,
            dtype=torch.float32)
    except OSError as err:
        raise PretrainedError(f"{path}: cannot load LXMERT weights ({err}); {DOWNLOAD_HINT}") from err
    finally:
        transformers.logging.set_verbosity(verbosity)
    unused = sorted(info["unexpected_keys"])
    stray = [k for k in unused if not k.startswith(PRETRAINING_HEADS)]
    mismatched = sorted(key for key, *_ in info["mismatched_keys"])
    initialised = sorted(set(info["missing_keys"]) | set(mismatched))
    absent = [k for k in initialised if not k.startswith("answer_head.")]
    if stray or absent:
        raise PretrainedError(f"{path} is not an LXMERT checkpoint for this architecture: "
                              f"{len(absent)} backbone weights missing (e.g. {absent[:3]}), "
                              f"{len(stray)} unknown weights (e.g. {stray[:3]}); check config.json "
                              f"(l_layers/x_layers/r_layers, hidden_size)")
    loaded = len(model.state_dict()) - len(initialised)
    return adapt_lxmert(model, adaptation), LoadReport(str(path), loaded, unused, initialised)


@torch.no_grad()
def head_parameters(model: torch.nn.Module) -> Dict[str, float]:
    """The learned per-head values to log: ``span/<label>/h<i>`` (``zS``) and ``alpha/<label>/h<i>``."""
    values: Dict[str, float] = {}
    for name, _, module in adaptive_attention(model):
        label = attention_label(name)
        span = module.attend.span
        if span is not None:
            values.update({f"span/{label}/h{i}": float(v) for i, v in enumerate(span.spans)})
        alpha = getattr(module.attend.normalizer, "alpha", None)
        if isinstance(alpha, Tensor) and alpha.dim() == 1:
            values.update({f"alpha/{label}/h{i}": float(v) for i, v in enumerate(alpha)})
    return values


@torch.no_grad()
def predict(model: LxmertForQuestionAnswering, loader: DataLoader, runtime: Runtime, prune: bool,
            adaptation: Adaptation, progress: bool = True) -> Tuple[List[int], torch.Tensor]:
    """Question ids and answer logits of every question in ``loader`` (eval mode, pruned if asked)."""
    model.eval()
    ids, logits = [], []
    context = pruned_layers(model, adaptation.layerdrop) if prune and adaptation.layerdrop.active else nullcontext()
    with context, runtime.autocast():
        for batch in console.progress(loader, desc="eval batch", enabled=progress):
            logits.append(model(**model_inputs(batch, runtime.device)).question_answering_score.float().cpu())
            ids += batch["question_id"].tolist()
    return ids, torch.cat(logits)
