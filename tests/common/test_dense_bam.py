"""Dense BAM attention by query chunks (common.attention.dense_bam) against the materialised path."""
import copy

import pytest
import torch

from common import attention
from common.attention import dense_bam
from common.attention.bam_stats import supports
from common.attention.blocks import Attend, MultiHeadAttention

B, H, Q, K, D = 3, 2, 6, 7, 4


def _inputs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g, dtype=dtype).requires_grad_() for n in (Q, K, K))
    # batch 1 sees 3 keys, batch 2 none at all (fully masked rows)
    mask = (torch.arange(K) < torch.tensor([K, 3, 0])[:, None]).view(B, 1, 1, K)
    noise = torch.randn(B, H, Q, K, generator=g, dtype=dtype)
    return q, k, v, mask, noise


def _materialised(norm, q, k, v, mask, causal, noise):
    """Today's path: scores, the BAM normalizer (with the given noise), weights @ v."""
    full = mask
    if causal:
        tri = torch.ones(Q, K, dtype=torch.bool).tril()
        full = tri if mask is None else mask & tri
    norm._log_noise = lambda scores: noise.to(scores.dtype)
    try:
        with attention.aux_losses() as aux:
            weights = norm(q @ k.transpose(-1, -2) * D**-0.5, mask=full, keys=k)
            out = weights @ v
    finally:
        del norm._log_noise
    return out, aux.total()


def _fused(norm, q, k, v, mask, causal, noise):
    with attention.aux_losses() as aux:
        out = dense_bam.dense_bam_attention(norm, q, k, v, mask=mask, causal=causal, noise=noise)
    return out, aux.total()


def _loss_grads(norm, out, kl, inputs):
    upstream = torch.linspace(-1, 1, out.numel()).view_as(out).to(out.dtype)
    params = list(norm.parameters())
    grads = torch.autograd.grad((out * upstream).sum() + (out.float() ** 2).sum() + kl, list(inputs) + params)
    return grads


# Causal masks have a closed-form KL for the fixed-prior Weibull only (bam_stats.supports).
CASES = [(name, mask, causal) for name in ("bam-wc", "bam-wf", "bam-lc", "bam-lf")
         for mask, causal in ((False, False), (True, False), (False, True), (True, True))
         if not causal or name == "bam-wf"]


# The contextual prior's variants: normalised over every key (the official GAT code), one network per head.
CASES += [("bam-wc", True, False, {"prior_scope": "all"}), ("bam-lc", True, False, {"prior_scope": "all"}),
          ("bam-wc", True, False, {"prior_per_head": True, "num_heads": H})]


