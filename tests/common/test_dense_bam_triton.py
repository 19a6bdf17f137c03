"""The Triton dense BAM kernels (TRITON_INTERPRET=1 without a GPU) against the materialised path
under the noise the kernels draw (common.attention.kernels.dense_bam.standard_noise)."""
import pytest
import torch

from common import attention
from common.attention import dense_bam
from common.attention.kernels import interpreting, triton_available

pytestmark = pytest.mark.skipif(not triton_available() or not (torch.cuda.is_available() or interpreting()),
                                reason="needs Triton, with a GPU or TRITON_INTERPRET=1")

B, H, Q, K, D = 2, 2, 20, 24, 8  # two 16-blocks in each direction, neither full


def _inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=g).requires_grad_() for n in (Q, K, K))
    mask = (torch.arange(K) < torch.tensor([K, 0])[:, None]).view(B, 1, 1, K)  # batch 1: no key at all
    return q, k, v, mask


def _kernel_draws(norm, dropout):
    """The seeds the next call draws, and the noise and dropout scale the kernels make from them."""
    from common.attention.kernels.dense_bam import NOISE_LOGNORMAL, NOISE_WEIBULL, seed_for_call, standard_noise
    kind = NOISE_WEIBULL if norm.posterior == "weibull" else NOISE_LOGNORMAL
    noise, keep = standard_noise(B * H, Q, K, kind, seed_for_call("cpu"), dropout, "cpu")
    return noise.view(B, H, Q, K), keep.view(B, H, Q, K)


def _reference(norm, q, k, v, mask, causal, noise, keep):
    full = mask
    if causal:
        tri = torch.ones(Q, K, dtype=torch.bool).tril()
        full = tri if mask is None else mask & tri
    norm._log_noise = lambda scores: noise
    try:
        with attention.aux_losses() as aux:
            weights = norm(q @ k.transpose(-1, -2) * D**-0.5, mask=full, keys=k)
            out = (weights * keep) @ v
    finally:
        del norm._log_noise
    return out, aux.total()


@pytest.mark.parametrize("name,use_mask,causal,dropout", [
    ("bam-wc", True, False, 0.0), ("bam-lc", True, False, 0.0), ("bam-lf", False, False, 0.0),
    ("bam-wf", True, True, 0.0), ("bam-wf", False, False, 0.25)])
def test_triton_kernels_equal_the_materialised_path(name, use_mask, causal, dropout, monkeypatch):
    monkeypatch.setenv("ATTN_TRITON", "1")
    norm = attention.build(name, key_dim=D, k=4.0, sigma=0.5).train()
    q, k, v, mask = _inputs()
    mask = mask if use_mask else None
    torch.manual_seed(11)
    with attention.aux_losses() as aux:
        out = dense_bam.dense_bam_attention(norm, q, k, v, mask=mask, causal=causal, dropout=dropout)
    kl = aux.total()
    torch.manual_seed(11)
    noise, keep = _kernel_draws(norm, dropout)
    ref_out, ref_kl = _reference(norm, q, k, v, mask, causal, noise, keep)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kl, ref_kl, rtol=1e-5, atol=1e-5)
    if use_mask:
        assert torch.equal(out[1], torch.zeros_like(out[1]))
    upstream = torch.linspace(-1, 1, out.numel()).view_as(out)
    inputs = [q, k, v, *norm.parameters()]
    got = torch.autograd.grad((out * upstream).sum() + kl, inputs)
    want = torch.autograd.grad((ref_out * upstream).sum() + ref_kl, inputs)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_kernel_noise_has_the_posterior_law():
    """The in-kernel draws are standard Gumbel-type ``log(-log u)`` and ``N(0, 1)`` samples."""
    from common.attention.kernels.dense_bam import NOISE_LOGNORMAL, NOISE_WEIBULL, standard_noise
    weibull, keep = standard_noise(4, 64, 64, NOISE_WEIBULL, torch.tensor([1]), 0.25, "cpu")
    normal, _ = standard_noise(4, 64, 64, NOISE_LOGNORMAL, torch.tensor([3]), 0.0, "cpu")
    # log(-log u) with u uniform: mean -gamma (Euler), variance pi^2 / 6
    assert abs(weibull.mean() + 0.5772) < 0.03 and abs(weibull.var() - 1.6449) < 0.06
    assert abs(normal.mean()) < 0.03 and abs(normal.var() - 1) < 0.05
    assert abs((keep == 0).float().mean() - 0.25) < 0.02
    torch.testing.assert_close(keep.unique(), torch.tensor([0.0, 4 / 3]))


def test_the_kernels_are_a_checked_custom_operator():
    """``torch.ops.attention_suite.dense_bam`` passes torch.library's checks (schema, fake tensors, autograd
    registration) on the interpreter."""
    from common.attention.dense_bam import triton_dense_bam
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, D, generator=g).requires_grad_() for n in (Q, K, K))
    km = (torch.arange(K) < torch.tensor([K, 5])[:, None]).to(torch.int8)
    seed = torch.tensor([7])
    for mask, causal, noise in ((km, False, 1), (None, True, 2)):
        torch.library.opcheck(triton_dense_bam, (q, k, v, mask, seed, causal, D ** -0.5, noise, 0.5, 0.0, True, True),
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_torch_compile_keeps_the_kernels_in_one_graph(monkeypatch):
    """Under torch.compile the Triton path stays (the operator is in the graph, no break) and gives eager's
    output and KL for the same seed."""
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
    assert any("attention_suite.dense_bam" in str(node.target) for graph in explanation.graphs
               for node in graph.graph.nodes)
    torch.manual_seed(3)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.autograd.grad(compiled[0].sum() + compiled[1], (q, k, v))


def test_kernel_draws_are_keyed_by_key_query_and_head_not_by_a_flat_offset():
    """The noise and dropout of an entry depend on (key, query, batch*head) and the seed only, never on a
    product of indices (``query * K + key`` wrapped past 2^31 at L = 46k): the same entries of a narrower
    and a wider call agree."""
    from common.attention.kernels.dense_bam import NOISE_LOGNORMAL, NOISE_WEIBULL, standard_noise
    seed = torch.tensor([5])
    for kind in (NOISE_WEIBULL, NOISE_LOGNORMAL):
        narrow, keep_narrow = standard_noise(2, 3, 8, kind, seed, 0.3, "cpu")
        wide, keep_wide = standard_noise(2, 5, 40, kind, seed, 0.3, "cpu")
        assert torch.equal(wide[:, :3, :8], narrow) and torch.equal(keep_wide[:, :3, :8], keep_narrow)
        assert not torch.equal(wide[0], wide[1])  # heads draw differently
