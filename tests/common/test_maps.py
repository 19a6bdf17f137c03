"""Map operators: shapes, masks, causality, and the paper equations on hand-worked examples."""
import math

import pytest
import torch
from torch import nn

from common import attention
from common.attention.maps import (
    AbsolutePositionInteraction, AdaptiveSpan, AttnMapConv, ConvolutedAttention, EvolvingAttention,
    LearnableTemperature, PredictiveAttention, RelativePositionInteraction, box_centres, clamp_spans,
    position_distance, rank_distance, token_positions,
)


def set_identity(conv: nn.Conv2d, causal: bool = False) -> None:
    """Make a 3x3 H->H convolution the identity (the tap that reads entry (i, j))."""
    tap = 2 if causal else 1
    with torch.no_grad():
        conv.weight.zero_()
        for h in range(conv.out_channels):
            conv.weight[h, h, tap, tap] = 1.0
        conv.bias.zero_()


# ------------------------------------------------------------------ AttnMapConv ----
def test_map_conv_keeps_shape_with_extra_leading_dims():
    conv = AttnMapConv(num_heads=3, layers=2)
    assert conv(torch.randn(2, 5, 3, 7, 4)).shape == (2, 5, 3, 7, 4)
    assert conv(torch.randn(3, 7, 4)).shape == (3, 7, 4)


@pytest.mark.parametrize("causal, expected", [
    (False, [[4, 6, 4], [6, 9, 6], [4, 6, 4]]),   # centred 3x3 window, zero padding
    (True, [[1, 2, 3], [2, 4, 6], [3, 6, 9]]),    # rows i-2..i, columns j-2..j
])
def test_map_conv_windows_by_hand(causal, expected):
    conv = AttnMapConv(num_heads=1, causal=causal)
    with torch.no_grad():
        conv.convs[0].weight.fill_(1.0)
        conv.convs[0].bias.zero_()
    out = conv(torch.ones(1, 1, 3, 3))
    assert torch.equal(out[0, 0], torch.tensor(expected, dtype=torch.float))


def test_map_conv_ignores_masked_entries_and_zeroes_them():
    torch.manual_seed(0)
    conv = AttnMapConv(num_heads=2)
    mask = torch.ones(1, 1, 1, 6, dtype=torch.bool)
    mask[..., 4:] = False
    x = torch.randn(1, 2, 5, 6)
    y = x.clone()
    y[..., 4:] = 1e4  # garbage logits of padded keys
    out_x, out_y = conv(x, mask), conv(y, mask)
    assert torch.equal(out_x, out_y)
    assert torch.all(out_x[..., 4:] == 0)


def test_causal_map_conv_never_reads_later_rows():
    torch.manual_seed(0)
    conv = AttnMapConv(num_heads=2, layers=2, causal=True)
    x = torch.randn(1, 2, 6, 6)
    y = x.clone()
    y[:, :, 3:] = torch.randn(1, 2, 3, 6)  # queries 3.. change
    assert torch.equal(conv(x)[:, :, :3], conv(y)[:, :, :3])


def test_map_conv_rejects_bad_options():
    with pytest.raises(ValueError, match="odd"):
        AttnMapConv(2, kernel_size=4)
    with pytest.raises(ValueError, match="activation"):
        AttnMapConv(2, activation="gelu")


# ------------------------------------------------------------------ cross-layer ----
def test_predictive_attention_equation_by_hand():
    """PA Eq. 4 with an identity CNN: alpha * relu(prev) + (1 - alpha) * logits."""
    op = PredictiveAttention(num_heads=1, alpha=0.25)
    set_identity(op.cnn.convs[0])
    logits = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    prev = torch.tensor([[[[4.0, -8.0], [0.0, 8.0]]]])
    expected = torch.tensor([[[[0.25 * 4 + 0.75 * 1, 0.75 * 2], [0.75 * 3, 0.25 * 8 + 0.75 * 4]]]])
    assert torch.allclose(op(logits, prev), expected)


def test_evolving_attention_equation_by_hand():
    """EA Eq. 4 with an identity CNN: A_in = a*prev + (1-a)*cur; out = b*relu(A_in) + (1-b)*A_in."""
    op = EvolvingAttention(num_heads=1, alpha=0.5, beta=0.25)
    set_identity(op.cnn.convs[0])
    cur = torch.tensor([[[[2.0, -6.0]]]])
    prev = torch.tensor([[[[4.0, 2.0]]]])
    a_in = torch.tensor([3.0, -2.0])                      # 0.5 * prev + 0.5 * cur
    expected = 0.25 * a_in.clamp_min(0) + 0.75 * a_in     # [3.0, -1.5]
    assert torch.allclose(op(cur, prev)[0, 0, 0], expected)
    assert torch.allclose(expected, torch.tensor([3.0, -1.5]))


