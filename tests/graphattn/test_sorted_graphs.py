"""Graphs that arrive sorted by target (an ``EdgeIndex`` with ``sort_order='col'``, a sorted
``[2, E]`` tensor) are prepared without sorting, with PyG's results."""
import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric import EdgeIndex
from torch_geometric.utils import add_self_loops, sort_edge_index

from graphattn import GATConv
from graphattn.conv import merge_appended_loops

from .test_conv import random_graph


@pytest.mark.parametrize("num_dst,num_loops", [(12, 12), (15, 9)])
def test_merging_appended_loops_is_a_stable_sort_by_target(num_dst, num_loops):
    g = torch.Generator().manual_seed(0)
    col = torch.randint(0, num_dst, (50,), generator=g).sort().values
    col[col == 3] = 4  # node 3 has no incoming edge
    appended = torch.cat([col, torch.arange(num_loops)])
    expected = torch.sort(appended, stable=True).indices
    assert torch.equal(merge_appended_loops(col, num_loops, num_dst), expected)


def twins(**kwargs):
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(6, 4, heads=2, **kwargs)
    ours = GATConv(6, 4, heads=2, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


@pytest.mark.parametrize("as_edge_index", [False, True], ids=["tensor", "EdgeIndex"])
@pytest.mark.parametrize("self_loops", [True, False])
def test_target_sorted_input_is_not_sorted_again_and_matches_pyg(as_edge_index, self_loops, monkeypatch):
    edge_index = sort_edge_index(random_graph(), sort_by_row=False)
    if not self_loops:  # a graph that already holds every self-loop, as PyG's layer gets it
        edge_index = sort_edge_index(add_self_loops(edge_index, num_nodes=12)[0], sort_by_row=False)
    if as_edge_index:
        edge_index = EdgeIndex(edge_index, sparse_size=(12, 12), sort_order="col")
    theirs, ours = twins(add_self_loops=self_loops)
    x = torch.randn(12, 6)
    out_t, (ei_t, att_t) = theirs(x, edge_index.as_tensor() if as_edge_index else edge_index,
                                  return_attention_weights=True)

    def no_sort(*args, **kwargs):
        raise AssertionError("a target-sorted graph was sorted again")
    monkeypatch.setattr(EdgeIndex, "sort_by", no_sort)
    monkeypatch.setattr(torch.Tensor, "argsort", no_sort)
    out_o, (ei_o, att_o) = ours(x, edge_index, return_attention_weights=True)
    assert torch.equal(ei_o.as_tensor() if as_edge_index else ei_o, ei_t)
    torch.testing.assert_close(att_o, att_t)
    torch.testing.assert_close(out_o, out_t)
