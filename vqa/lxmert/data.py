"""LXMERT's inputs from the shared VQA data (:mod:`vqa.data`): BERT word pieces, and region
features with boxes normalised by the image size (LXMERT's ``visual_pos``)."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable, Dict, List

import torch
from torch import Tensor

from vqa.data import VQADataError


#: Where a missing word-piece vocabulary comes from.
VOCAB_FIX = "it must be bert-base-uncased's vocab.txt (in this workspace: <data-root>/text/bert-base-uncased/vocab.txt)"


def bert_encoder(vocab_file: Path, max_words: int) -> Callable[[str], List[int]]:
    """``question -> [CLS] word pieces [SEP]`` ids, at most ``max_words`` of them (LXMERT: 20)."""
    if not Path(vocab_file).is_file():
        raise VQADataError(f"BERT vocabulary {vocab_file} (data.vocab) does not exist; {VOCAB_FIX}")
    from transformers import BertTokenizer

    # transformers 4 names the argument vocab_file, transformers 5 vocab
    argument = "vocab_file" if "vocab_file" in inspect.signature(BertTokenizer.__init__).parameters else "vocab"
    tokenizer = BertTokenizer(**{argument: str(vocab_file)})
    if tokenizer.pad_token_id != 0:
        raise VQADataError(f"{vocab_file}: [PAD] must be the first entry (id 0), as in BERT's vocab.txt")

    def encode(question: str) -> List[int]:
        return tokenizer.encode(question, max_length=max_words, truncation=True)

    return encode


def normalised_boxes(boxes: Tensor, image_size: Tensor) -> Tensor:
    """Boxes ``[B, N, 4]`` as ``(x1, y1, x2, y2)`` pixels divided by the image size ``[B, 2]``
    ``(height, width)``: LXMERT's ``visual_pos`` in ``[0, 1]``."""
    height, width = image_size[:, 0].to(boxes.dtype), image_size[:, 1].to(boxes.dtype)
    return boxes / torch.stack([width, height, width, height], dim=-1).unsqueeze(1)


def model_inputs(batch: Dict, device: torch.device) -> Dict[str, Tensor]:
    """The keyword arguments of ``LxmertForQuestionAnswering`` for a :func:`vqa.data.collate` batch."""
    inputs = {
        "input_ids": batch["question_tokens"],
        "attention_mask": batch["question_mask"].long(),
        "visual_feats": batch["features"],
        "visual_pos": normalised_boxes(batch["boxes"], batch["image_size"]),
        "visual_attention_mask": batch["region_mask"].long(),
    }
    return {name: value.to(device, non_blocking=True) for name, value in inputs.items()}