# What the forward pass keeps for the backward: every chunk's tiles, the weights of the first
# chunks (three chunks' worth of bytes; the others are recomputed), or nothing.
KEEP = {"all": 1 << 30, "first-weights": 3 * 4 * K * 4, "none": 0}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("keep", list(KEEP))
def test_fused_equals_materialised_under_the_same_noise(case, keep, monkeypatch):
    name, use_mask, causal, options = case if len(case) == 4 else (*case, {})
    norm = attention.build(name, key_dim=D, k=4.0, sigma=0.5, **options).train()
    assert supports(norm.kl_kernel, causal)
    monkeypatch.setattr(dense_bam, "CHUNK_ELEMENTS", K * 4)  # two chunks per head: 4 + 2 queries
    monkeypatch.setattr(dense_bam, "KEEP_BYTES", KEEP[keep])
    monkeypatch.setattr(dense_bam, "KEY_ALIGN", 4)  # batch 1's chunks score 3 + 1 hidden keys, batch 2's 1 + 3
    q, k, v, mask, noise = _inputs()
    mask = mask if use_mask else None
    out, kl = _fused(norm, q, k, v, mask, causal, noise)
    ref_out, ref_kl = _materialised(norm, q, k, v, mask, causal, noise)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kl, ref_kl, rtol=1e-5, atol=1e-5)
    for got, want in zip(_loss_grads(norm, out, kl, (q, k, v)), _loss_grads(norm, ref_out, ref_kl, (q, k, v))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _extreme_inputs():
    """``_inputs`` in float64 with each row's scores near ``level * (1 +- 0.1)``: +-100 (past exp's float32
    range: the sum of exp overflows, or every term is below 1e-34), +-50 (an LSE past the
    +-40 of the unshifted gradient), and two ordinary levels."""
    q, k, v, mask, noise = _inputs(torch.float64)
    g = torch.Generator().manual_seed(1)
    base = torch.randn(D, generator=g, dtype=torch.float64)
    level = torch.tensor([100.0, -100.0, 50.0, -50.0, 0.5, -3.0], dtype=torch.float64)
    with torch.no_grad():
        k.copy_(base + 0.1 * base.norm() * torch.randn(B, H, K, D, generator=g, dtype=torch.float64) / D**0.5)
        q.copy_(level[:, None] * base / base.square().sum() * D**0.5)
    return q, k, v, mask, noise


@pytest.mark.parametrize("name", ["bam-wc", "bam-lc"])
@pytest.mark.parametrize("keep", ["all", "none"])
def test_scores_beyond_the_range_of_exp_take_the_shifted_forms(name, keep, monkeypatch):
    """Rows whose scores lie near +-100 or +-50 give the materialised output, KL and gradients:
    exactly in float64 (the same branches are taken), and finite and close in float32."""
    monkeypatch.setattr(dense_bam, "KEEP_BYTES", KEEP[keep])
    norm = attention.build(name, key_dim=D, k=4.0, sigma=0.5).train()
    norm64 = copy.deepcopy(norm).double()
    q, k, v, mask, noise = _extreme_inputs()
    out, kl = _fused(norm64, q, k, v, mask, False, noise)
    ref = _materialised(norm64, q, k, v, mask, False, noise)
    ref_grads = _loss_grads(norm64, *ref, (q, k, v))
    torch.testing.assert_close((out, kl), ref, rtol=1e-9, atol=1e-9)
    for got, want in zip(_loss_grads(norm64, out, kl, (q, k, v)), ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)

    q, k, v = (x.detach().float().requires_grad_() for x in (q, k, v))
    scores = q @ k.transpose(-1, -2) * D**-0.5
    assert scores[0, :, 0].min() > 80 and scores[0, :, 1].max() < -80
    out, kl = _fused(norm, q, k, v, mask, False, noise.float())
    torch.testing.assert_close((out.double(), kl.double()), ref, rtol=1e-4, atol=1e-4)
    for got, want in zip(_loss_grads(norm, out, kl, (q, k, v)), ref_grads):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)


def test_chunks_group_heads_by_padding_and_skip_it(monkeypatch):
    """Chunks skip the padding after their last visible key, up to the next multiple of KEY_ALIGN."""
    monkeypatch.setattr(dense_bam, "KEY_ALIGN", 4)
    q, k, _, mask, _ = _inputs()
    plan = dense_bam._plan(q.reshape(-1, Q, D), k.reshape(-1, K, D), mask.expand(B, H, 1, K).reshape(-1, 1, K), False)
    assert [(c.groups, c.rows, c.visible, c.keys) for c in plan] == [
        (slice(0, 2), slice(0, Q), 7, slice(0, 7)), (slice(2, 4), slice(0, Q), 3, slice(0, 4)),
        (slice(4, 6), slice(0, Q), 1, slice(0, 4))]


