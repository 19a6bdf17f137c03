"""graphattn.GATConv behaves as torch_geometric.nn.GATConv wherever a PyG user could tell them apart:
the repr, every adjacency layout (the number of targets included), bipartite calls without target
features, attention weights, edge features and empty graphs. Each case runs PyG's layer beside ours
with the same parameters."""
import pytest
import torch
import torch_geometric.nn as pyg_nn
import torch_geometric.typing
from torch_geometric import EdgeIndex
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csc_tensor, to_torch_csr_tensor

from graphattn import GATConv

EDGES = torch.tensor([[0, 1, 2, 3, 3], [0, 0, 1, 1, 0]])
NEEDS_TORCH_SPARSE = pytest.mark.skipif(not torch_geometric.typing.WITH_TORCH_SPARSE,
                                        reason="torch-sparse is not installed (the 'sampler' extra)")


def twins(in_channels, seed=0, **kwargs):
    torch.manual_seed(seed)
    theirs = pyg_nn.GATConv(in_channels, 32, heads=2, **kwargs)
    ours = GATConv(in_channels, 32, heads=2, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def adjacency(layout: str, num_src: int, num_dst: int):
    """``EDGES`` (source row, target row) in ``layout``, as PyG's layers take it (rows are targets)."""
    size = (num_src, num_dst)
    if layout == "edge_index":
        return EDGES
    if layout == "csr":
        return to_torch_csc_tensor(EDGES, size=size).t()
    if layout == "csc":
        return to_torch_csr_tensor(EDGES, size=size).t()
    if layout == "coo":
        return to_torch_coo_tensor(EDGES, size=size).t().coalesce()
    if layout == "EdgeIndex":
        return EdgeIndex(EDGES, sparse_size=size)
    if layout == "SparseTensor":
        return SparseTensor.from_edge_index(EDGES, sparse_sizes=size).t()
    raise AssertionError(layout)


LAYOUTS = ["edge_index", "csr", "csc", "coo", "EdgeIndex",
           pytest.param("SparseTensor", marks=NEEDS_TORCH_SPARSE)]


def test_default_repr_is_pygs_and_options_appear_only_when_set():
    assert str(GATConv(8, 32, heads=2)) == str(pyg_nn.GATConv(8, 32, heads=2)) == "GATConv(8, 32, heads=2)"
    assert str(GATConv((8, 16), 32, heads=2)) == "GATConv((8, 16), 32, heads=2)"
    assert str(GATConv(8, 32, heads=2, residual=True, dropout=0.6)) == "GATConv(8, 32, heads=2)"  # as PyG
    assert str(GATConv(8, 32, attention="bam-wc", k=3.0)) == "GATConv(8, 32, heads=1, attention='bam-wc', k=3.0)"
    assert str(GATConv(8, 4, value_dropout=0.6, attention_bias=True)) == \
        "GATConv(8, 4, heads=1, value_dropout=0.6, attention_bias=True)"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gives_pygs_output_on_a_square_graph(layout):
    theirs, ours = twins(8)
    x = torch.randn(4, 8)
    expected = theirs(x, EDGES)
    out = ours(x, adjacency(layout, 4, 4))
    assert out.shape == (4, 64)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours(x, EDGES, size=(4, 4)), expected)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("with_targets", [True, False], ids=["x_dst", "no_x_dst"])
def test_bipartite_targets_are_counted_from_the_adjacency(layout, with_targets):
    """Four sources, two targets: without ``x_dst`` and ``size`` a sparse adjacency alone says there are two."""
    theirs, ours = twins((8, 16))
    x = (torch.randn(4, 8), torch.randn(2, 16) if with_targets else None)
    expected = theirs(x, EDGES, size=(4, 2))
    adj = adjacency(layout, 4, 2)
    if layout == "edge_index" and not with_targets:  # a bare [2, E] has no shape: PyG needs size here too
        out = ours(x, adj, size=(4, 2))
    else:
        out = ours(x, adj)
    assert out.shape == (2, 64)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_target_features_that_disagree_with_the_adjacency_are_a_clear_error():
    conv = GATConv((8, 16), 32, heads=2)
    with pytest.raises(ValueError, match="x_dst has 3 rows but the graph has 2 target nodes"):
        conv((torch.randn(4, 8), torch.randn(3, 16)), adjacency("csr", 4, 2))


@pytest.mark.parametrize("layout", ["edge_index", "csr", pytest.param("SparseTensor", marks=NEEDS_TORCH_SPARSE)])
def test_attention_weights_come_back_in_the_input_layout(layout):
    theirs, ours = twins(8)
    x = torch.randn(4, 8)
    out, weights = ours(x, adjacency(layout, 4, 4), return_attention_weights=True)
    ref_out, ref_weights = theirs(x, adjacency(layout, 4, 4), return_attention_weights=True)
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=1e-5)
    if layout == "edge_index":
        assert torch.equal(weights[0], ref_weights[0]) and weights[0].shape == (2, 8)  # 5 edges + 4 loops - 1
        torch.testing.assert_close(weights[1], ref_weights[1])
    elif layout == "csr":
        assert weights[0].shape == (4, 4, 2) and weights[0]._nnz() == 8
        torch.testing.assert_close(weights[0].to_dense(), ref_weights[0].to_dense())
    else:
        assert weights.sizes() == [4, 4, 2] and weights.nnz() == 8
        torch.testing.assert_close(weights.to_dense(), ref_weights.to_dense())


@pytest.mark.parametrize("edge_dim,fill_value", [(1, 0.5), (1, "mean"), (4, 0.5), (4, "mean")])
def test_edge_features_with_self_loop_fill_values_match_pyg(edge_dim, fill_value):
    theirs, ours = twins(8, edge_dim=edge_dim, fill_value=fill_value)
    x, edges = torch.randn(4, 8), torch.tensor([[0, 1, 2, 3], [1, 0, 1, 1]])
    edge_attr = torch.randn(4) if edge_dim == 1 else torch.randn(4, edge_dim)
    torch.testing.assert_close(ours(x, edges, edge_attr), theirs(x, edges, edge_attr))
    if torch_geometric.typing.WITH_TORCH_SPARSE:  # self-loops with edge features need a [2, E] input, as in PyG
        with pytest.raises(NotImplementedError):
            ours(x, SparseTensor.from_edge_index(edges, edge_attr, (4, 4)).t())


def test_empty_graph_gives_empty_output():
    out = GATConv(8, 32, heads=2)(torch.randn(0, 8), torch.empty(2, 0, dtype=torch.long))
    assert out.shape == (0, 64)
