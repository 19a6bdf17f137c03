"""The attention blocks: SDPA equivalence, causality, cross-layer logits, normalizers, span, additive attention."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from common import attention
from common.attention.blocks import (
    AdditiveAttention, Attend, AttendConfig, MultiHeadAttention, causal_mask,
)
from common.attention.maps import box_centres

B, H, Q, K, D = 2, 4, 6, 7, 8

EVERYTHING = {
    "cross_layer": {"kind": "evolving", "alpha": 0.5, "beta": 0.3},
    "position": {"max_len": 16, "absolute": True, "relative": True},
    "span": {"max_span": 8, "ramp": 2, "init": 0.5},
    "convoluted": {"kind": "2d"},
    "temperature": True,
}


def qkv(q_len=Q, k_len=K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, q_len, D, generator=g), torch.randn(B, H, k_len, D, generator=g),
            torch.randn(B, H, k_len, D, generator=g))


def padding_mask(lengths, k_len=K):
    return (torch.arange(k_len) < torch.tensor(lengths)[:, None]).view(len(lengths), 1, 1, k_len)


# ------------------------------------------------------------------ SDPA equivalence ----
MASKS = {
    "none": lambda: None,
    "padding": lambda: padding_mask([5, 7]),
    "per-query": lambda: torch.rand(Q, K, generator=torch.Generator().manual_seed(1)) > 0.3,
    "fully-masked-row": lambda: padding_mask([0, 4]),
}


@pytest.mark.parametrize("need_maps", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_name", sorted(MASKS))
def test_plain_attend_equals_sdpa(mask_name, causal, need_maps):
    q, k, v = qkv(k_len=Q if causal else K)
    mask = MASKS[mask_name]()
    if mask is not None and causal:
        mask = mask[..., :Q]
    attend = Attend(H, D).eval()
    out, maps = attend(q, k, v, mask=mask, causal=causal, need_maps=need_maps)
    if causal and mask is not None:
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask & causal_mask(Q, Q))
    else:
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    assert torch.allclose(out, ref, atol=1e-6)
    assert (maps.weights is not None) == need_maps
    if need_maps:
        assert torch.allclose(maps.weights @ v, ref, atol=1e-6)


def test_plain_attend_custom_scale_and_gradients_match_sdpa():
    q, k, v = [t.requires_grad_() for t in qkv()]
    mask = padding_mask([3, 7])
    out, _ = Attend(H, D, {"scale": 0.3})(q, k, v, mask=mask)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    assert torch.allclose(out, ref, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, ref_grads))


def test_plain_multihead_equals_torch_multihead_attention():
    torch.manual_seed(0)
    E = H * D
    ours, ref = MultiHeadAttention(E, H).eval(), nn.MultiheadAttention(E, H, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    x, memory = torch.randn(B, Q, E), torch.randn(B, K, E)
    lengths = [4, 7]
    out, _ = ours(x, memory, mask=padding_mask(lengths))
    expected, _ = ref(x, memory, memory, key_padding_mask=~padding_mask(lengths).view(B, K), need_weights=False)
    assert torch.allclose(out, expected, atol=1e-5)
    out, _ = ours(x, causal=True)
    expected, _ = ref(x, x, x, attn_mask=~causal_mask(Q, Q), need_weights=False)
    assert torch.allclose(out, expected, atol=1e-5)


def test_dropout_only_in_training():
    q, k, v = qkv()
    attend = Attend(H, D, {"dropout": 0.5})
    assert torch.equal(attend.eval()(q, k, v)[0], attend(q, k, v)[0])
    torch.manual_seed(0)
    assert not torch.allclose(attend.train()(q, k, v)[0], attend.eval()(q, k, v)[0])


# ------------------------------------------------------------------ causality ----
def decoder_stack(config, layers=2):
    torch.manual_seed(0)
    return nn.ModuleList(MultiHeadAttention(H * D, H, config, first_layer=(i == 0), decoder=True)
                         for i in range(layers))


def run_stack(stack, x, **kwargs):
    prev, maps = None, None
    for layer in stack:
        y, maps = layer(x, prev_logits=prev, **kwargs)
        x, prev = x + y, maps.logits
    return x, maps


@pytest.mark.parametrize("cross_layer", ["predictive", "evolving"])
def test_decoder_self_attention_stays_causal_with_every_operator(cross_layer):
    config = dict(EVERYTHING, cross_layer={"kind": cross_layer, "alpha": 0.5, "layers": 2})
    stack = decoder_stack(config, layers=3)
    with torch.no_grad():  # move the zero/identity-initialised operators away from their start
        for layer in stack:
            for op in (layer.attend.convoluted, layer.attend.absolute, layer.attend.relative):
                for p in op.parameters():
                    p.normal_(std=0.3)
    x = torch.randn(B, 8, H * D)
    t = 4
    changed = x.clone()
    changed[:, t:] = torch.randn(B, 8 - t, H * D)
    out, maps = run_stack(stack, x, causal=True)
    out2, _ = run_stack(stack, changed, causal=True)
    assert torch.allclose(out[:, :t], out2[:, :t], atol=1e-6)
    assert not torch.allclose(out[:, t:], out2[:, t:])
    assert torch.all(maps.weights[..., ~causal_mask(8, 8)] == 0)


def test_decoder_cross_attention_convolutions_read_no_later_query():
    config = {"cross_layer": {"kind": "evolving"}, "convoluted": {"kind": "2d"}}
    stack = decoder_stack(config)
    x, memory = torch.randn(B, 6, H * D), torch.randn(B, K, H * D)
    changed = x.clone()
    changed[:, 3:] += 1.0
    prev, outs = None, []
    for inputs in (x, changed):
        prev = None
        h = inputs
        for layer in stack:
            y, maps = layer(h, memory, prev_logits=prev)
            h, prev = h + y, maps.logits
        outs.append(h)
    assert torch.allclose(outs[0][:, :3], outs[1][:, :3], atol=1e-6)


def test_causal_call_with_map_convolutions_needs_a_decoder_block():
    block = MultiHeadAttention(H * D, H, {"convoluted": {"kind": "2d"}})
    with pytest.raises(ValueError, match="decoder=True"):
        block(torch.randn(B, Q, H * D), causal=True)


# ------------------------------------------------------------------ cross-layer flow ----
def test_two_layer_stack_hands_logits_to_the_next_layer():
    torch.manual_seed(0)
    config = {"cross_layer": {"kind": "evolving", "alpha": 0.5, "beta": 0.3}}
    first, second = MultiHeadAttention(H * D, H, config, first_layer=True), MultiHeadAttention(H * D, H, config)
    x = torch.randn(B, Q, H * D)
    y1, maps1 = first(x)
    assert torch.equal(maps1.logits, maps1.scores)  # the first layer does not mix
    x2 = (x + y1).detach()  # the only path from layer 1 to layer 2 is now the logits
    y2, maps2 = second(x2, prev_logits=maps1.logits)
    a_in = 0.5 * maps1.logits + 0.5 * maps2.scores
    assert torch.allclose(maps2.logits, 0.3 * second.attend.cross_layer.cnn(a_in) + 0.7 * a_in, atol=1e-6)
    assert torch.allclose(maps2.weights, torch.softmax(maps2.logits, -1), atol=1e-6)
    y2.sum().backward()
    assert first.q_proj.weight.grad.abs().sum() > 0
    assert not torch.allclose(second(x2, prev_logits=torch.zeros_like(maps1.logits))[0], y2)
    with pytest.raises(ValueError, match="first_layer=True"):
        first(x, prev_logits=maps1.logits)
    with pytest.raises(ValueError, match="no cross-layer operator"):
        MultiHeadAttention(H * D, H)(x, prev_logits=maps1.logits)


# ------------------------------------------------------------------ normalizers ----
@pytest.mark.parametrize("name", attention.available())
def test_every_normalizer_plugs_into_the_block(name):
    torch.manual_seed(0)
    block = MultiHeadAttention(H * D, H, {"normalizer": name, "cross_layer": {"kind": "predictive"}},
                               first_layer=True).train()
    mask = padding_mask([4, 0])  # the second item has no real key at all
    with attention.aux_losses() as aux:
        out, maps = block(torch.randn(B, Q, H * D), torch.randn(B, K, H * D), mask=mask)
    assert out.shape == (B, Q, H * D) and torch.isfinite(out).all()
    assert torch.all(maps.weights[0, ..., 4:] == 0) and torch.all(maps.weights[1] == 0)
    assert torch.allclose(maps.weights[0].sum(-1), torch.ones(H, Q), atol=1e-5)
    if name.startswith("bam"):
        assert set(aux.by_name()) == {"bam_kl"}
    (out.sum() + aux.total()).backward()


def test_extreme_logits_and_every_operator_stay_finite():
    block = MultiHeadAttention(H * D, H, EVERYTHING, decoder=True)
    x = torch.randn(B, Q, H * D) * 1e3
    prev = torch.randn(B, H, Q, Q) * 1e4
    out, maps = block(x, mask=padding_mask([0, 3], Q), causal=True, prev_logits=prev)
    assert torch.isfinite(out).all() and torch.isfinite(maps.weights).all()
    assert torch.all(maps.weights[0] == 0)


def test_temperature_scales_the_logits_by_gamma_q_gamma_k():
    torch.manual_seed(0)
    block = MultiHeadAttention(H * D, H, {"temperature": True}, bias=False)
    x = torch.randn(B, Q, H * D)
    _, before = block(x, need_maps=True)
    with torch.no_grad():
        block.temperature.gamma["q"].fill_(2.0)
        block.temperature.gamma["k"].fill_(1.5)
    _, after = block(x, need_maps=True)
    assert torch.allclose(after.scores, 3.0 * before.scores, atol=1e-5)
    with pytest.raises(ValueError, match="MultiHeadAttention"):
        Attend(H, D, {"temperature": True})


def test_position_interactions_add_to_the_scores():
    block = MultiHeadAttention(H * D, H, {"position": {"max_len": 10, "relative": True}})
    with torch.no_grad():
        block.attend.absolute.table.normal_()
        block.attend.relative.offsets.normal_()
    x = torch.randn(B, Q, H * D)
    _, maps = block(x)
    q = block.q_proj(x).view(B, Q, H, D).transpose(1, 2)
    k = block.k_proj(x).view(B, Q, H, D).transpose(1, 2)
    expected = q @ k.transpose(-1, -2) / D ** 0.5 + block.attend.absolute(Q, Q) + block.attend.relative(Q, Q)
    assert torch.allclose(maps.scores, expected, atol=1e-5)


# ------------------------------------------------------------------ span in the block ----
def test_span_distances_in_the_block():
    x, regions = torch.randn(B, Q, H * D), torch.randn(B, K, H * D)
    tokens = MultiHeadAttention(H * D, H, {"span": {"max_span": 4, "ramp": 1, "init": 0.25}})
    _, maps = tokens(x)
    far = (torch.arange(Q)[:, None] - torch.arange(Q)[None, :]).abs() >= 2  # z S = 1, ramp 1
    assert torch.all(maps.weights[..., far] == 0) and torch.all(maps.weights[..., ~far] > 0)
    with pytest.raises(ValueError, match="rank"):
        tokens(x, regions)  # token distance means nothing for cross-attention
    ranked = MultiHeadAttention(H * D, H, {"span": {"max_span": 7, "ramp": 1, "init": 2 / 7, "distance": "rank"}})
    _, maps = ranked(x, regions)
    assert torch.all((maps.weights > 0).sum(-1) == 3)  # ranks 0, 1 (and 2, on the ramp at 0) survive
    boxes = torch.rand(B, K, 4) * 0.5
    boxes[..., 2:] += boxes[..., :2]
    centres = box_centres(boxes)
    spatial = MultiHeadAttention(H * D, H, {"span": {"max_span": 1.5, "ramp": 0.1, "init": 0.1}})
    _, maps = spatial(regions, query_positions=centres, key_positions=centres)
    dist = torch.cdist(centres, centres)[:, None]
    assert torch.all(maps.weights[(dist >= 0.25).expand_as(maps.weights)] == 0)


# ------------------------------------------------------------------ config ----
def test_config_from_mapping_and_errors():
    cfg = AttendConfig.from_dict({"normalizer": "entmax", "span": {"max_span": 8}})
    assert cfg.span.max_span == 8 and not cfg.plain and AttendConfig().plain
    with pytest.raises(ValueError, match="unknown attention option"):
        AttendConfig.from_dict({"spam": 1})
    with pytest.raises(ValueError, match="valid keys"):
        AttendConfig.from_dict({"span": {"max_span": 8, "width": 2}})
    with pytest.raises(ValueError, match="no beta"):
        AttendConfig.from_dict({"cross_layer": {"kind": "predictive", "beta": 0.1}})
    with pytest.raises(ValueError, match="one of"):
        AttendConfig.from_dict({"cross_layer": {"kind": "residual"}})
    with pytest.raises(ValueError, match="unknown attention variant"):
        Attend(H, D, {"normalizer": "softmaxx"})


# ------------------------------------------------------------------ additive ----
def test_additive_attention_matches_the_bahdanau_equation():
    torch.manual_seed(0)
    att = AdditiveAttention(query_dim=5, memory_dim=6, hidden_dim=4)
    h, memory = torch.randn(B, 5), torch.randn(B, K, 6)
    mask = padding_mask([3, 7]).view(B, K)
    context, weights = att(h, memory, mask)
    e = (torch.tanh(att.memory_proj(memory) + att.query_proj(h)[:, None]) @ att.score.weight.T).squeeze(-1)
    expected = torch.softmax(e.masked_fill(~mask, float("-inf")), -1)
    assert torch.allclose(weights, expected, atol=1e-6)
    assert torch.allclose(context, (expected[..., None] * memory).sum(1), atol=1e-6)
    # Att2in masks by renormalising after the softmax: the same weights.
    renorm = torch.softmax(e, -1) * mask
    assert torch.allclose(weights, renorm / renorm.sum(-1, keepdim=True), atol=1e-6)
    steps = torch.randn(B, 3, 5)
    ctx_all, w_all = att(steps, memory, mask, projected_memory=att.project_memory(memory))
    assert torch.allclose(w_all[:, 1], att(steps[:, 1], memory, mask)[1], atol=1e-6)
    with pytest.raises(ValueError, match="boolean"):
        att(h, memory, mask.float())


def test_additive_attention_with_bam_collects_the_kl():
    torch.manual_seed(0)
    att = AdditiveAttention(5, 6, 4, normalizer="bam-wc").train()
    with attention.aux_losses() as aux:
        context, weights = att(torch.randn(B, 5), torch.randn(B, K, 6), padding_mask([2, 7]).view(B, K))
    assert torch.all(weights[0, 2:] == 0) and torch.allclose(weights.sum(-1), torch.ones(B))
    (context.sum() + aux.total()).backward()
    assert att.normalizer.prior_net.hidden.weight.grad is not None