def test_key_blocks_split_each_chunk_in_order_and_stop_at_its_last_visible_key(monkeypatch):
    """With ``key_block`` a chunk's keys come in blocks, in order; the last block ends at the next
    multiple of KEY_ALIGN after the last visible key, and hides the keys past it (``visible``)."""
    monkeypatch.setattr(dense_bam, "KEY_ALIGN", 2)
    monkeypatch.setattr(dense_bam, "CHUNK_ELEMENTS", 4 * Q)
    q, k, _, mask, _ = _inputs()
    plan = dense_bam._plan(q.reshape(-1, Q, D), k.reshape(-1, K, D), mask.expand(B, H, 1, K).reshape(-1, 1, K), False,
                           key_block=4)
    assert [(c.groups, c.rows, c.keys, c.visible, c.shape) for c in plan] == [
        (slice(0, 1), slice(0, Q), slice(0, 4), 4, (1, Q, 4)), (slice(0, 1), slice(0, Q), slice(4, 7), 3, (1, Q, 3)),
        (slice(1, 2), slice(0, Q), slice(0, 4), 4, (1, Q, 4)), (slice(1, 2), slice(0, Q), slice(4, 7), 3, (1, Q, 3)),
        (slice(2, 3), slice(0, Q), slice(0, 4), 3, (1, Q, 4)), (slice(3, 4), slice(0, Q), slice(0, 4), 3, (1, Q, 4)),
        (slice(4, 5), slice(0, Q), slice(0, 2), 1, (1, Q, 2)), (slice(5, 6), slice(0, Q), slice(0, 2), 1, (1, Q, 2))]
    monkeypatch.setattr(dense_bam, "CHUNK_ELEMENTS", 4 * 4)  # four queries
    causal = dense_bam._plan(q.reshape(-1, Q, D)[:1], k.reshape(-1, K, D)[:1], None, True, key_block=4)
    assert [(c.rows, c.keys, c.visible) for c in causal] == [
        (slice(0, 4), slice(0, 4), 4), (slice(4, 6), slice(0, 4), 4), (slice(4, 6), slice(4, 6), 2)]


