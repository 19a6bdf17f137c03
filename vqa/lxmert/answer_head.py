"""Start the VQA answer classifier from LXMERT's pre-training QA head, as LXMERT's fine-tuning does.

LXMERT pre-trains a QA head over 9,500 answers (``all_ans.json``; the Hugging Face checkpoint
``unc-nlp/lxmert-base-uncased`` holds it as ``answer_head.logit_fc.3``). Its VQA fine-tuning
(``airsplay/lxmert``, ``--loadLXMERTQA``; ``src/pretrain/qa_answer_table.py: load_lxmert_qa``)
copies the output row of every VQA answer that the pre-training table also holds, after
LXMERT's answer conversion (lower case; drop a final ``.`` and a leading ``a``/``an``/``the``;
``one``..``ten`` -> digits; ``grey`` -> ``gray``; ``a man`` -> ``man``), and sets the other rows
to zero. The hidden layers of the head load with the checkpoint as they are.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Dict, List, Sequence, Tuple, Union

import torch
from safetensors import safe_open
from torch import Tensor

OUTPUT = "answer_head.logit_fc.3"
ANS_CONVERT = {"a man": "man", "the man": "man", "a woman": "woman", "the woman": "woman", "one": "1", "two": "2",
               "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9",
               "ten": "10", "grey": "gray"}


def convert_answer(answer: str) -> str:
    """LXMERT's ``AnswerTable.convert_ans``."""
    if not answer:
        return ""
    answer = answer.lower()
    if answer[-1] == ".":
        answer = answer[:-1].strip()
    for article in ("a ", "an ", "the "):
        if answer.startswith(article):
            answer = answer[len(article):].strip()
    return ANS_CONVERT.get(answer, answer)


#: Where a missing pre-training answer table comes from.
ANSWER_TABLE_FIX = ("it is airsplay/lxmert's data/lxmert/all_ans.json (in this workspace: "
                    "<data-root>/vqa/lxmert/all_ans.json.gz)")


def load_answer_table(path: Union[str, Path]) -> List[str]:
    """The pre-training answers in label order, from ``all_ans.json`` (gzipped or not)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pre-training answer table {path} does not exist; {ANSWER_TABLE_FIX}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        entries = json.load(f)
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("ans"), str) for e in entries):
        raise ValueError(f"{path}: expected a list of {{'ans': str, 'dsets': [...]}} entries (LXMERT's all_ans.json)")
    return [e["ans"] for e in entries]


def read_checkpoint_tensors(directory: Union[str, Path], names: Sequence[str]) -> Dict[str, Tensor]:
    """``names`` from a Hugging Face checkpoint directory (safetensors, sharded or not, or ``pytorch_model.bin``)."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {name: directory / weight_map[name] for name in names if name in weight_map}
    elif (directory / "model.safetensors").is_file():
        files = {name: directory / "model.safetensors" for name in names}
    elif (directory / "pytorch_model.bin").is_file():
        state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
        return {name: state[name] for name in names if name in state}
    else:
        raise FileNotFoundError(f"{directory} holds no model.safetensors, sharded safetensors or pytorch_model.bin")
    tensors = {}
    for name, file in files.items():
        with safe_open(str(file), framework="pt") as f:
            if name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


@torch.no_grad()
def transfer_answer_head(model, pretrained: Union[str, Path], table: Sequence[str],
                         answers: Sequence[str]) -> Tuple[int, int]:
    """Copy the pre-training QA rows of ``answers`` into ``model``'s answer classifier.

    ``table`` lists the checkpoint's answers in label order. Returns ``(copied, zeroed)``.
    """
    names = (f"{OUTPUT}.weight", f"{OUTPUT}.bias")
    found = read_checkpoint_tensors(pretrained, names)
    if len(found) != 2:
        raise ValueError(f"{pretrained} has no pre-training QA head ({OUTPUT}); use the LxmertForPreTraining "
                         f"checkpoint or set model.answer_table=null")
    weight, bias = found[names[0]], found[names[1]]
    if weight.shape[0] != len(table):
        raise ValueError(f"{pretrained}: the QA head has {weight.shape[0]} answers but the answer table lists "
                         f"{len(table)}; they must come from the same pre-training")
    layer = model.answer_head.logit_fc[-1]
    if layer.weight.shape[1] != weight.shape[1]:
        raise ValueError(f"{pretrained}: QA head input size {weight.shape[1]} differs from the model's {layer.weight.shape[1]}")
    index = {answer: i for i, answer in enumerate(table)}
    copied = 0
    for label, answer in enumerate(answers):
        row = index.get(convert_answer(answer))
        if row is None:
            layer.weight[label].zero_()
            layer.bias[label].zero_()
        else:
            layer.weight[label].copy_(weight[row])
            layer.bias[label].copy_(bias[row])
            copied += 1
    return copied, len(answers) - copied
