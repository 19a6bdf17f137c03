"""``sparse_linear``: ``x @ W.T`` of a sparse CSR ``x`` and its gradients, with the transposed pattern kept."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from graphattn import sparse_features
from graphattn.dropout import SparseDropout
from graphattn.sparse_features import sparse_linear, transposed


def csr(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return x.to_sparse_csr()


def features(rows=30, cols=20, density=0.2, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(rows, cols, generator=generator) * (torch.rand(rows, cols, generator=generator) < density)
    x[3] = 0  # a node without features
    x[:, 5] = 0  # a feature no node has
    return x


def test_values_and_gradients_equal_the_dense_product():
    x, weight = features(), torch.randn(7, 20, dtype=torch.float32, requires_grad=True)
    grad = torch.randn(30, 7)
    values = csr(x).values().clone().requires_grad_()
    sparse_x = torch.sparse_csr_tensor(csr(x).crow_indices(), csr(x).col_indices(), values, x.shape)
    out = sparse_linear(sparse_x, weight)
    out.backward(grad)
    dense_x = x.clone().requires_grad_()
    dense_weight = weight.detach().clone().requires_grad_()
    expected = dense_x @ dense_weight.t()
    expected.backward(grad)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weight.grad, dense_weight.grad)
    torch.testing.assert_close(values.grad, dense_x.grad[x != 0])  # the stored entries' gradients, in CSR order


def test_the_weight_gradient_is_embedding_bags():
    """F.embedding_bag's own gradient (which sorts the indices at every call): the same sums in the same order,
    up to the rounding of fused multiply-adds."""
    x = csr(features(200, 300, 0.05, seed=1))
    weight = torch.randn(16, 300, requires_grad=True)
    grad = torch.randn(200, 16)
    sparse_linear(x, weight).backward(grad)
    ours = weight.grad.clone()
    weight.grad = None
    F.embedding_bag(x.col_indices(), weight.t().contiguous(), x.crow_indices(), mode="sum",
                    per_sample_weights=x.values(), include_last_offset=True).backward(grad)
    torch.testing.assert_close(ours, weight.grad, rtol=1e-6, atol=1e-6)


def test_dropout_reuses_one_transposed_pattern_and_new_indices_get_their_own():
    x = csr(features())
    drop = SparseDropout(0.5)
    sparse_features._kept.clear()
    first = transposed(x.crow_indices(), x.col_indices(), 20)
    dropped = drop(x)
    assert transposed(dropped.crow_indices(), dropped.col_indices(), 20) is first
    assert len(sparse_features._kept) == 1
    other = csr(features(seed=2))
    assert transposed(other.crow_indices(), other.col_indices(), 20) is not first
    for seed in range(3, 3 + sparse_features.KEPT):  # at most KEPT patterns are kept
        y = csr(features(seed=seed))
        transposed(y.crow_indices(), y.col_indices(), 20)
    assert len(sparse_features._kept) == sparse_features.KEPT


def test_the_transposed_pattern_is_x_transposed():
    x = features()
    pattern = transposed(csr(x).crow_indices(), csr(x).col_indices(), 20)
    t = csr(x.t().contiguous())
    assert torch.equal(pattern.crow, t.crow_indices()) and torch.equal(pattern.col, t.col_indices())
    assert torch.equal(csr(x).values()[pattern.order], t.values())


def test_empty_features_and_a_bad_call():
    x = csr(torch.zeros(4, 6))
    weight = torch.randn(3, 6, requires_grad=True)
    out = sparse_linear(x, weight)
    out.sum().backward()
    assert torch.equal(out, torch.zeros(4, 3)) and torch.equal(weight.grad, torch.zeros(3, 6))
    with pytest.raises(ValueError, match=r"weight \[out, in\].*\(3, 5\)"):
        sparse_linear(x, torch.randn(3, 5))
    with pytest.raises(ValueError, match="sparse CSR"):
        sparse_linear(torch.zeros(4, 6), weight)


def test_32_bit_indices_and_deterministic_algorithms():
    """A CSR with int32 indices, under torch.use_deterministic_algorithms (no bincount in the pattern)."""
    x, weight, grad = features(), torch.randn(4, 20, requires_grad=True), torch.randn(30, 4)
    full = csr(x)
    x32 = torch.sparse_csr_tensor(full.crow_indices().int(), full.col_indices().int(), full.values(), x.shape)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        out = sparse_linear(x32, weight)
        out.backward(grad)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    torch.testing.assert_close(out, x @ weight.detach().t())
    torch.testing.assert_close(weight.grad, grad.t() @ x)