def test_fully_masked_rows_give_exact_zeros_and_finite_gradients():
    norm = attention.build("bam-wc", key_dim=D).train()
    q, k, v, mask, noise = _inputs()
    out, kl = _fused(norm, q, k, v, mask, False, noise)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    grads = _loss_grads(norm, out, kl, (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.equal(grads[1][2], torch.zeros_like(grads[1][2]))  # keys nobody sees get no gradient


@pytest.mark.parametrize("causal", [False, True])
def test_row_statistics_are_those_of_the_masked_scores(causal):
    """LSE_i (-inf on rows without keys) and S2_i of the chunks equal torch's on the masked scores."""
    q, k, v, mask, _ = _inputs()
    visible = mask & (torch.ones(Q, K).tril().bool() if causal else True)
    scores = (q @ k.transpose(-1, -2) * D**-0.5).detach()
    sampler = dense_bam.Sampler("weibull", 0.0, 0.0, seed=0)
    _, lse, sq, _ = dense_bam._chunked_attention(q.detach(), k.detach(), v.detach(), mask, causal, D**-0.5,
                                                 sampler, True, True, None)
    want_lse = torch.logsumexp(scores.masked_fill(~visible, float("-inf")), -1)
    assert torch.isneginf(want_lse[2]).all() and torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sq, scores.masked_fill(~visible, 0.0).square().sum(-1), rtol=1e-6, atol=1e-6)


def test_bfloat16_matches_materialised_within_stated_tolerance():
    """bf16 inputs: the fused path computes in float32 throughout, the materialised one rounds
    its scores and weights to bf16, so they agree to bf16 resolution (2e-2)."""
    norm = attention.build("bam-wc", key_dim=D, k=4.0).train()
    q, k, v, mask, noise = _inputs(torch.bfloat16)
    out, kl = _fused(norm, q, k, v, mask, False, noise)
    ref_out, ref_kl = _materialised(norm, q, k, v, mask, False, noise)
    assert out.dtype == torch.bfloat16 and kl.dtype == torch.float32
    torch.testing.assert_close(out, ref_out, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(kl, ref_kl, rtol=2e-2, atol=2e-2)
    for got, want in zip(_loss_grads(norm, out, kl, (q, k, v)), _loss_grads(norm, ref_out, ref_kl, (q, k, v))):
        torch.testing.assert_close(got.float(), want.float(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("name", ["bam-wc", "bam-lc"])
def test_drawn_noise_and_dropout_are_replayed_in_the_backward_pass(name, monkeypatch):
    """Kept tiles and recomputed tiles (which draw the noise and dropout mask again) agree."""
    norm = attention.build(name, key_dim=D, **({"k": 2.0} if name == "bam-wc" else {"sigma": 1.0})).train()
    q, k, v, mask, _ = _inputs()
    monkeypatch.setattr(dense_bam, "CHUNK_ELEMENTS", B * H * K * 4)
    results = []
    for keep in (1 << 30, 700, 0):  # all tiles; the first chunk's weights and dropout mask; none
        monkeypatch.setattr(dense_bam, "KEEP_BYTES", keep)
        torch.manual_seed(5)
        with attention.aux_losses() as aux:
            out = dense_bam.dense_bam_attention(norm, q, k, v, mask=mask, dropout=0.3)
        results.append((out, *_loss_grads(norm, out, aux.total(), (q, k, v))))
    softmax_out = torch.softmax((q @ k.transpose(-1, -2) * D**-0.5).masked_fill(~mask, float("-inf")), -1)
    assert not torch.allclose(results[0][0][:2], (softmax_out @ v)[:2], atol=1e-3)  # noise and dropout act
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name, options, cap", [("bam-wf", {"k": 2.0}, 0.04),
                                                ("bam-lf", {"sigma": 1.0}, float("inf"))])
def test_drawn_sample_has_the_law_of_the_materialised_sample(name, options, cap):
    """Mean and spread of the output over many draws match the materialised path's (the Weibull
    case also within its earlier absolute bound, ``cap``)."""
    torch.manual_seed(0)
    q, k, v, mask, _ = _inputs()
    norm = attention.build(name, **options).train()
    scores = q.detach() @ k.detach().transpose(-1, -2) * D**-0.5
    with torch.no_grad():
        fused = torch.stack([dense_bam.dense_bam_attention(norm, q, k, v, mask=mask) for _ in range(2000)])
        full = torch.stack([norm(scores, mask=mask) @ v for _ in range(2000)])
    n, spread = len(fused), fused.var(0) + full.var(0)
    # within 5 standard errors of the difference of two independent estimates
    mean_bound = (5 * (spread / n).sqrt() + 1e-4).clamp_max(cap)
    std_bound = (5 * (spread / (2 * n)).sqrt() + 1e-4).clamp_max(cap)
    assert ((fused.mean(0) - full.mean(0)).abs() <= mean_bound).all()
    assert ((fused.std(0) - full.std(0)).abs() <= std_bound).all()


def assert_standard_law(x, law, pairs):
    """``x`` is standard normal (``law == "normal"``) or ``log(-log u)`` (a standard Gumbel of
    minima: mean -0.5772, variance pi^2/6): moments and quantiles within 5 standard errors; for
    normals, the squares of the Box-Muller pairs ``pairs = (a, b)`` (index tensors) are uncorrelated."""
    assert x.dtype == torch.float32 and torch.isfinite(x).all()
    x = x.double().flatten()
    n = x.numel()
    if law == "normal":
        mean, var, kurtosis, cdf = 0.0, 1.0, 3.0, lambda t: 0.5 * (1 + torch.erf(t / 2**0.5))
    else:
        mean, var, kurtosis, cdf = -0.5772156649, torch.pi**2 / 6, 5.4, lambda t: 1 - torch.exp(-torch.exp(t))
    assert abs(x.mean() - mean) <= 5 * (var / n) ** 0.5
    assert abs(x.var() / var - 1) <= 5 * ((kurtosis - 1) / n) ** 0.5
    for t in (-3.0, -1.5, 0.0, 1.0, 2.5):
        p = cdf(torch.tensor(t, dtype=torch.float64))
        assert abs((x < t).double().mean() - p) <= 5 * (p * (1 - p) / n) ** 0.5 + 1e-6
    if law == "normal":  # the pairs of a Box-Muller draw are independent: their squares uncorrelated
        a, b = x[pairs[0]].square(), x[pairs[1]].square()
        assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1]) <= 5 / len(pairs[0]) ** 0.5


