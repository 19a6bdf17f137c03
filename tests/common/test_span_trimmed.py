"""Adaptive span with token distance skips the keys beyond every head's span: the trimmed path
equals the full one (outputs and gradients, masks included) and computes fewer scores."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from common.attention import aux_losses
from common.attention.blocks import Attend

L, H, D = 100, 2, 4


def _attend(z=(0.23, 0.57), loss_coef=0.0):
    # zS + R = 5.3 and 8.7: no integer distance sits exactly where the ramp reaches 0, a kink whose
    # subgradient carries 1/eps (the renormalisation's 1e-8) and so differs between the paths.
    attend = Attend(H, D, {"span": {"max_span": 10, "ramp": 3, "loss_coef": loss_coef}}).double()
    with torch.no_grad():
        attend.span.z.copy_(torch.tensor(z, dtype=torch.float64).view(H, 1, 1))
    return attend


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, H, L, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


def _masks():
    pad = (torch.arange(L) < torch.tensor([L, 57]).view(2, 1)).view(2, 1, 1, L)  # key padding, not a block multiple
    g = torch.Generator().manual_seed(1)
    rows = torch.rand(2, 1, L, L, generator=g) > 0.4
    rows[0, 0, 5] = False  # a fully masked query
    rows[1, 0, 60] = False
    rows[1, 0, 60, 0] = True  # a query whose only key lies beyond every span
    return {"none": (None, False), "padding": (pad, False), "causal": (None, True), "per-query": (rows, False),
            "padding+causal": (pad, True)}


@pytest.mark.parametrize("case", list(_masks()))
def test_trimmed_span_equals_full_path_with_gradients(case):
    mask, causal = _masks()[case]
    attend = _attend(loss_coef=0.1)
    q, k, v = _inputs()
    upstream = torch.randn(2, H, L, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    results = []
    for need_maps in (False, True):  # need_maps takes the full [L, L] path
        with aux_losses() as aux:
            out, maps = attend(q, k, v, mask=mask, causal=causal, need_maps=need_maps)
        assert (maps.weights is None) == (not need_maps)
        loss = (out * upstream).sum() + aux.total()
        results.append((out, torch.autograd.grad(loss, (q, k, v, attend.span.z))))
    (trimmed, t_grads), (full, f_grads) = results
    assert not trimmed.isnan().any()
    # Softmax's partition function cancels in the span's renormalisation m w / (sum m w + 1e-8), up to
    # that 1e-8: relative differences of 1e-8 / sum(m w), about 4e-7 here, where keys are wrong O(1).
    assert torch.allclose(trimmed, full, rtol=1e-5, atol=1e-9)
    for a, b in zip(t_grads, f_grads):  # q, k, v, z
        assert torch.allclose(a, b, rtol=0, atol=1e-5 * float(b.abs().max()))
    if mask is not None and mask.shape[-2] == L:
        assert torch.equal(trimmed[0, :, 5], torch.zeros(H, D, dtype=trimmed.dtype))  # fully masked query


def test_trimming_shrinks_the_score_computation_and_only_when_it_pays():
    q, k, v = _inputs()

    def flops(attend):
        with FlopCounterMode(display=False) as counter:
            attend(q, k, v)[0].sum().backward()
        return counter.get_total_flops()

    full_path = _attend()
    full_path.span = None  # the same matmuls over all L keys
    # W = floor(0.57 * 10 + 3) + 1 = 9, blocks of 32 queries see 32 + 2 * 8 = 48 keys: 4 blocks x 32 x 48.
    assert flops(_attend()) / flops(full_path) == pytest.approx(4 * 32 * 48 / L**2)
    wide = _attend(z=(0.3, 0.5))
    wide.span.max_span = float(L)  # W = 54: blocks would see 160 > L / 2 keys; the full path runs
    assert wide(q, k, v)[1].weights is not None


def test_token_window_bounds_every_heads_nonzero_mask():
    span = _attend(z=(0.0, 0.3)).span
    for z in (0.0, 0.25, 0.3, 0.57, 1.0):
        with torch.no_grad():
            span.z[1] = z
        window = span.token_window()
        distance = torch.arange(window + 5, dtype=torch.float64)
        nonzero = (span.mask(distance) > 0).any(0).flatten()
        assert not nonzero[window:].any() and nonzero[window - 2]  # no kept key is ever cut


@pytest.mark.parametrize("distance,queries,keys", [("rank", 20, 36), ("position", 20, 20)])
def test_span_covering_every_key_is_sdpa_and_equals_the_full_path(distance, queries, keys):
    attend = Attend(H, D, {"span": {"max_span": keys, "ramp": 4, "init": 1.0, "loss_coef": 0.1,
                                    "distance": distance}}).double()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, H, queries, D, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, H, keys, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    mask = torch.rand(2, 1, queries, keys, generator=g) > 0.3
    mask[1, 0, 4] = False  # a fully masked query: zeros
    results = []
    for need_maps in (False, True):
        with aux_losses() as aux:
            out, maps = attend(q, k, v, mask=mask, need_maps=need_maps)
        assert (maps.weights is None) == (not need_maps)
        results.append((out, *torch.autograd.grad(out.square().sum() + aux.total(), (q, k, v, attend.span.z))))
    for a, b in zip(*results):  # the full path divides by sum(w) + 1e-8
        assert torch.allclose(a, b, rtol=1e-7, atol=1e-12)
    assert torch.equal(results[0][0][1, :, 4], torch.zeros(H, D, dtype=torch.float64))
    assert torch.equal(results[0][4], torch.full((H, 1, 1), 0.1 * keys / H, dtype=torch.float64))  # the penalty
    with torch.no_grad():
        attend.span.z[0] = (keys - 1.2) / keys  # head 0 now down-weights the last key: the full path
    assert attend(q, k, v, mask=mask)[1].weights is not None