def test_evolving_attention_matches_the_ea_code_form_with_swapped_letters():
    """EA code: A_in = (1-b')cur + b' prev; a' LeakyReLU(conv(A_in)) + (1-a') A_in, with a'=0.5, b'=0.3."""
    torch.manual_seed(0)
    op = EvolvingAttention(num_heads=4, alpha=0.3, beta=0.5, activation="leaky_relu")
    cur, prev = torch.randn(2, 4, 5, 5), torch.randn(2, 4, 5, 5)
    a_in = 0.7 * cur + 0.3 * prev
    conv = op.cnn.convs[0]
    code = 0.5 * nn.functional.leaky_relu(conv(nn.functional.pad(a_in, (1, 1, 1, 1)))) + 0.5 * a_in
    assert torch.allclose(op(cur, prev), code, atol=1e-6)


@pytest.mark.parametrize("cls", [PredictiveAttention, EvolvingAttention])
def test_first_layer_has_no_convolution_and_is_identity(cls):
    first = cls(num_heads=2, first_layer=True)
    assert sum(p.numel() for p in first.parameters()) == 0
    logits = torch.randn(1, 2, 3, 3)
    assert first(logits) is logits
    with pytest.raises(ValueError, match="first_layer=True"):
        first(logits, torch.randn(1, 2, 3, 3))
    later = cls(num_heads=2)
    assert later(logits) is logits  # no previous logits (e.g. every earlier layer dropped)
    with pytest.raises(ValueError, match="prev_logits has shape"):
        later(logits, torch.randn(1, 2, 3, 4))


def test_mixing_weights_must_be_in_unit_interval():
    with pytest.raises(ValueError, match="alpha"):
        PredictiveAttention(2, alpha=1.5)
    with pytest.raises(ValueError, match="beta"):
        EvolvingAttention(2, beta=-0.1)


# ------------------------------------------------------------------ convoluted ----
@pytest.mark.parametrize("kind, causal", [("2d", False), ("2d", True), ("1d", False)])
def test_convoluted_starts_as_identity(kind, causal):
    op = ConvolutedAttention(num_heads=3, kind=kind, max_len=8, causal=causal)
    w = torch.softmax(torch.randn(2, 3, 5, 6), -1)
    assert torch.allclose(op(w), w)


def test_convoluted_2d_one_filter_per_head_by_hand():
    op = ConvolutedAttention(num_heads=2, kind="2d")
    assert sum(p.numel() for p in op.parameters()) == 2 * 10  # 3x3 + bias per head (paper, Table 1c)
    with torch.no_grad():
        op.conv.weight[1].fill_(1.0)  # head 1: sum over the 3x3 neighbourhood; head 0 stays identity
    w = torch.zeros(1, 2, 3, 3)
    w[0, :, 1, 1] = 1.0
    out = op(w)
    assert torch.equal(out[0, 0], w[0, 0])
    assert torch.equal(out[0, 1], torch.ones(3, 3))


def test_convoluted_1d_filters_along_queries_by_hand():
    """The authors' Conv1D(t, 3) on the [queries, keys] map: filter f, tap d, key channel j."""
    op = ConvolutedAttention(num_heads=1, kind="1d", max_len=4)
    assert op.weight.shape == (1, 4, 4, 3) and op.bias.shape == (1, 4)
    with torch.no_grad():
        op.weight.zero_()
        op.weight[0, 0, 1, 2] = 1.0   # output column 0 reads key 1 of the next row (i + 1)
        op.weight[0, 2, 0, 0] = 2.0   # output column 2 reads 2 x key 0 of the previous row (i - 1)
        op.bias[0, 1] = 0.5           # output column 1 is the constant 0.5
    w = torch.tensor([[[[0.2, 0.3, 0.5], [0.1, 0.6, 0.3], [1.0, 0.0, 0.0]]]])
    out = op(w)[0, 0]
    expected = torch.tensor([[0.6, 0.5, 0.0],    # row 0: next row's key 1; no row -1
                             [0.0, 0.5, 0.4],    # row 1: row 2's key 1 = 0; 2 x row 0's key 0
                             [0.0, 0.5, 0.2]])   # row 2: no row 3; 2 x row 1's key 0
    assert torch.allclose(out, expected)
    with pytest.raises(ValueError, match="max_len=4"):
        op(torch.rand(1, 1, 3, 5))


