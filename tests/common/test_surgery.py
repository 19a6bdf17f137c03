"""Model surgery on Hugging Face encoders (common.attention.surgery): a softmax swap is exact, the
pretrained weights are kept, and the suite's normalizers (BAM, entmax) work inside them."""
from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from common.attention import aux_losses, mc_sampling  # noqa: E402
from common.attention.surgery import IMPLEMENTATION, swap_attention, swapped_attention  # noqa: E402

SMALL = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _bert():
    return transformers.BertForSequenceClassification(transformers.BertConfig(**SMALL, num_labels=3))


def _roberta():
    return transformers.RobertaModel(transformers.RobertaConfig(**SMALL))


def _albert():
    config = transformers.AlbertConfig(**SMALL, embedding_size=16, attention_probs_dropout_prob=0.1)
    return transformers.AlbertModel(config)


def _lxmert():
    config = transformers.LxmertConfig(vocab_size=120, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                                       l_layers=2, x_layers=1, r_layers=1, visual_feat_dim=12, visual_pos_dim=4,
                                       num_qa_labels=5, num_object_labels=5, num_attr_labels=5)
    return transformers.LxmertModel(config)


ARCHITECTURES = {"bert": _bert, "roberta": _roberta, "albert": _albert, "lxmert": _lxmert}
SWAPPED = {"bert": 2, "roberta": 2, "albert": 1, "lxmert": 2 + 1 + 1 * 3}
#: attention calls per forward: ALBERT shares one module across its layers, LXMERT's cross-attention runs both ways
CALLS = {"bert": 2, "albert": 2, "lxmert": 2 + 1 + 1 * 4}


def _inputs(name, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 120, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if name == "lxmert":
        inputs.update(visual_feats=torch.randn(3, 6, 12, generator=g), visual_pos=torch.rand(3, 6, 4, generator=g),
                      visual_attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 6]))
    return inputs


def _output(model, inputs):
    out = model(**inputs)
    if hasattr(out, "logits"):
        return out.logits
    if hasattr(out, "pooled_output") and out.pooled_output is not None and hasattr(out, "vision_output"):
        return torch.cat([out.language_output.flatten(1), out.vision_output.flatten(1), out.pooled_output], 1)
    return out.last_hidden_state


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_softmax_swap_equals_the_original_in_eval_and_train_mode(name):
    torch.manual_seed(0)
    original = ARCHITECTURES[name]()
    if name == "lxmert":  # LXMERT's inline softmax draws its dropout differently from SDPA's: no dropout to compare
        original.config.hidden_dropout_prob = 0.0
        for module in original.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    swapped = copy.deepcopy(original)
    names = swap_attention(swapped, "softmax")
    assert len(names) == SWAPPED[name] == len(list(swapped_attention(swapped)))
    inputs = _inputs(name)
    for train in (False, True):
        original.train(train)
        swapped.train(train)
        torch.manual_seed(1)
        expected = _output(original, inputs)
        torch.manual_seed(1)
        actual = _output(swapped, inputs)
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)
    if name != "lxmert":  # with dropout 0.1 in train mode too (the same SDPA call draws the same masks)
        assert original.config.attention_probs_dropout_prob > 0


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_bam_keeps_the_pretrained_weights_and_adds_only_its_prior(name):
    torch.manual_seed(0)
    original = ARCHITECTURES[name]()
    swapped = copy.deepcopy(original)
    swap_attention(swapped, {"normalizer": "bam-wc", "normalizer_options": {"k": 10}})
    before, after = original.state_dict(), swapped.state_dict()
    assert set(before) <= set(after)
    assert all(torch.equal(before[key], after[key]) for key in before)
    added = set(after) - set(before)
    assert added and all(".attend.normalizer.prior_net." in key for key in added)
    # the prior network starts as the paper's code does: N(0, 1/d) and N(0, 1/d_mid) weights, zero biases
    prior = next(m for _, m in swapped_attention(swapped)).attend.normalizer.prior_net
    assert prior.hidden.weight.shape == (10, 8) and torch.all(prior.hidden.bias == 0) and torch.all(prior.out.bias == 0)


