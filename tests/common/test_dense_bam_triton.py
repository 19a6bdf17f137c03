"""The GPU operator of dense BAM (``attention_suite::bam_attention``: the Triton kernels of
common.attention.kernels.dense_bam and dense_bam_kl, run by TRITON_INTERPRET=1 without a GPU) against the
materialised path under the noise the kernels draw (common.attention.kernels.dense_bam.standard_noise)."""
import pytest
import torch

from common import attention
from common.attention import dense_bam
from common.attention.kernels import interpreting, triton_available

pytestmark = pytest.mark.skipif(not triton_available() or not (torch.cuda.is_available() or interpreting()),
                                reason="needs Triton, with a GPU or TRITON_INTERPRET=1")

B, H, Q, K, D = 2, 2, 20, 24, 8  # past one 16-block in each direction, neither full


def _inputs(q_len=Q, k_len=K, d=D, dv=D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, q_len, d, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, H, k_len, d, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, H, k_len, dv, generator=g).to(dtype).requires_grad_()
    mask = (torch.arange(k_len) < torch.tensor([k_len - 5, 0])[:, None]).view(B, 1, 1, k_len)  # batch 1: no key
    return q, k, v, mask


def _kernel_draws(norm, n_q, n_k, dropout):
    """The noise and dropout scale the kernels draw from the seed the next call draws."""
    from common.attention.kernels.dense_bam import NOISE_LOGNORMAL, NOISE_WEIBULL, seed_for_call, standard_noise
    kind = NOISE_WEIBULL if norm.posterior == "weibull" else NOISE_LOGNORMAL
    noise, keep = standard_noise(B * H, n_q, n_k, kind, seed_for_call("cpu"), dropout, "cpu")
    return noise.view(B, H, n_q, n_k), keep.view(B, H, n_q, n_k)


def _reference(norm, q, k, v, mask, causal, noise, keep):
    """The materialised path: scores, the BAM normalizer with the given noise, dropout's scale, weights @ v."""
    full = mask
    if causal:
        tri = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        full = tri if mask is None else mask & tri
    norm._log_noise = lambda scores: noise.to(scores.dtype)
    try:
        with attention.aux_losses() as aux:
            weights = norm(q.float() @ k.float().transpose(-1, -2) * q.shape[-1] ** -0.5, mask=full, keys=k.float())
            out = (weights * keep) @ v.float()
    finally:
        del norm._log_noise
    return out, aux.total()


def _compare(norm, q, k, v, mask, causal=False, dropout=0.0, rtol=1e-5, atol=1e-5, monkeypatch=None):
    """The operator's output, KL and gradients (inputs and the prior network's) against the materialised path's."""
    torch.manual_seed(11)
    with attention.aux_losses() as aux:
        out = dense_bam.dense_bam_attention(norm, q, k, v, mask=mask, causal=causal, dropout=dropout)
    kl = aux.total()
    torch.manual_seed(11)
    noise, keep = _kernel_draws(norm, q.shape[-2], k.shape[-2], dropout)
    ref_out, ref_kl = _reference(norm, q, k, v, mask, causal, noise, keep)
    assert out.dtype == q.dtype and out.shape == q.shape[:-1] + v.shape[-1:]
    torch.testing.assert_close(out.float(), ref_out, rtol=rtol, atol=atol)
    torch.testing.assert_close(kl.float(), ref_kl, rtol=rtol, atol=atol)
    if mask is not None:
        assert torch.equal(out[1], torch.zeros_like(out[1]))  # rows without a key: exact zeros
    upstream = torch.linspace(-1, 1, out.numel()).view_as(out)
    inputs = [q, k, v, *norm.parameters()]
    got = torch.autograd.grad((out.float() * upstream).sum() + kl, inputs)
    want = torch.autograd.grad((ref_out * upstream).sum() + ref_kl, inputs)
    for name, a, b in zip(["q", "k", "v"] + [n for n, _ in norm.named_parameters()], got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=atol, msg=lambda m: f"d{name}: {m}")


