"""Each adaptation changes LXMERT's attention as specified."""
from __future__ import annotations

import pytest
import torch
from entmax import entmax_bisect
from transformers import LxmertForQuestionAnswering

from common.attention import aux_losses, clamp_spans
from vqa.lxmert.adapt import Adaptation, LayerDropOptions, adapt_lxmert, adaptive_attention, pruned_layers
from vqa.lxmert.model import build_vqa_model, head_parameters

from .helpers import NUM_ANSWERS, tiny_config, tiny_inputs


def _model(config, seed=0, **adaptation):
    torch.manual_seed(seed)
    return build_vqa_model(config, NUM_ANSWERS, Adaptation.from_dict(adaptation))


def _module(model, site, index=0):
    return [m for _, s, m in adaptive_attention(model) if s == site][index]


def _weights(module, x, context=None, mask=None):
    _, weights = module(x, x if context is None else context, mask, output_attentions=True)
    return weights


def test_language_span_mask_is_exact_at_both_ramp_ends(config):
    model = _model(config, span={"language": {"max_span": 8, "ramp": 2}}).eval()
    attn = _module(model, "language")
    with torch.no_grad():
        attn.attend.span.z.copy_(torch.tensor([0.25, 0.5]).view(2, 1, 1))  # spans zS = 2 and 4 tokens
    x = torch.randn(1, 10, config.hidden_size)
    weights = _weights(attn, x)[0]
    plain = torch.softmax(_plain_scores(attn, x), dim=-1)[0]
    distance = (torch.arange(10)[:, None] - torch.arange(10)[None]).abs()
    for head, span in enumerate((2, 4)):
        w, p = weights[head], plain[head]
        assert torch.all(w[distance >= span + 2] == 0)              # ramp end: exactly zero
        inside = distance <= span                                     # ramp start: mask exactly 1
        ramp = (distance > span) & (distance < span + 2)
        mask = torch.where(inside, 1.0, torch.where(ramp, 1 + (span - distance.float()) / 2, 0.0))
        expected = p * mask / ((p * mask).sum(-1, keepdim=True) + 1e-8)
        torch.testing.assert_close(w, expected, atol=1e-6, rtol=1e-5)
        assert torch.all(w[ramp] > 0)


def _plain_scores(attn, x):
    heads = lambda y: y.view(*y.shape[:-1], attn.num_attention_heads, -1).transpose(-3, -2)  # noqa: E731
    q, k = heads(attn.query(x)), heads(attn.key(x))
    return q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5


def test_region_span_keeps_a_soft_top_k_of_regions(config):
    model = _model(config, span={"vision": {"max_span": 10, "ramp": 1}, "cross": {"max_span": 10, "ramp": 1}}).eval()
    with torch.no_grad():
        for site in ("vision", "cross"):
            _module(model, site).attend.span.z.fill_(0.2)             # zS = 2 regions, ramp 1: ranks 0-2 kept
    regions, words = torch.randn(2, 9, config.hidden_size), torch.randn(2, 6, config.hidden_size)
    vision = _weights(_module(model, "vision"), regions)
    assert torch.all((vision > 0).sum(-1) == 3)
    torch.testing.assert_close(vision.sum(-1), torch.ones(2, 2, 9))
    # the top-3 regions by logit are the kept ones
    scores = _plain_scores(_module(model, "vision"), regions)
    top = scores.topk(3, dim=-1).indices
    assert torch.all(vision.gather(-1, top) > 0)
    cross = _weights(_module(model, "cross"), words, regions)       # words -> regions
    assert torch.all((cross > 0).sum(-1) == 3)


def test_span_penalty_reaches_aux_losses_and_spans_stay_clamped(config):
    model = _model(config, span={"init": 0.5, "loss_coef": 1e-2})
    inputs = tiny_inputs(config)
    with aux_losses() as aux:
        model(**inputs)
    # coef * S * mean(z) per attention call: 4 language (S=20), 3 vision and 2 x 2 cross (both directions, S=36)
    per_module = 1e-2 * 0.5 * torch.tensor([20.0] * 4 + [36.0] * 7)
    total = aux.by_name()["adaptive_span"]
    torch.testing.assert_close(total, per_module.sum(), rtol=1e-5, atol=1e-7)
    total.backward()
    assert all(m.attend.span.z.grad is not None for _, _, m in adaptive_attention(model))
    with torch.no_grad():
        for _, _, m in adaptive_attention(model):
            m.attend.span.z.add_(5.0)
    clamp_spans(model)
    spans = {k: v for k, v in head_parameters(model).items() if k.startswith("span/")}
    assert len(spans) == 9 * 2 and set(spans.values()) <= {20.0, 36.0}


