"""The answer classifier starts from LXMERT's pre-training QA head, as LXMERT's fine-tuning does."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import LxmertForPreTraining

from vqa.answers import AnswerVocab
from vqa.lxmert import Adaptation, load_vqa_model
from vqa.lxmert import train as lxmert_train
from vqa.lxmert.answer_head import convert_answer, load_answer_table, transfer_answer_head

from .helpers import tiny_config

TABLE = ["yes", "no", "2", "red", "man"]


@pytest.mark.parametrize("given, converted", [("The Man.", "man"), ("Two", "2"), ("an apple", "apple"),
                                              ("grey", "gray"), ("a woman", "woman"), ("", "")])
def test_answers_are_converted_as_lxmert_does(given, converted):
    assert convert_answer(given) == converted


@pytest.fixture
def pretraining_dir(tmp_path):
    torch.manual_seed(0)
    LxmertForPreTraining(tiny_config(num_qa_labels=len(TABLE))).save_pretrained(tmp_path / "pre")
    return tmp_path / "pre"


def test_shared_answers_copy_their_rows_and_the_others_start_at_zero(pretraining_dir):
    saved = LxmertForPreTraining.from_pretrained(pretraining_dir).answer_head.logit_fc[-1]
    answers = ["no", "two", "blue", "the man"]
    model, _ = load_vqa_model(pretraining_dir, len(answers), Adaptation())
    assert transfer_answer_head(model, pretraining_dir, TABLE, answers) == (3, 1)
    layer = model.answer_head.logit_fc[-1]
    for label, row in ((0, 1), (1, 2), (3, 4)):
        assert torch.equal(layer.weight[label], saved.weight[row]) and layer.bias[label] == saved.bias[row]
    assert not layer.weight[2].any() and layer.bias[2] == 0


def test_a_table_of_another_size_is_refused(pretraining_dir):
    model, _ = load_vqa_model(pretraining_dir, 2, Adaptation())
    with pytest.raises(ValueError, match="QA head has 5 answers but the answer table lists 4"):
        transfer_answer_head(model, pretraining_dir, TABLE[:4], ["yes", "no"])


def test_train_cli_from_a_pretraining_checkpoint(vqa_root, pretraining_dir, tmp_path):
    root, fixture, vocab_size = vqa_root
    table = tmp_path / "all_ans.json"
    table.write_text(json.dumps([{"ans": a, "dsets": ["vqa"]} for a in TABLE]))
    LxmertForPreTraining(tiny_config(num_qa_labels=len(TABLE), vocab_size=vocab_size)).save_pretrained(pretraining_dir)
    out = tmp_path / "run"
    args = ["--variant", "span", "--pretrained", str(pretraining_dir), "--data-root", str(root), "--out", str(out),
            "--no-progress", f"model.answer_table={table}", "data.answers=vqa/mcan/answer_dict.json",
            "data.vocab=vocab.txt", "train.batch_size=16", "train.epochs=1", "data.eval_split=null"]
    assert lxmert_train.main(args) == 0
    pretrained = json.loads((out / "results.json").read_text())["pretrained"]
    shared = sum(convert_answer(a) in TABLE for a in AnswerVocab.load(fixture.answers).answers)
    assert pretrained["answers_from_pretraining"] == shared == 4       # yes, no, 2, red
    assert pretrained["unused_pretraining_heads"] > 0


@pytest.mark.realdata
def test_lxmert_pretraining_table_covers_the_vqa_answers(attn_data_root):
    table = load_answer_table(attn_data_root / "vqa/lxmert/all_ans.json.gz")
    answers = AnswerVocab.load(attn_data_root / "vqa/lxmert/vqa/trainval_ans2label.json").answers
    missing = sorted(a for a in answers if convert_answer(a) not in set(table))
    assert len(table) == 9500 and missing == ["", "1 4", "1 world", "5 star", "visilab"]