CASES = {  # name, options, mask, causal, dropout
    "bam-wc": ("bam-wc", {}, True, False, 0.0),
    "bam-wc unmasked, beta 2": ("bam-wc", {"beta": 2.0}, False, False, 0.0),
    "bam-wc over all keys": ("bam-wc", {"prior_scope": "all"}, True, False, 0.0),
    "bam-wc per-head tanh prior": ("bam-wc", {"prior_per_head": True, "num_heads": H, "prior_activation": "tanh"},
                                   True, False, 0.0),
    "bam-wc leaky prior, dropout": ("bam-wc", {"prior_activation": "leaky_relu"}, True, False, 0.25),
    "bam-lc": ("bam-lc", {"prior_sigma": 0.8}, True, False, 0.0),
    "bam-lc over all keys": ("bam-lc", {"prior_scope": "all"}, True, False, 0.0),
    "bam-lf": ("bam-lf", {"prior_mu": 0.3}, True, False, 0.0),
    "bam-wf": ("bam-wf", {"prior_alpha": 2.0}, True, False, 0.0),
    "bam-wf causal": ("bam-wf", {}, True, True, 0.0),
    "bam-wf causal, dropout": ("bam-wf", {}, False, True, 0.3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_operator_equals_the_materialised_path(case, monkeypatch):
    monkeypatch.setenv("ATTN_TRITON", "1")
    name, options, use_mask, causal, dropout = CASES[case]
    norm = attention.build(name, key_dim=D, k=4.0, sigma=0.5, **options).train()
    q, k, v, mask = _inputs()
    _compare(norm, q, k, v, mask if use_mask else None, causal, dropout)


@pytest.mark.parametrize("shape", ["cross-attention", "head size 24, values 40", "one query", "several blocks"])
def test_operator_takes_other_shapes(shape, monkeypatch):
    """Queries and keys of different counts, head sizes that are not powers of two (masked lanes), ``dv != d``, and
    several blocks of queries and of keys per (batch, head) (the KL's tickets, ``dQ`` added by several programs)."""
    monkeypatch.setenv("ATTN_TRITON", "1")
    sizes = {"cross-attention": dict(q_len=7, k_len=40), "head size 24, values 40": dict(d=24, dv=40),
             "one query": dict(q_len=1, k_len=33), "several blocks": dict(q_len=70, k_len=75)}[shape]
    norm = attention.build("bam-lc", key_dim=sizes.get("d", D), sigma=0.5).train()
    q, k, v, mask = _inputs(**sizes)
    _compare(norm, q, k, v, mask)


def test_half_precision_follows_float32(monkeypatch):
    """bfloat16 inputs (tensor-core products in bfloat16, float32 arithmetic) follow the float32 reference."""
    monkeypatch.setenv("ATTN_TRITON", "1")
    norm = attention.build("bam-wc", key_dim=D, k=4.0).train()
    q, k, v, mask = _inputs(q_len=40, k_len=70, dtype=torch.bfloat16)  # dQ written in bfloat16 by the last of 3 programs
    _compare(norm, q, k, v, mask, rtol=2e-2, atol=2e-2)


def test_strided_views_need_no_copy_and_the_output_keeps_their_layout(monkeypatch):
    """Heads split from ``[B, L, H, d]`` projections reach the kernels as strided views; the output is laid out
    like the queries, so merging the heads back is a view; several leading dimensions are merged first."""
    monkeypatch.setenv("ATTN_TRITON", "1")
    norm = attention.build("bam-wc", key_dim=D).train()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, n, H, D, generator=g).transpose(1, 2).requires_grad_() for n in (Q, K, K))
    _compare(norm, q, k, v, None)
    torch.manual_seed(0)
    with attention.aux_losses():
        out = dense_bam.dense_bam_attention(norm, q, k, v)
    assert out.stride() == q.stride()
    out.transpose(1, 2).view(B, Q, H * D)  # no copy needed
    five = [x.detach().reshape(1, *x.shape) for x in (q, k, v)]
    torch.manual_seed(0)
    with attention.aux_losses() as aux:
        out5 = dense_bam.dense_bam_attention(norm, *five)
    torch.manual_seed(0)
    with attention.aux_losses() as aux4:
        out4 = dense_bam.dense_bam_attention(norm, q.detach(), k.detach(), v.detach())
    torch.testing.assert_close(out5[0], out4)
    torch.testing.assert_close(aux.total(), aux4.total())


def _standard(kind, n_q, n_k, seed, dropout=0.0, rows_are_queries=True, heads=B * H):
    from common.attention.kernels.dense_bam import NOISE_LOGNORMAL, NOISE_WEIBULL, standard_noise
    noise_kind = {"weibull": NOISE_WEIBULL, "lognormal": NOISE_LOGNORMAL}[kind]
    return standard_noise(heads, n_q, n_k, noise_kind, torch.tensor([seed]), dropout, "cpu", rows_are_queries)


@pytest.mark.parametrize("kind", ["weibull", "lognormal"])
def test_kernel_noise_has_the_posterior_law(kind):
    """Kolmogorov-Smirnov over 2^20 draws: ``log(-log u)`` is Gumbel of minima (``P(X <= x) = 1 - exp(-e^x)``),
    the Lognormal's noise standard normal."""
    from scipy import stats
    noise, _ = _standard(kind, 512, 512, 7, heads=4)
    assert noise.numel() >= 10 ** 6 and torch.isfinite(noise).all()
    law = stats.gumbel_l if kind == "weibull" else stats.norm
    assert stats.kstest(noise.double().flatten().numpy(), law.cdf).pvalue > 0.01
    if kind == "lognormal":  # the two normals of a Box-Muller pair are independent: their squares uncorrelated
        pairs = noise.view(4, 512, 32, 2, 8).square()  # keys 16h + 8b + j: b pairs a call's two normals
        a, b = pairs[:, :, :, 0].flatten(), pairs[:, :, :, 1].flatten()
        assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1]) <= 5 / a.numel() ** 0.5


