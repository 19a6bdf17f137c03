"""The fused Triton entmax bisection (run by Triton's interpreter without a GPU) against the
``entmax`` package and the PyTorch bisection: values, gradients for the scores and alpha, masks,
extreme logits, alpha near 1 and 2, both layouts, and the normalizers' dispatch."""
import entmax as entmax_lib
import pytest
import torch

from common import attention
from common.attention.functional import entmax_bisect_groups

from .helpers import dense_to_edges, edges_to_dense

pytest.importorskip("triton")
from common.attention.kernels import entmax_bisect as fused  # noqa: E402

ALPHAS = torch.tensor([1.01, 1.5, 1.999], dtype=torch.float64)
N_ITER = 20  # the kernel and the PyTorch bisections run the same iterates: equal for any count
EMPTY = (0, slice(None), 2)  # the fully masked row of _case


def _case(seed=0, scale=3.0, heads=3, dtype=torch.float64):
    """Scores [1, heads, 3, 6] (few rows: the interpreter runs one program at a time), a key mask
    with a fully masked row, the reference's mask (that row open: the entmax package gives NaN on
    it) and an upstream gradient that is zero on that row."""
    g = torch.Generator().manual_seed(seed)
    scores = (torch.randn(1, heads, 3, 6, generator=g, dtype=dtype) * scale).requires_grad_()
    mask = torch.rand(1, 1, 3, 6, generator=g) > 0.3
    mask[..., 0] = True
    ref_mask = mask.clone()
    mask[0, 0, 2] = False
    upstream = torch.randn(1, heads, 3, 6, generator=g, dtype=dtype)
    upstream[EMPTY] = 0
    return scores, mask, ref_mask, upstream


def _reference(scores, alpha, ref_mask, mask, n_iter):
    """The entmax package on the open rows; zeros where ``mask`` is False."""
    filled = scores.masked_fill(~ref_mask, torch.finfo(scores.dtype).min)
    if isinstance(alpha, float):
        exact = {1.5: entmax_lib.entmax15, 2.0: entmax_lib.sparsemax}[alpha]
        return torch.where(mask, exact(filled, dim=-1), 0.0)
    expanded = alpha.view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.where(mask, entmax_lib.entmax_bisect(filled, expanded, dim=-1, n_iter=n_iter), 0.0)


def _grads(out, upstream, *inputs):
    return torch.autograd.grad((out * upstream).sum(), inputs, retain_graph=True)


def test_dense_kernel_equals_entmax_package_values_and_gradients_with_masks():
    scores, mask, ref_mask, upstream = _case()
    alpha = ALPHAS.clone().requires_grad_()
    ours = fused.entmax_bisect_dense(scores, alpha, mask, n_iter=N_ITER)
    ref = _reference(scores, alpha, ref_mask, mask, N_ITER)
    assert torch.allclose(ours, ref, atol=1e-12)
    masked = ~mask.expand_as(ours)
    assert torch.equal(ours[masked], torch.zeros(int(masked.sum()), dtype=ours.dtype))  # exact zeros
    assert torch.allclose(ours.sum(-1)[mask.any(-1).expand(ours.shape[:-1])], torch.tensor(1.0, dtype=ours.dtype))
    d_scores, d_alpha = _grads(ours, upstream, scores, alpha)
    r_scores, r_alpha = _grads(ref, upstream, scores, alpha)
    assert torch.allclose(d_scores, r_scores, atol=1e-10) and torch.allclose(d_alpha, r_alpha, atol=1e-9)
    # The fully masked row: zero weights, and gradients that are zero, not NaN, whatever comes from above.
    d_scores, d_alpha = _grads(ours, torch.ones_like(ours), scores, alpha)
    assert torch.equal(d_scores[EMPTY], torch.zeros_like(d_scores[EMPTY])) and d_alpha.isfinite().all()


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_fixed_alpha_kernel_equals_exact_sort_on_extreme_logits(alpha):
    scores, mask, ref_mask, upstream = _case(seed=1, scale=1e4, heads=1)  # logits 1e4 apart
    big = (scores.detach() + 1e6).requires_grad_()  # and far from zero
    for x in (scores, big):
        ours = fused.entmax_bisect_dense(x, alpha, mask, n_iter=N_ITER)  # exact once the support is found
        ref = _reference(x, alpha, ref_mask, mask, None)
        assert torch.allclose(ours, ref, atol=1e-13) and not ours.isnan().any()
        assert torch.allclose(_grads(ours, upstream, x)[0], _grads(ref, upstream, x)[0], atol=1e-12)