def test_convoluted_relu_and_glorot_as_in_the_authors_code():
    op = ConvolutedAttention(num_heads=2, kind="1d", max_len=5, activation="relu", init="glorot")
    limit = (6 / (3 * 5 + 3 * 5)) ** 0.5  # Keras glorot-uniform on a (3, t, t) Conv1D kernel
    assert op.weight.abs().max() <= limit and op.weight.std() > limit / 3 and torch.all(op.bias == 0)
    out = op(torch.softmax(torch.randn(3, 2, 4, 4), -1))
    assert torch.all(out >= 0) and torch.any(out == 0)
    op2d = ConvolutedAttention(num_heads=2, kind="2d", init="glorot")
    assert op2d.conv.weight.abs().max() <= (6 / 18) ** 0.5


@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_convoluted_padded_query_rows_do_not_leak(kind):
    """With a query-and-key mask, the last real row is the same whatever fills the padded rows."""
    torch.manual_seed(0)
    op = ConvolutedAttention(num_heads=1, kind=kind, max_len=5, init="glorot")
    valid = torch.tensor([True, True, True, False, False])
    mask = valid[:, None] & valid[None, :]
    w = torch.softmax(torch.randn(1, 1, 5, 5), -1) * mask
    noisy = w.clone()
    noisy[..., 3:, :] = torch.rand(2, 5)
    assert torch.equal(op(w, mask), op(noisy, mask))


def test_convoluted_masks_give_exact_zeros_and_causal_2d_reads_no_later_row():
    torch.manual_seed(0)
    op = ConvolutedAttention(num_heads=2, kind="2d", causal=True)
    with torch.no_grad():
        op.conv.weight.normal_()
        op.conv.bias.normal_()
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    w = torch.softmax(torch.randn(1, 2, 5, 5).masked_fill(~mask, float("-inf")), -1)
    out = op(w, mask)
    assert torch.all(out[..., ~mask] == 0)
    w2 = w.clone()
    w2[:, :, 3:] = torch.rand(1, 2, 2, 5) * mask[3:]
    assert torch.equal(op(w2, mask)[:, :, :3], out[:, :, :3])
    with pytest.raises(ValueError, match="max_len"):
        ConvolutedAttention(2, kind="1d")


# ------------------------------------------------------------------ positions ----
def test_absolute_position_interaction_is_a_per_head_table():
    op = AbsolutePositionInteraction(num_heads=2, max_len=4)
    with torch.no_grad():
        op.table.copy_(torch.arange(32.0).view(2, 4, 4))
    bias = op(3, 2)
    assert torch.equal(bias, torch.arange(32.0).view(2, 4, 4)[:, :3, :2])
    with pytest.raises(ValueError, match="max_len=4"):
        op(5, 2)


def test_relative_position_interaction_depends_on_offset_only():
    op = RelativePositionInteraction(num_heads=2, max_len=3)
    assert op.offsets.shape == (2, 5)  # offsets -2..2
    with torch.no_grad():
        op.offsets.copy_(torch.tensor([[10.0, 11.0, 12.0, 13.0, 14.0], [0.0, 1.0, 2.0, 3.0, 4.0]]))
    bias = op(3, 3)
    # A^r_ij = a^r_{i-j+t-1}: the diagonal is offset 0 (index 2), below it i > j.
    expected_head0 = torch.tensor([[12.0, 11.0, 10.0], [13.0, 12.0, 11.0], [14.0, 13.0, 12.0]])
    assert torch.equal(bias[0], expected_head0)
    assert torch.equal(bias[1], expected_head0 - 10)


# ------------------------------------------------------------------ temperature ----
def test_learnable_temperature_scales_weights_not_bias():
    temp = LearnableTemperature()
    with torch.no_grad():
        temp.gamma["q"].fill_(2.0)
        temp.gamma["k"].fill_(3.0)
    x, w, b = torch.randn(4, 5), torch.randn(6, 5), torch.randn(6)
    assert torch.allclose(temp.project("q", x, w, b), x @ (2 * w).T + b)
    assert torch.allclose(temp.project("v", x, w, b), x @ w.T + b)
    assert temp.inverse_temperature.item() == 6.0
    temp.project("k", x, w, b).sum().backward()
    assert temp.gamma["k"].grad is not None and temp.gamma["q"].grad is None
    with pytest.raises(ValueError, match="role"):
        temp.project("o", x, w, b)


