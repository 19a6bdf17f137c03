"""Every normalizer: dense vs edge-wise agreement, masking, extreme inputs, gradients."""
import pytest
import torch

from common import attention

from .helpers import dense_to_edges, edges_to_dense

ALL = attention.available()


def _problem(seed=0, B=2, H=3, Q=4, K=6, d=5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, H, Q, K, generator=g, dtype=dtype)
    keys = torch.randn(B, H, K, d, generator=g, dtype=dtype)
    mask = torch.rand(B, 1, Q, K, generator=g) > 0.35
    mask[..., 0] = True  # every query keeps at least one key
    return scores, keys, mask


def _build(name, **kw):
    return attention.build(name, num_heads=3, key_dim=5, **kw).double()


@pytest.mark.parametrize("name", ALL)
def test_dense_and_edgewise_agree_deterministic(name):
    scores, keys, mask = _problem()
    norm = _build(name).eval()
    with attention.aux_losses() as dense_aux:
        dense = norm(scores, mask=mask, keys=keys)
    e_scores, index, n, key_index, node_keys, pos = dense_to_edges(scores, mask, keys)
    with attention.aux_losses() as edge_aux:
        edge = norm(e_scores, index=index, num_nodes=n, keys=node_keys, key_index=key_index)
    assert torch.allclose(edges_to_dense(edge, pos, scores.shape), dense, atol=1e-9)
    assert torch.allclose(edge_aux.total(), dense_aux.total(), atol=1e-9)


@pytest.mark.parametrize("name", ["bam-wc", "bam-lf"])
def test_dense_and_edgewise_agree_in_distribution_when_sampling(name):
    torch.manual_seed(0)
    scores, keys, mask = _problem(B=1, H=1, Q=2, K=5)
    norm = attention.build(name, key_dim=5, k=2.0, sigma=0.7).double().train()
    n_samples = 20_000
    dense = norm(scores.expand(n_samples, -1, -1, -1), mask=mask, keys=keys.expand(n_samples, -1, -1, -1))
    e_scores, index, n, key_index, node_keys, pos = dense_to_edges(scores, mask, keys)
    E = e_scores.shape[0]
    reps = torch.arange(n_samples).repeat_interleave(E)
    edge = norm(
        e_scores.repeat(n_samples, 1), index=index.repeat(n_samples) + reps * n, num_nodes=n * n_samples,
    ).view(n_samples, E, 1)
    dense_edges = torch.stack([dense[:, 0, q, k] for q, k in zip(pos[1].tolist(), pos[2].tolist())], 1)
    assert torch.allclose(edge.squeeze(-1).mean(0), dense_edges.mean(0), atol=0.01)
    assert torch.allclose(edge.squeeze(-1).std(0), dense_edges.std(0), atol=0.01)
    assert dense_edges.std(0).min() > 0.01  # the samples really are random


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("training", [False, True])
def test_masks_exact_zeros_extreme_logits_and_fully_masked_rows(name, training):
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 4, 6) * 1e4  # logits of +-1e4
    keys = torch.randn(2, 3, 6, 5) * 100
    mask = torch.rand(2, 1, 4, 6) > 0.4
    mask[..., 0] = True
    mask[1, :, 2] = False  # a fully masked row
    scores.requires_grad_(True)
    norm = attention.build(name, num_heads=3, key_dim=5).train(training)
    with attention.aux_losses() as aux:
        w = norm(scores, mask=mask, keys=keys)
    full = mask.expand_as(w)
    assert torch.isfinite(w).all()
    assert (w[~full] == 0).all()
    assert (w[1, :, 2] == 0).all()
    sums = w.sum(-1)
    sums[1, :, 2] = 1
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)
    loss = (w * torch.randn_like(w)).sum() + aux.total()
    assert torch.isfinite(aux.total())
    loss.backward()
    assert torch.isfinite(scores.grad).all()
    assert (scores.grad[~full] == 0).all()