def test_float32_kernel_near_alpha_one_and_two():
    scores, mask, ref_mask, upstream = _case(seed=2, heads=4, dtype=torch.float32)
    alpha = torch.tensor([1.01, 1.02, 1.98, 2.0], requires_grad=True)
    ours = fused.entmax_bisect_dense(scores, alpha, mask)  # float32: 31 iterations
    exact = scores.detach().double().requires_grad_(), alpha.detach().double().requires_grad_()
    ref = _reference(*exact, ref_mask, mask, 60)  # float64, converged
    assert torch.allclose(ours.double(), ref, atol=1e-6) and not ours.isnan().any()
    d_scores, d_alpha = _grads(ours, upstream, scores, alpha)
    r_scores, r_alpha = _grads(ref, upstream.double(), *exact)
    assert torch.allclose(d_scores.double(), r_scores, atol=1e-5)
    # d/d alpha carries 1/(alpha-1)^2 = 1e4 at alpha = 1.01: float32 cancellation (the package's too).
    assert torch.allclose(d_alpha.double(), r_alpha, rtol=5e-3, atol=1e-5)


@pytest.mark.parametrize("sorted_edges", [True, False])
def test_edgewise_kernel_equals_pytorch_bisection(sorted_edges):
    scores, mask, ref_mask, upstream = _case(seed=3)
    e_scores, index, n, _, _, pos = dense_to_edges(scores.detach(), mask)
    if not sorted_edges:
        perm = torch.randperm(index.numel(), generator=torch.Generator().manual_seed(0))
        e_scores, index, pos = e_scores[perm], index[perm], tuple(p[perm] for p in pos)
    e_scores.requires_grad_()
    alpha = ALPHAS.clone().requires_grad_()
    ptr = None
    if sorted_edges:
        ptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(index, minlength=n).cumsum(0)])
    groups = attention.EdgeGroups(index, n, ptr)
    ours = fused.entmax_bisect_groups(e_scores, alpha, groups, n_iter=N_ITER)
    ref = entmax_bisect_groups(e_scores, alpha, attention.EdgeGroups(index, n), n_iter=N_ITER)
    assert torch.allclose(ours, ref, atol=1e-12)
    e_up = upstream[pos[0], :, pos[1], pos[2]]
    for a, b in zip(_grads(ours, e_up, e_scores, alpha), _grads(ref, e_up, e_scores, alpha)):
        assert torch.allclose(a, b, atol=1e-9)
    dense = fused.entmax_bisect_dense(scores.detach(), ALPHAS, mask, n_iter=N_ITER)
    assert torch.allclose(edges_to_dense(ours.detach(), pos, scores.shape), dense, atol=1e-12)