@pytest.mark.parametrize("law", ["normal", "log_weibull"])
def test_chunk_noise_has_its_standard_law(law):
    """The PyTorch path's noise (numpy's words; Box-Muller pairs are the two halves of the draw)."""
    like = torch.empty(1001, 1001)  # odd size: the Box-Muller halves do not line up with rows
    x = getattr(dense_bam._Stream(11), law)(like)
    assert x.shape == like.shape
    half = (like.numel() + 1) // 2
    assert_standard_law(x, law, (torch.arange(like.numel() - half), torch.arange(half, like.numel())))


def test_attend_takes_the_fused_path_only_when_no_map_is_needed(monkeypatch):
    calls = []
    original = dense_bam.dense_bam_attention
    monkeypatch.setattr(dense_bam, "dense_bam_attention", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    q, k, v, mask, _ = _inputs()
    attend = Attend(H, D, {"normalizer": "bam-wc"}).train()
    with attention.aux_losses() as aux:
        out, maps = attend(q, k, v, mask=mask)
    assert calls and maps.weights is None and "bam_kl" in aux.by_name()
    calls.clear()
    with attention.aux_losses() as aux:
        out, maps = attend(q, k, v, mask=mask, need_maps=True)
    assert not calls and maps.weights is not None and "bam_kl" in aux.by_name()
    per_query = torch.rand(B, 1, Q, K, generator=torch.Generator().manual_seed(0)) > 0.3
    attend(q, k, v, mask=per_query)
    assert not calls  # per-query masks keep the materialised path
    with attention.aux_losses():
        attend(q, k, v, causal=True)
    assert not calls  # no closed-form contextual KL under a causal mask
    span = Attend(H, D, {"normalizer": "bam-wc", "span": {"max_span": 4, "ramp": 2, "distance": "rank"}}).train()
    span(q, k, v, mask=mask)
    assert not calls


def test_attend_evaluation_is_softmax_and_training_is_seeded():
    q, k, v, mask, _ = _inputs()
    attend = Attend(H, D, {"normalizer": "bam-wc"})
    plain = Attend(H, D)
    q, k, v, mask = q[:2], k[:2], v[:2], mask[:2]
    out, _ = attend.eval()(q, k, v, mask=mask)
    torch.testing.assert_close(out, plain(q, k, v, mask=mask)[0])
    attend.train()
    torch.manual_seed(3)
    first, _ = attend(q, k, v, mask=mask)
    torch.manual_seed(3)
    second, _ = attend(q, k, v, mask=mask)
    assert torch.equal(first, second) and not torch.allclose(first, out)


def test_multihead_bam_trains_through_the_fused_path():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, {"normalizer": "bam-lc", "dropout": 0.1}).train()
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[True] * 5, [True] * 2 + [False] * 3]).view(2, 1, 1, 5)
    with attention.aux_losses() as aux:
        out, _ = layer(x, mask=mask)
    (out.square().mean() + aux.total()).backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())
    assert layer.attend.normalizer.prior_net.hidden.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["bam-wc", "bam-lc"])
@pytest.mark.parametrize("options", [{"prior_per_head": True}, {"prior_scope": "all"}], ids=["per-head", "all-keys"])
def test_official_prior_options_give_the_materialised_kl(name, options, monkeypatch):
    """Per-head prior networks and a prior normalised over every key (masked ones included) give
    the materialised KL through the fused path (its sums run over the visible keys either way)."""
    q, k, v, mask, _ = _inputs()
    attend = Attend(H, D, {"normalizer": name, "normalizer_options": options}).eval()  # posterior mean
    results = []
    for fused in ("1", "0"):
        monkeypatch.setenv("ATTN_FUSED_BAM", fused)
        with attention.aux_losses() as aux:
            out, _ = attend(q[:2], k[:2], v[:2], mask=mask[:2])
        results.append((out, aux.total(), torch.autograd.grad(aux.total(), list(attend.parameters()))))
    (out, kl, grads), (ref_out, ref_kl, ref_grads) = results
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kl, ref_kl, rtol=1e-5, atol=1e-6)
    for got, ref in zip(grads, ref_grads):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)  # the bias of an all-key prior: 0 up to roundoff
