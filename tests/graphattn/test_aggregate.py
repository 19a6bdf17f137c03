"""graphattn.aggregate: the fused weighted neighbourhood sum against the edge-by-edge one."""
import pytest
import torch
from torch_geometric import EdgeIndex

from graphattn.aggregate import TargetCSR, attention_aggregate


def sorted_graph(num_src, num_dst, num_edges, seed=0):
    """Random edges (duplicates allowed) sorted by target; the last target has no edge."""
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.stack([torch.randint(0, num_src, (num_edges,), generator=g),
                              torch.randint(0, num_dst - 1, (num_edges,), generator=g)])
    sorted_index, _ = EdgeIndex(edge_index, sparse_size=(num_src, num_dst)).sort_by("col")
    return sorted_index.as_tensor(), TargetCSR.from_edge_index(sorted_index)


def edge_by_edge(alpha, x, edge_index, num_dst):
    """PyG's way: gather x_j, weight it, scatter-add to the targets."""
    messages = alpha.unsqueeze(-1) * x.index_select(0, edge_index[0])
    return x.new_zeros(num_dst, *x.shape[1:]).index_add_(0, edge_index[1], messages)


@pytest.mark.parametrize("num_src,num_dst,heads", [(7, 7, 3), (5, 9, 2), (9, 4, 1)])
def test_equals_edge_by_edge_with_gradients(num_src, num_dst, heads):
    edge_index, csr = sorted_graph(num_src, num_dst, 30)
    alpha = torch.rand(30, heads, dtype=torch.float64, requires_grad=True)
    x = torch.randn(num_src, heads, 4, dtype=torch.float64, requires_grad=True)
    out = attention_aggregate(alpha, x, csr)
    expected = edge_by_edge(alpha, x, edge_index, num_dst)
    torch.testing.assert_close(out, expected)
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))  # the target without edges
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (alpha, x), grad)
    want = torch.autograd.grad(expected, (alpha, x), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert torch.autograd.gradcheck(lambda a, v: attention_aggregate(a, v, csr), (alpha, x))


def test_half_precision_aggregates_edge_by_edge():
    edge_index, csr = sorted_graph(6, 6, 20)
    alpha = torch.rand(20, 2, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(6, 2, 3, dtype=torch.bfloat16, requires_grad=True)
    out = attention_aggregate(alpha, x, csr)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, edge_by_edge(alpha, x, edge_index, 6))
    out.float().sum().backward()
    assert alpha.grad is not None and x.grad is not None


def test_no_edges_gives_zeros_and_patterns_are_built_once():
    _, csr = sorted_graph(4, 3, 0)
    out = attention_aggregate(torch.zeros(0, 2), torch.randn(4, 2, 5), csr)
    assert out.shape == (3, 2, 5) and not out.any()
    _, csr = sorted_graph(6, 6, 20)
    assert csr.pattern(2) is csr.pattern(2)
    assert csr.pattern(2, transpose=True) is not csr.pattern(2)
    assert csr.pattern(2).col.dtype == torch.int32  # small graphs use 32-bit indices


@pytest.mark.parametrize("transpose", [False, True])
def test_the_c_pattern_builder_writes_the_pytorch_pattern(transpose, monkeypatch):
    """Where the C builder is there (a C compiler), its pattern equals the PyTorch one, the inverse too."""
    from graphattn import aggregate
    if aggregate._native() is None:
        pytest.skip("no C compiler here")
    _, csr = sorted_graph(40, 30, 500)
    built = TargetCSR(csr.src, csr.ptr, csr.num_src).pattern(3, transpose)
    monkeypatch.setattr(aggregate, "_native", lambda: None)
    reference = TargetCSR(csr.src, csr.ptr, csr.num_src).pattern(3, transpose)
    for name in ("crow", "col", "value_index", "entry_index"):
        a, b = getattr(built, name), getattr(reference, name)
        assert (a is None) == (b is None) == (name == "entry_index" and transpose)
        assert a is None or torch.equal(a, b), name


def test_sort_order_is_the_stable_sort_and_its_pointer(monkeypatch):
    """The counting pass of C (where it builds) and the stable sort give the same order and CSR pointer,
    bins without keys included."""
    from graphattn import aggregate
    keys = torch.randint(0, 50, (1000,), generator=torch.Generator().manual_seed(3))
    keys[keys == 7] = 8  # an empty bin
    order, ptr = aggregate.sort_order(keys, 60)
    assert torch.equal(order, torch.argsort(keys, stable=True))
    assert torch.equal(ptr, torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(keys, minlength=60).cumsum(0)]))
    monkeypatch.setattr(aggregate, "_native", lambda: None)
    for got, want in zip(aggregate.sort_order(keys, 60), (order, ptr)):
        assert torch.equal(got, want)
