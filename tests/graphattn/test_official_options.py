"""The options that reproduce the official BAM GAT code, and the ``official`` preset."""
import pytest
import torch
import torch.nn.functional as F

from common import attention
from graphattn import GAT, GATConv
from graphattn.config import load_config


def _edges(n=6):
    return torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 0, 0, 0]])


def test_attention_bias_sits_inside_the_leaky_relu():
    torch.manual_seed(0)
    plain = GATConv(4, 3, heads=2)
    biased = GATConv(4, 3, heads=2, attention_bias=True)
    missing, _ = biased.load_state_dict(plain.state_dict(), strict=False)
    assert sorted(missing) == ["att_dst_bias", "att_src_bias"]
    x, edge_index = torch.randn(6, 4), _edges()
    # zero-initialised: the same layer as before
    assert torch.equal(plain(x, edge_index), biased(x, edge_index))
    with torch.no_grad():
        biased.att_src_bias.copy_(torch.tensor([0.7, -2.0]))
        biased.att_dst_bias.copy_(torch.tensor([-0.2, 0.5]))
    _, (ei, alpha) = biased(x, edge_index, return_attention_weights=True)
    h = (x @ plain.lin.weight.T).view(6, 2, 3)
    e = F.leaky_relu((h * plain.att_src).sum(-1)[ei[0]] + 0.7 * torch.tensor([1, 0]) - 2.0 * torch.tensor([0, 1])
                     + (h * plain.att_dst).sum(-1)[ei[1]] + torch.tensor([-0.2, 0.5]), 0.2)
    expected = torch.cat([torch.softmax(e[ei[1] == i], 0) for i in range(6)])
    got = torch.cat([alpha[ei[1] == i] for i in range(6)])
    assert torch.allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense-x", "sparse-x"])
def test_input_dropout_draws_one_mask_per_head(sparse):
    torch.manual_seed(0)
    conv = GATConv(50, 1, heads=4, input_dropout=0.5)
    with torch.no_grad():
        conv.lin.weight.fill_(1.0)  # every head's single channel is the sum of the (dropped) input
    x = torch.ones(300, 50)
    x_in = x.to_sparse_csr() if sparse else x
    conv.eval()
    assert torch.equal(conv._project(conv.lin, x_in), torch.full((300, 4, 1), 50.0))
    conv.train()
    out = conv._project(conv.lin, x_in)[..., 0]
    assert out.shape == (300, 4)
    assert not torch.equal(out[:, 0], out[:, 1])  # independent masks
    assert abs(out.mean().item() - 50.0) < 1.0  # inverted dropout keeps the expectation
    counts = out / 2.0  # kept inputs per node and head: Binomial(50, 0.5)
    assert abs(counts.var().item() - 12.5) < 2.5


def test_per_head_input_dropout_replaces_the_shared_one_in_the_model():
    model = GAT(10, 3, per_head_input_dropout=True, attention_bias=True)
    assert model.input_dropout.p == 0 and model.hidden_dropout.p == 0
    assert model.conv1.input_dropout.p == 0.6 and model.conv2.input_dropout.p == 0.6
    plain = GAT(10, 3)
    assert plain.input_dropout.p == 0.6 and plain.conv1.input_dropout.p == 0
    # evaluation (no dropout) is the same function once the biases are zero
    model.load_state_dict(plain.state_dict(), strict=False)
    x, edge_index = torch.randn(6, 10), _edges()
    assert torch.allclose(model.eval()(x, edge_index), plain.eval()(x, edge_index), atol=1e-6)


def test_kl_reductions():
    torch.manual_seed(0)
    model = GAT(10, 3, heads=8, out_heads=1, attention="bam-wc", attention_options={"k": 3.0})
    with attention.aux_losses() as aux:
        model(torch.randn(6, 10), _edges())
    first, second = [v for _, v in aux.terms]
    assert torch.allclose(model.kl(aux), first + second)
    assert torch.allclose(model.kl(aux, "head_mean"), (8 * first + second) / 9)
    with pytest.raises(ValueError, match="kl.reduction must be one of"):
        model.kl(aux, "mean")


def test_official_preset():
    cfg = load_config("Cora", "bam-wc", ["preset=official"])
    assert cfg.train.max_epochs == 400 and cfg.kl.weight == 0 and cfg.kl.reduction == "head_mean"
    assert dict(cfg.attention.options) == {"k": 1000.0, "beta": 1.0, "d_mid": 10, "prior_scope": "all",
                                           "prior_per_head": True}
    assert cfg.model.per_head_input_dropout and cfg.model.attention_bias
    pubmed = load_config("PubMed", "softmax", ["preset=official"])  # the TF code hard-codes these
    assert pubmed.model.out_heads == 1 and pubmed.optim.lr == 0.005 and pubmed.optim.weight_decay == 5e-4
    assert load_config("Cora", "bam-lc", ["preset=official", "kl.weight=0.5"]).kl.weight == 0.5
    ours = load_config("Cora", "bam-wc")
    assert ours.preset is None and ours.kl.reduction == "layer_sum" and "prior_scope" not in ours.attention.options
    with pytest.raises(ValueError, match="unknown preset 'tf'"):
        load_config("Cora", "bam-wc", ["preset=tf"])
    model = GAT(1433, 7, attention=cfg.attention.name, attention_options=dict(cfg.attention.options), **cfg.model)
    assert model.conv1.normalizer.prior_scope == "all" and model.conv1.normalizer.prior_net.heads == 8


def test_a_run_names_what_differs_from_its_preset():
    """``preset=official`` with a conflicting override is taken, and what differs is named (results.json's
    ``preset_deviations`` and a console line); the preset alone, and no preset, differ in nothing."""
    from graphattn.config import deviations

    assert deviations(load_config("Cora", "bam-wc", ["preset=official"])) == {}
    assert deviations(load_config("PubMed", "softmax", ["preset=official"])) == {}
    assert deviations(load_config("Cora", "bam-wc", ["optim.lr=0.01"])) == {}
    changed = load_config("Cora", "bam-wc", ["preset=official", "optim.lr=0.01", "attention.options.k=10"])
    assert deviations(changed) == {
        "optim.lr": {"preset": 0.005, "run": 0.01},
        "attention.options": {"preset": {"k": 1000.0, "beta": 1.0, "d_mid": 10, "prior_scope": "all",
                                         "prior_per_head": True},
                              "run": {"k": 10, "beta": 1.0, "d_mid": 10, "prior_scope": "all", "prior_per_head": True}}}
