"""alpha-entmax: learnable alpha per head, sparsity, and edge-wise bisection vs the entmax package."""
import entmax as entmax_lib
import pytest
import torch

from common import attention
from common.attention.functional import entmax_bisect_groups

from .helpers import dense_to_edges, edges_to_dense


def test_edgewise_bisection_equals_entmax_package_on_the_same_rows():
    torch.manual_seed(0)
    scores = torch.randn(2, 4, 5, 8, dtype=torch.float64) * 3
    mask = torch.rand(2, 1, 5, 8) > 0.3
    mask[..., 0] = True
    alpha = torch.tensor([1.1, 1.5, 1.8, 2.0], dtype=torch.float64)
    dense = entmax_lib.entmax_bisect(scores.masked_fill(~mask, float("-inf")), alpha.view(4, 1, 1).expand(2, 4, 5, 1), dim=-1, n_iter=60)
    e_scores, index, n, _, _, pos = dense_to_edges(scores, mask)
    edge = entmax_bisect_groups(e_scores, alpha, attention.EdgeGroups(index, n), n_iter=60)
    assert torch.allclose(edges_to_dense(edge, pos, scores.shape), dense, atol=1e-9)
    for exact, a in ((entmax_lib.entmax15, 1.5), (entmax_lib.sparsemax, 2.0)):
        reference = exact(scores.masked_fill(~mask, float("-inf")), dim=-1)
        edge = entmax_bisect_groups(e_scores, torch.tensor(a, dtype=torch.float64), attention.EdgeGroups(index, n), n_iter=60)
        assert torch.allclose(edges_to_dense(edge, pos, scores.shape), reference, atol=1e-9)


def test_alpha_gradient_matches_entmax_package():
    torch.manual_seed(0)
    scores = torch.randn(3, 6, 7, dtype=torch.float64)
    alpha = torch.tensor([1.2, 1.6, 1.9], dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(3, 6, 7, dtype=torch.float64)
    ref = entmax_lib.entmax_bisect(scores, alpha.view(3, 1, 1).expand(3, 6, 1), dim=-1, n_iter=60)
    (ref * upstream).sum().backward()
    ref_grad, alpha.grad = alpha.grad.clone(), None
    ours = entmax_bisect_groups(scores, alpha.view(3, 1, 1), attention.DenseGroups(), n_iter=60)
    (ours * upstream).sum().backward()
    assert torch.allclose(alpha.grad, ref_grad, atol=1e-7)


def test_learnable_alpha_per_head_stays_in_range_and_learns():
    torch.manual_seed(0)
    norm = attention.build("entmax", num_heads=4, alpha=1.5)
    assert norm.alpha.shape == (4,) and torch.allclose(norm.alpha, torch.full((4,), 1.5))
    with torch.no_grad():
        norm.alpha_logit.copy_(torch.tensor([-50.0, -2.0, 2.0, 50.0]))
    assert norm.alpha.min() >= 1.01 and norm.alpha.max() <= 2.0
    opt = torch.optim.SGD(norm.parameters(), lr=1.0)
    scores = torch.randn(8, 4, 5, 6)
    before = norm.alpha.detach().clone()
    norm(scores).pow(2).sum().backward()  # prefers peaked weights: pushes alpha up
    assert norm.alpha_logit.grad[1:3].abs().min() > 0
    opt.step()
    assert not torch.equal(before, norm.alpha.detach())


def test_entmax_rows_are_sparse_and_sum_to_one():
    torch.manual_seed(0)
    scores = torch.randn(4, 2, 6, 20) * 3
    for name in ("entmax", "entmax15", "sparsemax"):
        w = attention.build(name, num_heads=2)(scores)
        assert torch.allclose(w.sum(-1), torch.ones(4, 2, 6), atol=1e-5)
        assert (w == 0).float().mean() > 0.3, name


def test_fixed_alpha_is_a_buffer_not_a_parameter():
    norm = attention.build("entmax", alpha=1.3, learn_alpha=False, num_heads=2)
    assert not list(norm.parameters())
    with pytest.raises(ValueError, match=r"alpha must be in \[1.01, 2\]"):
        attention.build("entmax", alpha=1.0)


@pytest.mark.parametrize("power,heads", [(0, 3), (0, 1), (1, 1), (2, 1)])
def test_dense_entmax_is_a_checked_custom_operator(power, heads):
    """``torch.ops.attention_suite.entmax`` passes torch.library's checks (schema, fake tensor, autograd
    registration, dynamic shapes), and its gradients match finite differences (float64)."""
    from common.attention.entmax import dense_entmax
    g = torch.Generator().manual_seed(0)
    scores = (torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64) * 2).requires_grad_()
    mask = torch.rand(2, 1, 4, 5, generator=g) > 0.3
    mask[0, 0, 1] = False  # a fully masked row
    alpha = (torch.tensor([1.2, 1.5, 1.9], dtype=torch.float64)[:heads] if power == 0 else
             torch.tensor([[0, 2.0, 1.5][power]], dtype=torch.float64)).requires_grad_(power == 0)
    for m in (mask, None):
        torch.library.opcheck(dense_entmax, (scores, m, alpha, 40, power))
    out = dense_entmax(scores, mask, alpha, 60, power)
    assert torch.equal(out[~mask.expand_as(out)], torch.zeros(int((~mask.expand_as(out)).sum()), dtype=out.dtype))
    inputs = (scores, alpha) if power == 0 else (scores,)
    torch.autograd.gradcheck(lambda *x: dense_entmax(x[0], None, x[1] if power == 0 else alpha, 60, power), inputs,
                             atol=1e-6)