@pytest.mark.parametrize("name", ALL)
def test_edgewise_extreme_logits_and_isolated_targets(name):
    torch.manual_seed(0)
    scores = (torch.randn(7, 3) * 1e4).requires_grad_(True)
    index = torch.tensor([0, 0, 0, 2, 2, 4, 4])  # nodes 1 and 3 receive nothing
    node_keys = torch.randn(5, 3, 5)
    key_index = torch.tensor([1, 2, 3, 0, 4, 1, 3])
    norm = attention.build(name, num_heads=3, key_dim=5).train()
    with attention.aux_losses() as aux:
        w = norm(scores, index=index, num_nodes=5, keys=node_keys, key_index=key_index)
    assert torch.isfinite(w).all() and torch.isfinite(aux.total())
    sums = torch.zeros(5, 3).index_add_(0, index, w)
    assert torch.allclose(sums[[0, 2, 4]], torch.ones(3, 3), atol=1e-5)
    (w.sum() + aux.total()).backward()
    assert torch.isfinite(scores.grad).all()


@pytest.mark.parametrize("name", ["softmax", "entmax", "entmax15", "sparsemax"])
def test_gradcheck_edgewise_float64(name):
    e_scores, index, n, *_ = dense_to_edges(*_problem(seed=3)[::2])
    norm = _build(name).eval()
    e_scores = e_scores.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: norm(s, index=index, num_nodes=n), (e_scores,), atol=1e-6)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("spread", [1.0, 1e3], ids=["global-shift", "per-group-max"])
def test_edgewise_csr_pointer_gives_the_same_weights_kl_and_gradients(name, spread):
    scores, keys, mask = _problem(seed=5)
    e_scores, index, n, key_index, node_keys, _ = dense_to_edges(scores * spread, mask, keys)
    n += 1  # a last target node without edges
    ptr = torch.cat([index.new_zeros(1), torch.bincount(index, minlength=n).cumsum(0)])
    norm = _build(name).train()
    results = []
    for extra in ({}, {"ptr": ptr}):
        torch.manual_seed(0)  # the same BAM noise both times
        s = e_scores.clone().requires_grad_(True)
        with attention.aux_losses() as aux:
            weights = norm(s, index=index, num_nodes=n, keys=node_keys, key_index=key_index, **extra)
        kl = aux.total() if aux.by_name() else s.new_zeros(())
        (weights.square().sum() + kl).backward()
        results.append((weights, kl, s.grad))
    for with_scatter, with_ptr in zip(*results):
        torch.testing.assert_close(with_ptr, with_scatter)
    with pytest.raises(ValueError, match="CSR pointer"):
        attention.EdgeGroups(index, ptr=ptr.view(1, -1))


def test_edge_log_softmax_gradcheck():
    e_scores, index, n, *_ = dense_to_edges(*_problem(seed=4)[::2])
    groups = attention.EdgeGroups(index, n)
    e_scores = e_scores.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(groups.log_softmax, (e_scores,))


def test_unknown_variant_and_bad_inputs_give_clear_errors():
    with pytest.raises(ValueError, match="unknown attention variant 'bam-xx'.*bam-wc"):
        attention.build("bam-xx")
    with pytest.raises(ValueError, match=r"^attention variant 'softmax' has no option k; its options are none"):
        attention.build("softmax", k=3)
    with pytest.raises(ValueError, match=r"'entmax' has no option d_mid, k; its options are alpha, learn_alpha, n_i"):
        attention.build("entmax", num_heads=2, k=3, d_mid=4)
    with pytest.raises(ValueError, match="key_dim"):
        attention.build("bam-wc")
    norm = attention.build("softmax")
    with pytest.raises(TypeError, match="boolean"):
        norm(torch.randn(2, 3), mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="index has 4 entries"):
        norm(torch.randn(3, 2), index=torch.tensor([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="keys="), attention.aux_losses():
        attention.build("bam-wc", key_dim=4)(torch.randn(2, 3, 4))
