"""A pretrained encoder with a sequence-classification head, its attention routed through the suite
(:func:`common.attention.surgery.swap_attention`), and the GLUE examples encoded by its tokenizer."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from common.attention.registry import is_stochastic
from common.attention.surgery import swap_attention
from common.utils.paths import default_data_root

from .data import GlueSplit, read_split
from .tasks import TaskSpec, get_task


@dataclass
class Encoded:
    """A split tokenized once: per example the token ids (and segment ids), its label and its length."""

    features: List[Dict[str, List[int]]]
    labels: Sequence

    @property
    def lengths(self) -> List[int]:
        return [len(f["input_ids"]) for f in self.features]

    def __len__(self) -> int:
        return len(self.features)


def load_tokenizer(model_dir: Path):
    """The checkpoint's own tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def load_classifier(model_dir: Path, task: TaskSpec, attention: Optional[Mapping], dropout: Optional[float] = None
                    ) -> Tuple[nn.Module, List[str]]:
    """``(model, newly initialised keys)``: the checkpoint at ``model_dir`` with a fresh head of
    ``task.num_labels`` outputs, every supported attention module swapped to ``attention`` (a mapping of
    :class:`~common.attention.blocks.AttendConfig` fields, e.g. ``{"normalizer": "bam-wc"}``; ``None``
    leaves the model's own attention) with attention dropout ``dropout`` (``None``: the checkpoint's). The weights
    are float32 whatever the checkpoint stores (transformers 5 would keep a half checkpoint's dtype and train it
    without a loss scaler); ``train.precision`` chooses the arithmetic."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()  # the head is new by design; the caller reports it in one line, not a table
    logging.disable_progress_bar()  # a bar per load would interleave with the run's own progress lines
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(  # a head of another size is new too
            model_dir, num_labels=task.num_labels, output_loading_info=True, ignore_mismatched_sizes=True,
            dtype=torch.float32)
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
    if attention is not None:
        swap_attention(model, dict(attention), dropout=dropout)
    return model, sorted({*info["missing_keys"], *(key for key, *_ in info["mismatched_keys"])})


def attention_dropout(options) -> Optional[float]:
    """The attention dropout of a config's ``attention`` options: ``noise_dropout`` for a stochastic normalizer when
    set, else ``dropout`` (``None``: the checkpoint's own)."""
    stochastic = options.noise_dropout is not None and is_stochastic(options.name)
    return options.noise_dropout if stochastic else options.dropout


def encode(tokenizer, split: GlueSplit, max_length: int) -> Encoded:
    """Token ids of every example of ``split`` (pairs truncated longest-first to ``max_length``)."""
    texts = (split.text_a,) if split.text_b is None else (split.text_a, split.text_b)
    batch = tokenizer(*texts, truncation=True, max_length=max_length)
    keys = [k for k in ("input_ids", "token_type_ids") if k in batch]
    features = [{k: batch[k][i] for k in keys} for i in range(len(split))]
    return Encoded(features, split.labels if split.labels is not None else [None] * len(split))


@dataclass
class GlueData:
    """A task's train and dev splits, tokenized once for every seed."""

    spec: TaskSpec
    tokenizer: object
    train: Encoded
    dev: Encoded

    @classmethod
    def load(cls, cfg, model_dir: Path) -> "GlueData":
        """``cfg.task``'s splits under ``cfg.data_root``, cut to ``cfg.data.max_length`` tokens."""
        spec, root = get_task(cfg.task), default_data_root(cfg.data_root)
        # both splits are read first: a bad file is refused before the tokenizer loads
        splits = [read_split(spec, split, root) for split in ("train", "dev")]
        tokenizer = load_tokenizer(model_dir)
        train, dev = (encode(tokenizer, split, cfg.data.max_length) for split in splits)
        return cls(spec, tokenizer, train, dev)


def collate(tokenizer, encoded: Encoded, indices: Sequence[int], regression: bool) -> Dict[str, Tensor]:
    """One batch padded to its longest example (dynamic padding), with ``labels`` when the split has them."""
    batch = dict(tokenizer.pad([encoded.features[i] for i in indices], return_tensors="pt"))
    labels = [encoded.labels[i] for i in indices]
    if labels[0] is not None:
        batch["labels"] = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)
    return batch


def task_loss(logits: Tensor, labels: Tensor, regression: bool) -> Tensor:
    """Cross-entropy, or the squared error of the single output for a regression task (STS-B)."""
    if regression:
        return nn.functional.mse_loss(logits.float().squeeze(-1), labels)
    return nn.functional.cross_entropy(logits.float(), labels)


def parameter_groups(model, weight_decay: float) -> List[dict]:
    """AdamW groups: no decay on biases and normalisation weights (BERT's recipe)."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            exempt = parameter.dim() < 2 or "LayerNorm" in name or "layer_norm" in name
            (no_decay if exempt else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
