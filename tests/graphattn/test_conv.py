"""graphattn.GATConv against torch_geometric.nn.GATConv, and its attention variants."""
import pickle
import warnings

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks
from torch_geometric.utils import coalesce, scatter, to_torch_csr_tensor

from common import attention
from graphattn import GAT, GATConv, SparseDropout


def random_graph(num_nodes=12, num_edges=40, seed=0):
    """A coalesced random graph (no duplicate edges) with node 11 isolated."""
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes - 1, (2, num_edges), generator=g)
    return coalesce(edge_index, num_nodes=num_nodes)


def twins(seed=0, **kwargs):
    """PyG's layer and ours with identical parameters."""
    torch.manual_seed(seed)
    theirs = pyg_nn.GATConv(**kwargs)
    ours = GATConv(**kwargs)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


LAYER_CASES = [
    dict(in_channels=6, out_channels=4, heads=3),
    dict(in_channels=6, out_channels=5, heads=2, concat=False, negative_slope=0.1),
    dict(in_channels=6, out_channels=4, heads=2, edge_dim=3, residual=True),
    dict(in_channels=6, out_channels=4, heads=2, add_self_loops=False, bias=False),
    dict(in_channels=(6, 5), out_channels=4, heads=2, add_self_loops=False),
]


@pytest.mark.parametrize("kwargs", LAYER_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_matches_pyg_outputs_weights_and_gradients(kwargs):
    theirs, ours = twins(**kwargs)
    edge_index = random_graph()
    bipartite = isinstance(kwargs["in_channels"], tuple)
    x = (torch.randn(12, 6), torch.randn(12, 5)) if bipartite else torch.randn(12, 6)
    extra = {"edge_attr": torch.randn(edge_index.shape[1], 3)} if kwargs.get("edge_dim") else {}
    out_t, (ei_t, att_t) = theirs(x, edge_index, return_attention_weights=True, **extra)
    out_o, (ei_o, att_o) = ours(x, edge_index, return_attention_weights=True, **extra)
    assert torch.equal(ei_t, ei_o)
    torch.testing.assert_close(att_o, att_t)
    torch.testing.assert_close(out_o, out_t)
    out_t.square().sum().backward()
    out_o.square().sum().backward()
    for (name, p_t), p_o in zip(theirs.named_parameters(), ours.parameters()):
        torch.testing.assert_close(p_o.grad, p_t.grad, msg=name)


def test_sparse_adjacency_equals_edge_index_and_pyg():
    theirs, ours = twins(in_channels=6, out_channels=4, heads=2)
    edge_index = random_graph()
    x = torch.randn(12, 6)
    adj_t = to_torch_csr_tensor(edge_index.flip(0), size=(12, 12))  # rows are targets
    out_sparse, (adj_out, att_sparse) = ours(x, adj_t, return_attention_weights=True)
    torch.testing.assert_close(out_sparse, ours(x, edge_index))
    out_pyg, (_, att_pyg) = theirs(x, adj_t, return_attention_weights=True)
    torch.testing.assert_close(out_sparse, out_pyg)
    torch.testing.assert_close(att_sparse, att_pyg)
    assert adj_out.layout in (torch.sparse_csr, torch.sparse_coo)


def test_explain_mode_masks_the_same_edges_as_pyg():
    theirs, ours = twins(in_channels=6, out_channels=4, heads=2)
    edge_index, x = random_graph(), torch.randn(12, 6)
    mask = torch.rand(edge_index.shape[1])
    for conv in (theirs, ours):
        set_masks(conv, mask, edge_index, apply_sigmoid=False)
    torch.testing.assert_close(ours(x, edge_index), theirs(x, edge_index))
    for conv in (theirs, ours):
        clear_masks(conv)
    torch.testing.assert_close(ours(x, edge_index), theirs(x, edge_index))


def test_prepared_graph_is_reused_until_the_edge_index_changes():
    torch.manual_seed(0)
    conv, fresh = GATConv(6, 4, heads=2), GATConv(6, 4, heads=2)
    fresh.load_state_dict(conv.state_dict())
    edge_index, x = random_graph(), torch.randn(12, 6)
    conv(x, edge_index)
    prepared = conv._graph_cache[2]
    conv(x, edge_index)
    assert conv._graph_cache[2] is prepared  # same graph object, unchanged: reused
    conv(x, edge_index.clone())
    assert conv._graph_cache[2] is not prepared  # another object: prepared anew
    edge_index = random_graph()
    conv(x, edge_index)
    edge_index[0] = edge_index[0].flip(0)  # changed in place: the version counter moves on
    torch.testing.assert_close(conv(x, edge_index), fresh(x, edge_index))
    torch.testing.assert_close(conv(x[:11], edge_index), fresh(x[:11], edge_index))  # other node count
    restored = pickle.loads(pickle.dumps(conv))  # the weak reference is not pickled
    torch.testing.assert_close(restored(x, edge_index), fresh(x, edge_index))


@pytest.mark.parametrize("name", ["softmax", "bam-wc", "bam-lf", "entmax15"])
def test_isolated_node_attends_to_itself_only(name):
    conv = GATConv(6, 4, heads=2, attention=name)
    conv.train()
    edge_index = random_graph()
    x = torch.randn(12, 6)
    with attention.aux_losses() as aux:
        out, (ei, att) = conv(x, edge_index, return_attention_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(aux.total())
    self_loop = (ei[0] == 11) & (ei[1] == 11)
    assert ((ei[1] == 11) == self_loop).all(), "node 11 must only receive its self-loop"
    torch.testing.assert_close(att[self_loop], torch.ones(1, 2))
    expected = conv.lin(x[11]).view(2, 4).reshape(-1) + conv.bias
    torch.testing.assert_close(out[11], expected)


def test_isolated_node_without_self_loops_gets_bias_only():
    conv = GATConv(6, 4, heads=2, add_self_loops=False, attention="bam-wc")
    conv.train()
    with attention.aux_losses():
        out = conv(torch.randn(12, 6), random_graph())
    torch.testing.assert_close(out[11], conv.bias)


@pytest.mark.parametrize("name", ["softmax", "bam-wf", "bam-wc", "bam-lf", "bam-lc", "sparsemax"])
def test_attention_weights_sum_to_one_per_target_and_head(name):
    conv = GATConv(6, 4, heads=3, attention=name)
    conv.train()  # BAM samples; dropout is 0
    _, (ei, att) = conv(torch.randn(12, 6), random_graph(), return_attention_weights=True)
    assert att.shape == (ei.shape[1], 3) and (att >= 0).all()
    torch.testing.assert_close(scatter(att, ei[1], 0, dim_size=12, reduce="sum"), torch.ones(12, 3))


def test_bam_samples_in_training_and_is_softmax_in_eval():
    torch.manual_seed(0)
    softmax = GATConv(6, 4, heads=2)
    bam = GATConv(6, 4, heads=2, attention="bam-wc", k=5.0, beta=2.0)
    assert bam.normalizer.k == 5.0 and bam.normalizer.beta == 2.0
    missing = bam.load_state_dict(softmax.state_dict(), strict=False).missing_keys
    assert missing and all(key.startswith("normalizer.prior_net") for key in missing)
    x, edge_index = torch.randn(12, 6), random_graph()
    bam.eval()
    torch.testing.assert_close(bam(x, edge_index), softmax(x, edge_index))
    bam.train()
    assert not torch.allclose(bam(x, edge_index), bam(x, edge_index))


def test_bam_kl_is_collected_with_gradients_for_the_prior_network():
    conv = GATConv(6, 4, heads=2, attention="bam-wc")
    conv.train()
    with attention.aux_losses() as aux:
        conv(torch.randn(12, 6), random_graph())
    assert list(aux.by_name()) == ["bam_kl"]
    aux.total().backward()
    assert conv.normalizer.prior_net.hidden.weight.grad.abs().sum() > 0
    assert conv.att_src.grad.abs().sum() > 0


def test_mc_sampling_makes_eval_stochastic_and_restores():
    model = GAT(6, 3, attention="bam-wf")
    model.eval()
    x, edge_index = torch.randn(12, 6), random_graph()
    with attention.mc_sampling(model, dropout=True):
        assert not torch.allclose(model(x, edge_index), model(x, edge_index))
    torch.testing.assert_close(model(x, edge_index), model(x, edge_index))


def test_unknown_attention_option_is_a_clear_error():
    with pytest.raises(ValueError, match="attention variant .softmax. has no option k"):
        GATConv(6, 4, attention="softmax", k=10)
    with pytest.raises(ValueError, match="unknown attention variant"):
        GATConv(6, 4, attention="bam-xx")


def sparse(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return x.to_sparse_csr()


def test_edge_index_outside_the_nodes_is_a_clear_error():
    conv = GATConv(6, 4, heads=2)
    with pytest.raises(ValueError, match=r"5 source and 5 target nodes.*got 7"):
        conv(torch.randn(5, 6), torch.tensor([[0, 1, 2], [1, 2, 7]]))
    with pytest.raises(ValueError, match="negative"):
        conv(torch.randn(5, 6), torch.tensor([[0, -1], [1, 2]]))


def test_sparse_csr_features_match_dense_features():
    torch.manual_seed(0)
    x = torch.rand(12, 6) * (torch.rand(12, 6) < 0.3)
    x[3] = 0  # a node without features
    conv = GATConv(6, 4, heads=2, residual=True)
    edge_index = random_graph()
    dense_out = conv(x, edge_index)
    dense_out.sum().backward()
    dense_grad = conv.lin.weight.grad.clone()
    conv.zero_grad()
    sparse_out = conv(sparse(x), edge_index)
    sparse_out.sum().backward()
    torch.testing.assert_close(sparse_out, dense_out)
    torch.testing.assert_close(conv.lin.weight.grad, dense_grad)


def test_sparse_dropout_drops_stored_values_only_with_inverted_scaling():
    torch.manual_seed(0)
    x = torch.rand(200, 50) * (torch.rand(200, 50) < 0.2)
    drop = SparseDropout(0.6)
    dropped = drop(sparse(x)).to_dense()
    assert ((dropped != 0) <= (x != 0)).all()
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], x[kept] / 0.4)
    assert 0.3 < kept.sum() / (x != 0).sum() < 0.5
    drop.eval()
    assert torch.equal(drop(sparse(x)).to_dense(), x)


@pytest.mark.parametrize("name", ["softmax", "bam-wc"])
def test_value_dropout_is_inactive_in_eval_and_drops_values_only_in_training(name):
    """``value_dropout`` (original GAT code: dropout of ``seq_fts``) leaves eval mode, the layer's
    parameters and the attention coefficients alone, and changes training-mode outputs."""
    torch.manual_seed(0)
    plain = GATConv(6, 4, heads=2, attention=name)
    dropped = GATConv(6, 4, heads=2, attention=name, value_dropout=0.6)
    dropped.load_state_dict(plain.state_dict())
    assert "value_dropout=0.6" in repr(dropped)
    x, edge_index = torch.randn(12, 6), random_graph()
    plain.eval(), dropped.eval()
    torch.testing.assert_close(dropped(x, edge_index), plain(x, edge_index))
    if name == "softmax":  # ... and then it is still PyG's layer
        theirs = pyg_nn.GATConv(6, 4, heads=2)
        theirs.load_state_dict(plain.state_dict())
        theirs.eval()
        torch.testing.assert_close(dropped(x, edge_index), theirs(x, edge_index))

    plain.train(), dropped.train()
    torch.manual_seed(1)
    out_plain, (_, att_plain) = plain(x, edge_index, return_attention_weights=True)
    torch.manual_seed(1)  # same BAM noise: the first draw of both layers is the attention's
    out_dropped, (_, att_dropped) = dropped(x, edge_index, return_attention_weights=True)
    torch.testing.assert_close(att_dropped, att_plain)
    assert not torch.allclose(out_dropped, out_plain)
    # Per node and head: a node whose values are all dropped contributes nothing, the kept
    # ones are scaled by 1 / (1 - p), so the training output averages to the eval output.
    with torch.no_grad():
        mean = torch.stack([dropped(x, edge_index) for _ in range(3000)]).mean(0)
    if name == "softmax":
        torch.testing.assert_close(mean, plain(x, edge_index), atol=0.1, rtol=0.1)
    with pytest.raises(ValueError, match="value_dropout"):
        GATConv(6, 4, value_dropout=1.5)


def test_gat_model_passes_value_dropout_to_both_layers():
    model = GAT(6, 3, value_dropout=0.6)
    assert model.conv1.value_dropout == model.conv2.value_dropout == 0.6
    assert GAT(6, 3).conv1.value_dropout == 0.0


def test_an_option_the_normalizer_does_not_take_is_a_one_line_cli_error(tmp_path, capsys, attn_data_root):
    from graphattn import train

    code = train.main(["--dataset", "Cora", "--seeds", "1", "--out", str(tmp_path / "run"), "--no-progress",
                       "attention.options.k=3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1] == ("error: attention variant 'softmax' has no option k; its options are none "
                                     "(attention options of the config)")