def test_entmax_rows_are_sparse_sum_to_one_and_alpha_stays_in_range(config):
    model = _model(config, normalizer="entmax", normalizer_options={"alpha": 1.6}).eval()
    attn = _module(model, "language")
    with torch.no_grad():                                               # peaked scores, as after training
        for proj in (attn.query, attn.key):
            proj.weight.copy_(3 * torch.eye(config.hidden_size)), proj.bias.zero_()
    x = torch.randn(2, 12, config.hidden_size)
    mask = torch.zeros(2, 1, 1, 12)
    mask[1, ..., 9:] = torch.finfo(torch.float32).min                 # three padded words
    weights = _weights(attn, x, mask=mask)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 12))
    assert (weights[0] == 0).float().mean() > 0.3                     # sparse: many exact zeros
    expected = entmax_bisect(_plain_scores(attn, x)[0], torch.tensor(1.6), dim=-1)
    torch.testing.assert_close(weights[0], expected, atol=1e-5, rtol=1e-4)
    assert torch.all(weights[1, ..., 9:] == 0)                         # padding: exactly zero
    alphas = torch.stack([m.attend.normalizer.alpha for _, _, m in adaptive_attention(model)])
    torch.testing.assert_close(alphas, torch.full_like(alphas, 1.6))
    with torch.no_grad():                                               # far outside after "training"
        for i, (_, _, m) in enumerate(adaptive_attention(model)):
            m.attend.normalizer.alpha_logit.fill_(100.0 if i % 2 else -100.0)
    alphas = torch.stack([m.attend.normalizer.alpha for _, _, m in adaptive_attention(model)])
    assert torch.all(alphas > 1) and torch.all(alphas <= 2)
    assert len([k for k in head_parameters(model) if k.startswith("alpha/")]) == 9 * 2


def test_entmax_alpha_receives_a_gradient(config):
    model = _model(config, normalizer="entmax").train()
    inputs = tiny_inputs(config)
    model(**inputs).question_answering_score.square().sum().backward()
    grads = {name: m.attend.normalizer.alpha_logit.grad for name, _, m in adaptive_attention(model)}
    # the VQA head reads the pooled language output: the last vision self-attention cannot matter
    assert [name for name, g in grads.items() if g is None] == ["x_layers.1.visn_self_att.self"]
    grads = [g for g in grads.values() if g is not None]
    assert all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_bam_adds_its_kl_in_training_and_is_the_softmax_mean_in_eval(config):
    bam, soft = _model(config, seed=1, normalizer="bam-wc"), _model(config, seed=1)
    soft.load_state_dict(bam.state_dict(), strict=False)
    inputs = tiny_inputs(config)
    bam.train()
    with aux_losses() as aux:
        bam(**inputs)
    assert torch.isfinite(aux.by_name()["bam_kl"])
    bam.eval(), soft.eval()
    with torch.no_grad():
        torch.testing.assert_close(bam(**inputs).question_answering_score,
                                   soft(**inputs).question_answering_score, atol=1e-5, rtol=1e-5)


def _count_calls(model):
    calls = {}
    encoder = model.lxmert.encoder
    for attr in ("layer", "r_layers", "x_layers"):
        for i, layer in enumerate(getattr(encoder, attr)):
            layer.register_forward_hook(lambda *_, key=(attr, i): calls.__setitem__(key, calls.get(key, 0) + 1))
    return calls


def test_layerdrop_is_a_no_op_in_eval_and_drops_layers_in_training():
    config = tiny_config(l_layers=4, r_layers=2, x_layers=2)
    dropped = _model(config, layerdrop={"language": 2, "vision": 1, "cross": 1})
    full = _model(config)
    full.load_state_dict(dropped.state_dict())
    assert [dropped.lxmert.encoder.layer.p, dropped.lxmert.encoder.r_layers.p] == [0.5, 0.5]
    inputs = tiny_inputs(config)
    dropped.eval(), full.eval()
    calls = _count_calls(dropped)
    with torch.no_grad():
        torch.testing.assert_close(dropped(**inputs).question_answering_score, full(**inputs).question_answering_score)
    assert len(calls) == 4 + 2 + 2 and set(calls.values()) == {1}
    dropped.train()
    torch.manual_seed(0)
    runs = 40
    for _ in range(runs):
        dropped(**inputs)
    language = [calls[("layer", i)] - 1 for i in range(4)]
    assert all(0 < n < runs for n in language)                          # each kept about half the time


def test_pruning_removes_exactly_the_every_other_layers_and_restores_them():
    config = tiny_config(l_layers=9, r_layers=5, x_layers=5, hidden_size=16, intermediate_size=16)
    model = _model(config, layerdrop={"language": 1, "vision": 1, "cross": 1}).eval()
    calls = _count_calls(model)
    inputs = tiny_inputs(config)
    with torch.no_grad(), pruned_layers(model, LayerDropOptions(language=1, vision=1, cross=1)) as kept:
        model(**inputs)
    assert kept == {"language": list(range(8)), "vision": list(range(4)), "cross": list(range(4))}
    assert set(calls) == {("layer", i) for i in range(8)} | {(s, i) for s in ("r_layers", "x_layers") for i in range(4)}
    assert len(model.lxmert.encoder.layer) == 9 and len(model.lxmert.encoder.x_layers) == 5
    with pruned_layers(model, LayerDropOptions(language=2, vision=2, cross=2)) as kept:
        assert kept == {"language": [0, 1, 2, 4, 5, 6, 8], "vision": [0, 2, 4], "cross": [0, 2, 4]}
        assert [len(model.lxmert.encoder.layer), len(model.lxmert.encoder.r_layers)] == [7, 3]


def test_pruning_more_than_half_a_stack_is_refused(config):
    model = _model(config)
    with pytest.raises(ValueError, match="at most half"):
        with pruned_layers(model, LayerDropOptions(vision=1)):
            pass


def test_unknown_adaptation_key_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid keys: normalizer"):
        Adaptation.from_dict({"normaliser": "entmax"})


def test_adapting_twice_is_refused(config):
    model = _model(config)
    with pytest.raises(ValueError, match="adapted already"):
        adapt_lxmert(model, Adaptation())
    assert isinstance(model, LxmertForQuestionAnswering)
