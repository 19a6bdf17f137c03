"""A Hugging Face checkpoint loads into the adapted model unchanged, and softmax adaptation is exact."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import LxmertForPreTraining, LxmertModel

from vqa.lxmert.adapt import Adaptation, adaptive_attention
from vqa.lxmert.model import PretrainedError, load_vqa_model

from .helpers import NUM_ANSWERS, tiny_inputs

ADAPTATIONS = {
    "softmax": {},
    "span": {"span": {}},
    "entmax": {"normalizer": "entmax"},
    "bam": {"normalizer": "bam-wc"},
    "layerdrop": {"layerdrop": {"language": 1, "cross": 1}},
}


@pytest.mark.parametrize("variant", sorted(ADAPTATIONS))
def test_every_pretrained_weight_is_used_unchanged(pretrained_dir, variant):
    saved = load_file(pretrained_dir / "model.safetensors")
    model, report = load_vqa_model(pretrained_dir, NUM_ANSWERS, Adaptation.from_dict(ADAPTATIONS[variant]))
    state = model.state_dict()
    for key, value in saved.items():
        assert torch.equal(state[f"lxmert.{key}"], value), key
    assert report.unused == [] and report.loaded == len(saved)
    assert all(key.startswith("answer_head.") for key in report.initialised)
    assert model.answer_head.logit_fc[-1].out_features == NUM_ANSWERS
    # every attention module was replaced: 2 language + 1 vision + 2 x (cross, lang self, visn self)
    assert sum(1 for _ in adaptive_attention(model)) == 2 + 1 + 2 * 3
    assert not any(type(m).__name__ == "LxmertAttention" for m in model.modules())


def test_pretraining_checkpoint_leaves_out_only_its_heads(tmp_path, config):
    LxmertForPreTraining(config).save_pretrained(tmp_path / "pre")
    model, report = load_vqa_model(tmp_path / "pre", NUM_ANSWERS, Adaptation())
    assert report.unused and all(k.startswith(("cls.", "obj_predict_head.")) for k in report.unused)
    # the 9-answer pre-training QA head keeps its hidden layers; only the output layer is new
    assert report.initialised == ["answer_head.logit_fc.3.bias", "answer_head.logit_fc.3.weight"]


def test_softmax_adaptation_equals_transformers(pretrained_dir, config):
    reference = LxmertModel.from_pretrained(pretrained_dir).eval()
    model, _ = load_vqa_model(pretrained_dir, NUM_ANSWERS, Adaptation())
    model.eval()
    inputs = tiny_inputs(config)
    with torch.no_grad():
        expected = reference(**inputs, output_attentions=True)
        got = model.lxmert(**inputs, output_attentions=True)
    for name in ("language_output", "vision_output", "pooled_output"):
        torch.testing.assert_close(getattr(got, name), getattr(expected, name), atol=1e-5, rtol=1e-5)
    for a, b in zip(got.cross_encoder_attentions, expected.cross_encoder_attentions):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_missing_directory_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(PretrainedError, match=r"config\.json does not exist.*huggingface-cli download"):
        load_vqa_model(tmp_path / "nothing", NUM_ANSWERS, Adaptation())


def test_weights_that_do_not_fit_the_config_are_refused(pretrained_dir):
    config_file = pretrained_dir / "config.json"
    config = json.loads(config_file.read_text())
    config["l_layers"] += 1  # a language layer the weights do not hold
    config_file.write_text(json.dumps(config))
    with pytest.raises(PretrainedError, match="backbone weights missing"):
        load_vqa_model(pretrained_dir, NUM_ANSWERS, Adaptation())


def test_a_half_precision_checkpoint_loads_as_float32(tmp_path, config):
    """transformers 5 keeps a checkpoint's own dtype; training needs float32 weights (autocast sets the arithmetic)."""
    LxmertModel(config).half().save_pretrained(tmp_path / "half")
    saved = load_file(tmp_path / "half" / "model.safetensors")
    assert {value.dtype for value in saved.values() if value.is_floating_point()} == {torch.float16}
    model, _ = load_vqa_model(tmp_path / "half", NUM_ANSWERS, Adaptation())
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    state = model.state_dict()
    assert all(torch.equal(state[f"lxmert.{key}"], value.float()) for key, value in saved.items())