# ------------------------------------------------------------------ adaptive span ----
def test_span_mask_is_exact_at_the_ramp_ends():
    span = AdaptiveSpan(num_heads=2, max_span=16, ramp=4, init=0.5)  # z S = 8
    with torch.no_grad():
        span.z[1] = 0.25  # z S = 4
    distance = torch.arange(0.0, 16.0)
    m = span.mask(distance.view(1, 16))  # [heads, 1, 16]
    assert torch.all(m[0, 0, :9] == 1.0) and torch.all(m[0, 0, 12:] == 0.0)
    assert torch.allclose(m[0, 0, 9:12], torch.tensor([0.75, 0.5, 0.25]))
    assert torch.all(m[1, 0, :5] == 1.0) and torch.all(m[1, 0, 8:] == 0.0)


def test_span_renormalises_by_hand_and_keeps_one_span_per_head():
    span = AdaptiveSpan(num_heads=1, max_span=4, ramp=2, init=0.25)  # z S = 1: mask 1, 1, 0.5, 0
    assert span.z.shape == (1, 1, 1)
    w = torch.full((1, 1, 1, 4), 0.25)
    out = span(w, torch.tensor([[0.0, 1.0, 2.0, 3.0]]))
    assert torch.allclose(out[0, 0, 0], torch.tensor([0.4, 0.4, 0.2, 0.0]))
    for batch in (1, 5):  # the same span for any batch size (the LXMERT port learnt one per batch slot)
        assert span(torch.rand(batch, 1, 3, 4), torch.zeros(3, 4)).shape == (batch, 1, 3, 4)
    with pytest.raises(ValueError, match="heads"):
        span(torch.rand(1, 2, 3, 4), torch.zeros(3, 4))


def test_span_penalty_reaches_the_collector_with_gradient_and_clamp():
    model = nn.Sequential(nn.Identity())
    model.span = AdaptiveSpan(num_heads=3, max_span=100, ramp=8, init=0.5, loss_coef=2e-3)
    w = torch.softmax(torch.randn(2, 3, 4, 4), -1)
    with attention.aux_losses() as aux:
        model.span(w, torch.zeros(4, 4))
    penalty = aux.by_name()["adaptive_span"]
    assert math.isclose(penalty.item(), 2e-3 * 100 * 0.5, rel_tol=1e-6)
    penalty.backward()
    assert torch.allclose(model.span.z.grad, torch.full((3, 1, 1), 2e-3 * 100 / 3))
    with torch.no_grad():
        model.span.z.copy_(torch.tensor([-0.5, 0.3, 1.7]).view(3, 1, 1))
    clamp_spans(model)
    assert torch.equal(model.span.z.flatten(), torch.tensor([0.0, 0.3, 1.0]))
    assert torch.allclose(model.span.spans, torch.tensor([0.0, 30.0, 100.0]))


def test_span_rejects_bad_options():
    with pytest.raises(ValueError, match="init"):
        AdaptiveSpan(2, max_span=8, init=2.0)
    with pytest.raises(ValueError, match="positive"):
        AdaptiveSpan(2, max_span=0)


def test_distances_tokens_boxes_and_ranks():
    tokens = position_distance(token_positions(3), token_positions(3))
    assert torch.equal(tokens, torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]]))
    boxes = torch.tensor([[[0.0, 0.0, 0.2, 0.2], [0.4, 0.3, 0.6, 0.5]]])  # centres (0.1, 0.1), (0.5, 0.4)
    centres = box_centres(boxes)
    assert torch.allclose(centres, torch.tensor([[[0.1, 0.1], [0.5, 0.4]]]))
    d = position_distance(centres, centres)
    assert torch.allclose(d[0, 0, 1], torch.tensor(0.5)) and d[0, 1, 1] == 0
    with pytest.raises(ValueError, match="dims"):
        position_distance(torch.zeros(3, 1), torch.zeros(3, 2))
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0]])
    mask = torch.tensor([[True, True, True, False]])
    assert torch.equal(rank_distance(logits, mask), torch.tensor([[1.0, 0.0, 2.0, 3.0]]))