@pytest.mark.parametrize("name", ["bert", "albert", "lxmert"])
def test_bam_collects_its_kl_samples_in_training_and_is_the_softmax_mean_in_eval(name):
    torch.manual_seed(0)
    original = ARCHITECTURES[name]().eval()
    swapped = copy.deepcopy(original)
    swap_attention(swapped, "bam-wc")
    inputs = _inputs(name)
    torch.testing.assert_close(_output(swapped, inputs), _output(original, inputs), atol=1e-5, rtol=0)
    swapped.train()
    with aux_losses() as aux:
        loss = _output(swapped, inputs).square().mean()
    kl = aux.total()
    assert len(aux) == CALLS[name] and kl.item() > 0
    (loss + kl).backward()
    prior = next(m for _, m in swapped_attention(swapped)).attend.normalizer.prior_net
    assert prior.hidden.weight.grad is not None and prior.hidden.weight.grad.abs().sum() > 0
    swapped.eval()
    with torch.no_grad(), mc_sampling(swapped):
        a, b = _output(swapped, inputs), _output(swapped, inputs)
    assert not torch.allclose(a, b)  # MC evaluation samples


def test_entmax_adds_a_learnable_alpha_per_head_and_trains():
    torch.manual_seed(0)
    model = _bert()
    swap_attention(model, "entmax")
    modules = list(swapped_attention(model))
    assert all(m.attend.normalizer.alpha.shape == (4,) for _, m in modules)
    model(**_inputs("bert")).logits.sum().backward()
    assert all(m.attend.normalizer.alpha_logit.grad is not None for _, m in modules)


def test_a_function_configures_each_module_and_none_leaves_one_as_it_was():
    torch.manual_seed(0)
    original = _bert().eval()
    swapped = copy.deepcopy(original)
    names = swap_attention(swapped, lambda name, module: "bam-wc" if ".layer.1." in name else None)
    assert names == ["bert.encoder.layer.1.attention.self"]
    assert swapped.config._attn_implementation == IMPLEMENTATION
    assert not hasattr(swapped.bert.encoder.layer[0].attention.self, "attend")
    torch.testing.assert_close(_output(swapped, _inputs("bert")), _output(original, _inputs("bert")), atol=1e-5,
                               rtol=0)


def test_swapping_again_reconfigures_and_output_attentions_returns_the_weights():
    model = _bert().eval()
    swap_attention(model, "bam-wc")
    swap_attention(model, "softmax")
    assert all(m.attend.normalizer.__class__.__name__ == "Softmax" for _, m in swapped_attention(model))
    out = model(**_inputs("bert"), output_attentions=True)
    weights = out.attentions[0]
    assert weights.shape == (3, 4, 9, 9)
    assert torch.all(weights[2, :, :, 2:] == 0)  # padded keys: exact zeros
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 9))


def test_a_model_without_supported_attention_is_refused_with_the_list():
    with pytest.raises(ValueError, match="no supported attention module; supported: .*BertSelfAttention"):
        swap_attention(torch.nn.Sequential(torch.nn.Linear(4, 4)), "bam-wc")


def test_map_operators_work_inside_a_hugging_face_model():
    torch.manual_seed(0)
    model = _bert()
    swap_attention(model, {"normalizer": "softmax", "span": {"max_span": 3, "ramp": 2, "init": 0.5, "loss_coef": 0.1}})
    with aux_losses() as aux:
        model(**_inputs("bert")).logits.sum().backward()
    assert len(aux) == 2  # the span penalty of each layer
    z = [m.attend.span.z for _, m in swapped_attention(model)]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in z)
    weights = model.eval()(**_inputs("bert"), output_attentions=True).attentions[0]
    distance = (torch.arange(9)[:, None] - torch.arange(9)[None, :]).abs()
    assert torch.all(weights[0][:, distance >= 0.5 * 3 + 2] == 0)  # beyond span + ramp: exact zeros