def test_dropout_draws_keep_one_minus_p():
    _, keep = _standard("weibull", 256, 256, 3, dropout=0.3)
    n = keep.numel()
    torch.testing.assert_close(keep.unique(), torch.tensor([0.0, 1 / 0.7]))
    assert abs((keep == 0).float().mean() - 0.3) <= 5 * (0.3 * 0.7 / n) ** 0.5


@pytest.mark.parametrize("kind", ["weibull", "lognormal"])
def test_forward_and_backward_tiles_draw_the_same_noise(kind):
    """The backward pass's transposed tiles (keys as rows) draw exactly the forward's noise and dropout, and the
    draws of an entry depend on (query, key, batch*head) and the seed only: a wider call agrees on the overlap."""
    noise, keep = _standard(kind, 40, 72, 5, dropout=0.3)
    noise_t, keep_t = _standard(kind, 40, 72, 5, dropout=0.3, rows_are_queries=False)
    assert torch.equal(noise, noise_t) and torch.equal(keep, keep_t)
    wide, keep_wide = _standard(kind, 100, 130, 5, dropout=0.3)
    assert torch.equal(wide[:, :40, :72], noise) and torch.equal(keep_wide[:, :40, :72], keep)
    assert not torch.equal(noise[0], noise[1])  # heads draw differently
    assert not torch.equal(_standard(kind, 40, 72, 6)[0], noise)  # so do seeds


def test_a_seed_replays_bit_for_bit(monkeypatch):
    """The same seed gives the same output and KL (a CUDA graph's replay reads a fresh seed from its tensor)."""
    monkeypatch.setenv("ATTN_TRITON", "1")
    norm = attention.build("bam-wc", key_dim=D).train()
    q, k, v, mask = _inputs()
    runs = []
    for seed in (4, 4, 5):
        torch.manual_seed(seed)
        with attention.aux_losses() as aux:
            runs.append((dense_bam.dense_bam_attention(norm, q, k, v, mask=mask, dropout=0.2), aux.total()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert not torch.equal(runs[0][0], runs[2][0])


def _operator_arguments(norm, q, k, v, mask, causal=False):
    from common.attention.kernels.dense_bam_kl import constants, kl_kind
    net = norm.prior_net
    weights = [net.hidden.weight, net.hidden.bias, net.out.weight, net.out.bias]
    return (q, k, v, mask, torch.tensor([7]), *weights, causal, D ** -0.5, 1, 0.25, 0.1, kl_kind(norm.kl_kernel),
            constants(norm.kl_kernel), False, 0, False, False)


def test_the_operator_passes_torch_library_checks():
    """``torch.ops.attention_suite.bam_attention`` passes torch.library's checks (schema, fake tensors, autograd
    registration) on the interpreter."""
    from common.attention.dense_bam_op import bam_attention
    norm = attention.build("bam-wc", key_dim=D).train()
    q, k, v, mask = _inputs()
    for arguments in (_operator_arguments(norm, q, k, v, mask), _operator_arguments(norm, q, k, v, None, True)):
        torch.library.opcheck(bam_attention, arguments,
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_torch_compile_keeps_the_operator_in_one_graph(monkeypatch):
    """Under torch.compile the operator stays in the graph (no break) and gives eager's output and KL for the
    same seed."""
    monkeypatch.setenv("ATTN_TRITON", "1")
    attend = attention.Attend(H, D, {"normalizer": "bam-wc"}).train()
    q, k, v, mask = _inputs()

    def step(q, k, v):
        with attention.aux_losses() as aux:
            out, _ = attend(q, k, v, mask=mask)
        return out, aux.total()
    torch.manual_seed(3)
    eager = step(q, k, v)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(step)(q, k, v)
    assert explanation.graph_break_count == 0
    assert any("attention_suite.bam_attention" in str(node.target) for graph in explanation.graphs
               for node in graph.graph.nodes)
    torch.manual_seed(3)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.autograd.grad(compiled[0].sum() + compiled[1], (q, k, v))


def test_philox_is_random123s_seven_round_philox():
    """The kernels' Philox (whole 64-bit products) gives Triton's ``tl.philox(..., n_rounds=7)`` words."""
    out = torch.empty(512, dtype=torch.int32)
    _both_philox[(1,)](out, torch.tensor([0x0123456789ABCDEF]), N=512)
    assert bool(out.all())


if triton_available():
    import triton
    import triton.language as tl

    from common.attention.kernels.dense_bam import _philox4x32_7

    @triton.jit
    def _both_philox(OUT, SEED, N: tl.constexpr):
        i = tl.arange(0, N).to(tl.uint32)
        seed = tl.load(SEED)
        c0, c1, c2, c3 = i * 2654435761, i ^ 0xA5A5A5A5, i + 0xFFFFFF00, i * 0 + 7
        a0, a1, a2, a3 = tl.philox(seed, c0, c1, c2, c3, 7)
        b0, b1, b2, b3 = _philox4x32_7(c0, c1, c2, c3, seed)
        tl.store(OUT + tl.arange(0, N), ((a0 == b0) & (a1 == b1) & (a2 == b2) & (a3 == b3)).to(tl.int32))