@pytest.mark.parametrize("name", ["entmax", "entmax15", "sparsemax"])
def test_normalizers_dispatch_to_the_kernel_with_attn_triton(name, monkeypatch):
    scores, mask, _, upstream = _case(seed=4, heads=2, dtype=torch.float32)
    norm = attention.build(name, num_heads=2)
    monkeypatch.setenv("ATTN_TRITON", "0")
    ref = norm(scores, mask=mask)
    ref_grads = _grads(ref, upstream, scores, *norm.parameters())
    calls = []
    for name in ("dense_forward", "entmax_bisect_groups"):  # the dense operator's, the edge-wise layout's
        real = getattr(fused, name)
        monkeypatch.setattr(fused, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    monkeypatch.setenv("ATTN_TRITON", "1")
    ours = norm(scores, mask=mask)
    assert calls, "ATTN_TRITON=1 under the interpreter must take the fused kernel"
    assert torch.allclose(ours, ref, atol=1e-5)
    for a, b in zip(_grads(ours, upstream, scores, *norm.parameters()), ref_grads):
        assert torch.allclose(a, b, atol=1e-4)
    e_scores, index, n, _, _, _ = dense_to_edges(scores.detach(), mask)
    edge = norm(e_scores, index=index, num_nodes=n)
    monkeypatch.setenv("ATTN_TRITON", "0")
    assert len(calls) == 2 and torch.allclose(edge, norm(e_scores, index=index, num_nodes=n), atol=1e-5)


@pytest.mark.parametrize("alpha", ["learned", 1.5, 2.0])
def test_groups_longer_than_the_register_block_stream_the_rest(alpha, monkeypatch):
    """Rows of 40 keys and a hub node of 40 edges with 16 register lanes: the kernel reads the
    entries past its first block at every pass and equals the one-block result and the reference."""
    g = torch.Generator().manual_seed(5)
    scores = (torch.randn(1, 3, 4, 40, generator=g, dtype=torch.float64) * 3).requires_grad_()
    mask = torch.rand(1, 1, 4, 40, generator=g) > 0.2
    mask[0, 0, 3] = False  # a fully masked row
    a = ALPHAS.clone().requires_grad_() if alpha == "learned" else alpha
    upstream = torch.randn(scores.shape, generator=g, dtype=torch.float64)
    one_block = fused.entmax_bisect_dense(scores, a, mask, n_iter=N_ITER)
    grads = _grads(one_block, upstream, scores, *([a] if alpha == "learned" else []))
    monkeypatch.setattr(fused, "DENSE_BLOCK", 16)
    monkeypatch.setattr(fused, "CSR_BLOCK", 16)
    streamed = fused.entmax_bisect_dense(scores, a, mask, n_iter=N_ITER)
    assert torch.allclose(streamed, one_block, atol=1e-12)
    for x, y in zip(_grads(streamed, upstream, scores, *([a] if alpha == "learned" else [])), grads):
        assert torch.allclose(x, y, atol=1e-10)
    # edge-wise: each (batch, query) is a node, 28-40 edges each; the CSR block follows the mean degree (capped at 16)
    e_scores, index, n, _, _, pos = dense_to_edges(scores.detach(), mask)
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(index, minlength=n).cumsum(0)])
    edge = fused.entmax_bisect_csr(e_scores, ALPHAS if alpha == "learned" else alpha, ptr, n_iter=N_ITER)
    assert torch.allclose(edges_to_dense(edge, pos, scores.shape), one_block.detach(), atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("alpha", ["learned", 1.5, 2.0])
def test_half_precision_inputs_are_computed_in_float32(dtype, alpha):
    """bf16/fp16 scores: the kernel computes in float32 (Triton's log/exp2/sqrt take no half types) and
    stores the weights in the input dtype: the float32 result to within one rounding (the interpreter
    rounds toward zero, a GPU to nearest)."""
    scores, mask, _, upstream = _case(seed=6, heads=3, dtype=torch.float32)
    half = scores.detach().to(dtype).requires_grad_()
    a = ALPHAS.float() if alpha == "learned" else alpha
    ours = fused.entmax_bisect_dense(half, a, mask)
    ref = fused.entmax_bisect_dense(half.detach().float(), a, mask)
    assert ours.dtype == dtype and torch.allclose(ours.float(), ref, rtol=torch.finfo(dtype).eps, atol=1e-7)
    (d_half,) = _grads(ours, upstream.to(dtype), half)
    assert d_half.dtype == dtype and d_half.isfinite().all()


@pytest.mark.parametrize("alpha", ["learned", 2.0])
def test_the_csr_operators_pass_opcheck(alpha):
    """``torch.library.opcheck`` of ``attention_suite::entmax_csr`` and its backward: schema, autograd
    registration, fake implementations and AOT dispatch with dynamic shapes."""
    scores, mask, _, _ = _case(seed=7, heads=3)
    e_scores, index, n, _, _, _ = dense_to_edges(scores.detach(), mask)
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(index, minlength=n).cumsum(0)])
    a = ALPHAS.clone().requires_grad_() if alpha == "learned" else torch.full((1,), alpha, dtype=torch.float64)
    power = fused.power_mode(ALPHAS if alpha == "learned" else alpha)
    torch.library.opcheck(fused.csr_entmax, (e_scores.requires_grad_(), ptr, a, N_ITER, power))
    weights = fused.csr_entmax(e_scores.detach(), ptr, a.detach(), N_ITER, power)
    torch.library.opcheck(fused.csr_entmax_backward, (weights, torch.randn_like(weights), ptr, a.detach(), power,
                                                      alpha == "learned"))
