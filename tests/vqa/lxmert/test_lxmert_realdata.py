"""LXMERT's real answer vocabulary and BERT's real WordPiece vocabulary through the pipeline."""
from __future__ import annotations

import json

import pytest

from vqa.answers import AnswerVocab
from vqa.fixtures import write_vqa_fixture
from vqa.lxmert import train as lxmert_train
from vqa.lxmert.data import bert_encoder
from vqa.data import data_path

pytestmark = pytest.mark.realdata


def _config(attn_data_root, *overrides):
    return lxmert_train.load_config("softmax", [f"data_root={attn_data_root}", *overrides])


def test_packaged_config_names_the_real_answer_and_word_files(attn_data_root):
    cfg = _config(attn_data_root)
    answers = AnswerVocab.load(data_path(cfg, cfg.data.answers))
    assert len(answers) == 3129
    label2ans = json.loads((attn_data_root / "vqa/lxmert/vqa/trainval_label2ans.json").read_text())
    assert answers.answers == label2ans
    assert {"yes", "no", "2", "white"} <= set(answers.answers)
    encode = bert_encoder(data_path(cfg, cfg.data.vocab), cfg.data.max_words)
    assert encode("What color is the dog?") == [101, 2054, 3609, 2003, 1996, 3899, 1029, 102]
    long = encode(" ".join(["dog"] * 40))
    assert len(long) == 20 and long[0] == 101 and long[-1] == 102


def test_training_over_the_real_answers_and_word_pieces(attn_data_root, tmp_path):
    cfg = _config(attn_data_root)
    answers = AnswerVocab.load(data_path(cfg, cfg.data.answers))
    root = tmp_path / "data"
    write_vqa_fixture(root, num_images=4, questions_per_image=4, answers=answers, num_regions=(10, 36),
                      feature_dim=16)
    out = tmp_path / "run"
    args = ["--variant", "entmax", "--data-root", str(root), "--out", str(out), "--no-progress",
            f"data.answers={data_path(cfg, cfg.data.answers)}", f"data.vocab={data_path(cfg, cfg.data.vocab)}",
            "model.random_init={hidden_size: 32, num_attention_heads: 2, intermediate_size: 64, l_layers: 1, "
            "x_layers: 1, r_layers: 1, visual_feat_dim: 16}", "train.batch_size=8", "train.epochs=1"]
    assert lxmert_train.main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["parameters"] > 30522 * 32                       # BERT's word-piece embeddings
    assert AnswerVocab.load(out / "answers.json") == answers
    assert (out / "alphas.png").is_file()
    predictions = json.loads((out / "val_predictions.json").read_text())
    assert len(predictions) == 16 and all(p["answer"] in answers for p in predictions)
