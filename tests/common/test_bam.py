"""BAM: closed-form KLs, the softmax limit, masking, extreme inputs and gradients."""
import math

import pytest
import torch
from torch.distributions import Gamma, LogNormal, Weibull, kl_divergence

from common import attention
from common.attention.functional import kl_lognormal, kl_weibull_gamma

BAM_VARIANTS = ["bam-wf", "bam-wc", "bam-lf", "bam-lc"]


@pytest.mark.parametrize("k,lam,alpha,beta", [(1.5, 0.7, 2.0, 1.3), (10.0, 0.05, 0.3, 1.0), (3.0, 2.0, 1.0, 0.5)])
def test_kl_weibull_gamma_matches_monte_carlo(k, lam, alpha, beta):
    torch.manual_seed(0)
    q = Weibull(scale=torch.tensor(lam, dtype=torch.float64), concentration=torch.tensor(k, dtype=torch.float64))
    p = Gamma(torch.tensor(alpha, dtype=torch.float64), torch.tensor(beta, dtype=torch.float64))
    s = q.sample((400_000,))
    log_ratio = q.log_prob(s) - p.log_prob(s)
    mc, stderr = log_ratio.mean(), log_ratio.std() / math.sqrt(s.numel())
    closed = kl_weibull_gamma(k, torch.tensor(lam, dtype=torch.float64), alpha, beta)
    assert abs(closed - mc) < 4 * stderr + 1e-3


@pytest.mark.parametrize("mu_q,s_q,mu_p,s_p", [(0.3, 0.5, -0.2, 1.0), (-2.0, 0.1, -1.5, 0.3), (1.0, 1.0, 1.0, 2.0)])
def test_kl_lognormal_matches_monte_carlo(mu_q, s_q, mu_p, s_p):
    torch.manual_seed(0)
    f64 = dict(dtype=torch.float64)
    q = LogNormal(torch.tensor(mu_q, **f64), torch.tensor(s_q, **f64))
    p = LogNormal(torch.tensor(mu_p, **f64), torch.tensor(s_p, **f64))
    s = q.sample((400_000,))
    log_ratio = q.log_prob(s) - p.log_prob(s)
    mc, stderr = log_ratio.mean(), log_ratio.std() / math.sqrt(s.numel())
    closed = kl_lognormal(torch.tensor(mu_q, **f64), s_q, mu_p, s_p)
    assert abs(closed - mc) < 4 * stderr + 1e-3
    assert torch.allclose(closed, kl_divergence(q, p), rtol=1e-6)


def test_weibull_log_space_sample_matches_linear_space_distribution():
    """softmax(logits + log(-log(1-u))/k) has the law of S/sum(S), S ~ Weibull(k, p/Gamma(1+1/k))."""
    torch.manual_seed(0)
    k, n = 3.0, 100_000
    logits = torch.tensor([1.0, 0.2, -0.5, -1.0])
    norm = attention.build("bam-wf", k=k).train()
    w_log = norm(logits.expand(n, 1, 4)).squeeze(1)
    lam = torch.softmax(logits, -1) / math.gamma(1 + 1 / k)
    s = Weibull(lam, torch.tensor(k)).sample((n,))
    w_lin = s / s.sum(-1, keepdim=True)
    assert torch.allclose(w_log.mean(0), w_lin.mean(0), atol=3e-3)
    assert torch.allclose(w_log.std(0), w_lin.std(0), atol=3e-3)


@pytest.mark.parametrize("name,option,values", [("bam-wf", "k", [2.0, 20.0, 2000.0]), ("bam-lf", "sigma", [1.0, 0.1, 1e-3])])
def test_samples_tend_to_softmax(name, option, values):
    torch.manual_seed(0)
    scores = torch.randn(64, 4, 8, 12)
    target = torch.softmax(scores, -1)
    gaps = []
    for value in values:
        norm = attention.build(name, **{option: value}).train()
        gaps.append((norm(scores) - target).abs().mean().item())
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[-1] < 1e-3


@pytest.mark.parametrize("name", BAM_VARIANTS)
def test_eval_is_posterior_mean_and_mc_sampling_samples(name):
    torch.manual_seed(0)
    norm = attention.build(name, key_dim=8).eval()
    scores, keys = torch.randn(2, 3, 5, 7), torch.randn(2, 3, 7, 8)
    assert torch.equal(norm(scores, keys=keys), torch.softmax(scores, -1))
    with attention.mc_sampling(norm):
        a, b = norm(scores, keys=keys), norm(scores, keys=keys)
        assert not torch.allclose(a, b)
        assert torch.allclose(a.sum(-1), torch.ones(2, 3, 5))
    assert not norm.mc_sampling and torch.equal(norm(scores, keys=keys), torch.softmax(scores, -1))


@pytest.mark.parametrize("name", BAM_VARIANTS)
def test_kl_is_averaged_over_real_entries_only(name):
    """Masking the last two keys gives the same KL as removing them."""
    torch.manual_seed(0)
    norm = attention.build(name, key_dim=8).eval()
    scores, keys = torch.randn(2, 3, 5, 9), torch.randn(2, 3, 9, 8)
    mask = torch.ones(1, 1, 1, 9, dtype=torch.bool)
    mask[..., -2:] = False
    with attention.aux_losses() as masked:
        norm(scores, mask=mask, keys=keys)
    with attention.aux_losses() as trimmed:
        norm(scores[..., :-2], keys=keys[..., :-2, :])
    assert torch.allclose(masked.total(), trimmed.total(), rtol=1e-5)


@pytest.mark.parametrize("name", BAM_VARIANTS)
def test_layer_kl_is_the_mean_of_the_closed_forms(name):
    """The normalizer's KL equals the public closed forms averaged over real entries."""
    torch.manual_seed(0)
    norm = attention.build(name, key_dim=8, k=4.0, sigma=0.3, prior_sigma=0.8, beta=1.7,
                           prior_alpha=0.6, prior_mu=-0.4).double().eval()
    scores, keys = torch.randn(2, 3, 5, 7, dtype=torch.float64), torch.randn(2, 3, 7, 8, dtype=torch.float64)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True
    with attention.aux_losses() as aux:
        norm(scores, mask=mask, keys=keys)
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).clamp_min(1e-300)
    if norm.prior_net is not None:
        pi = torch.softmax(norm.prior_net(keys).unsqueeze(-2).expand_as(scores).masked_fill(~mask, float("-inf")), -1)
    if name.startswith("bam-w"):
        alpha = 0.6 if norm.prior_net is None else 1.7 * pi.clamp_min(1e-300)
        kl = kl_weibull_gamma(4.0, p / math.gamma(1 + 1 / 4.0), alpha, 1.7)
    else:
        mu_p = -0.4 if norm.prior_net is None else torch.log(pi.clamp_min(1e-300)) - 0.8**2 / 2
        kl = kl_lognormal(torch.log(p) - 0.3**2 / 2, 0.3, mu_p, 0.8)
    expected = kl[mask.expand_as(kl)].mean()
    assert torch.allclose(aux.total(), expected, rtol=1e-10)


@pytest.mark.parametrize("name", ["bam-wc", "bam-lc"])
def test_kl_carries_gradient_to_scores_and_prior_network(name):
    torch.manual_seed(0)
    norm = attention.build(name, key_dim=8).train()
    scores = torch.randn(2, 3, 5, 7, requires_grad=True)
    keys = torch.randn(2, 3, 7, 8, requires_grad=True)
    with attention.aux_losses() as aux:
        norm(scores, keys=keys)
    aux.total().backward()
    assert scores.grad.abs().sum() > 0 and keys.grad.abs().sum() > 0
    for p in norm.prior_net.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_kl_is_zero_when_posterior_equals_contextual_prior():
    """Lognormal with sigma_q = sigma_p: KL = (log p - log pi)^2 / (2 sigma^2), zero iff p = pi."""
    norm = attention.build("bam-lc", key_dim=4).eval()
    keys = torch.randn(1, 1, 6, 4)
    with torch.no_grad():
        prior_logits = norm.prior_net(keys).unsqueeze(-2)  # [1, 1, 1, 6]
    with attention.aux_losses() as aux:
        norm(prior_logits.expand(1, 1, 3, 6) + 5.0, keys=keys)  # same softmax, shifted logits
    assert aux.total().abs() < 1e-5


@pytest.mark.parametrize("name", BAM_VARIANTS)
@pytest.mark.parametrize("per_query_mask", [True, False], ids=["per-query-mask", "key-padding-mask"])
def test_gradcheck_float64(name, per_query_mask):
    torch.manual_seed(0)
    norm = attention.build(name, key_dim=3, k=3.0, sigma=0.5).double().train()
    scores = torch.randn(1, 2, 3, 5, dtype=torch.float64, requires_grad=True)
    keys = torch.randn(1, 2, 5, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(1, 1, 3 if per_query_mask else 1, 5) > 0.3
    mask[..., 0] = True

    def run(s, k):
        torch.manual_seed(1)  # the same noise at every evaluation
        with attention.aux_losses() as aux:
            w = norm(s, mask=mask, keys=k)
        return w, aux.total()

    assert torch.autograd.gradcheck(run, (scores, keys))


# ---------------------------------------------------------------- official-code options ----
def _graph(num_nodes=7, seed=0):
    """A random graph with self-loops, as (src, dst) of every edge sorted by target."""
    g = torch.Generator().manual_seed(seed)
    adj = torch.rand(num_nodes, num_nodes, generator=g) < 0.35
    adj |= torch.eye(num_nodes, dtype=torch.bool)
    dst, src = adj.nonzero(as_tuple=True)  # rows are targets
    return src, dst


def test_per_head_prior_networks_shapes_and_heads_are_independent_shared_networks():
    torch.manual_seed(0)
    per_head = attention.ContextualPrior(key_dim=4, d_mid=5, heads=3)
    shared = attention.ContextualPrior(key_dim=4, d_mid=5)
    graph_keys, dense_keys = torch.randn(6, 3, 4), torch.randn(2, 3, 7, 4)
    assert per_head(graph_keys, head_axis=-2).shape == (6, 3)
    assert per_head(dense_keys, head_axis=-3).shape == (2, 3, 7)
    for h in range(3):  # head h of the per-head network is a shared network with head h's weights
        with torch.no_grad():
            shared.hidden.weight.copy_(per_head.hidden.weight[h].T)
            shared.hidden.bias.copy_(per_head.hidden.bias[h])
            shared.out.weight.copy_(per_head.out.weight[h].T)
            shared.out.bias.copy_(per_head.out.bias[h])
        assert torch.allclose(per_head(graph_keys, head_axis=-2)[:, h], shared(graph_keys[:, h]), atol=1e-6)
        assert torch.allclose(per_head(dense_keys, head_axis=-3)[:, h], shared(dense_keys[:, h]), atol=1e-6)
    with pytest.raises(ValueError, match="3 heads on dim -2"):
        per_head(torch.randn(6, 2, 4))
    with pytest.raises(ValueError, match="prior_per_head needs num_heads"):
        attention.build("bam-wc", key_dim=4, prior_per_head=True)
    with pytest.raises(ValueError, match="prior_scope must be one of"):
        attention.build("bam-wc", key_dim=4, prior_scope="graph")


@pytest.mark.parametrize("name", ["bam-wc", "bam-lc"])
def test_all_nodes_prior_sums_to_one_over_all_nodes_not_the_neighbourhood(name):
    torch.manual_seed(0)
    src, dst = _graph()
    keys, scores = torch.randn(7, 2, 4), torch.randn(src.numel(), 2)
    norm = attention.build(name, key_dim=4, num_heads=2, prior_scope="all", prior_per_head=True)
    pi = norm.prior_weights(scores, keys=keys, index=dst, num_nodes=7, key_index=src)
    every_node = torch.softmax(norm.prior_net(keys), dim=0)  # [nodes, heads]
    assert torch.allclose(every_node.sum(0), torch.ones(2))
    assert torch.allclose(pi, every_node[src], atol=1e-6)
    per_target = torch.zeros(7, 2).index_add_(0, dst, pi)
    assert (per_target < 1 - 1e-3).all()  # a neighbourhood holds only part of the prior mass
    scoped = attention.build(name, key_dim=4, num_heads=2, prior_per_head=True)
    scoped.load_state_dict(norm.state_dict())
    pi_scoped = scoped.prior_weights(scores, keys=keys, index=dst, num_nodes=7, key_index=src)
    assert torch.allclose(torch.zeros(7, 2).index_add_(0, dst, pi_scoped), torch.ones(7, 2), atol=1e-6)


@pytest.mark.parametrize("name", ["bam-wc", "bam-lc"])
def test_all_nodes_prior_equals_neighbourhood_prior_on_a_complete_graph(name):
    torch.manual_seed(0)
    n = 5
    dst, src = torch.ones(n, n, dtype=torch.bool).nonzero(as_tuple=True)
    keys, scores = torch.randn(n, 2, 4), torch.randn(n * n, 2)
    norms = [attention.build(name, key_dim=4, num_heads=2, prior_scope=scope, k=3.0, sigma=0.5).train()
             for scope in ("neighbors", "all")]
    norms[1].load_state_dict(norms[0].state_dict())
    kls = []
    for norm in norms:
        with attention.aux_losses() as aux:
            norm(scores, index=dst, num_nodes=n, keys=keys, key_index=src)
        kls.append(aux.total())
    assert torch.allclose(kls[0], kls[1], atol=1e-6)


@pytest.mark.parametrize("name", ["bam-wc", "bam-lc"])
def test_all_nodes_prior_gradcheck_on_a_graph(name):
    """The KL's hand-written backward with a prior normalised over all nodes (not the groups)."""
    torch.manual_seed(0)
    src, dst = _graph(num_nodes=5)
    norm = attention.build(name, key_dim=3, num_heads=2, k=3.0, sigma=0.5, beta=1.3, prior_scope="all",
                           prior_per_head=True).double().train()
    scores = torch.randn(src.numel(), 2, dtype=torch.float64, requires_grad=True)
    keys = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)

    def run(s, k):
        torch.manual_seed(1)
        with attention.aux_losses() as aux:
            w = norm(s, index=dst, num_nodes=5, keys=k, key_index=src)
        return w, aux.total()

    assert torch.autograd.gradcheck(run, (scores, keys))


def test_all_keys_prior_ignores_the_mask_in_dense_attention():
    torch.manual_seed(0)
    norm = attention.build("bam-wc", key_dim=4, prior_scope="all")
    scores, keys = torch.randn(2, 3, 5, 6), torch.randn(2, 3, 6, 4)
    mask = torch.rand(2, 1, 5, 6) > 0.4
    mask[..., 0] = True
    pi = norm.prior_weights(scores, mask=mask, keys=keys)
    assert pi.shape == scores.shape and torch.allclose(pi.sum(-1), torch.ones(2, 3, 5))
    assert torch.allclose(pi, torch.softmax(norm.prior_net(keys), -1).unsqueeze(-2).expand_as(scores))


@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 3e-6), (torch.float64, 1e-9)])
def test_vectorised_lgamma_and_digamma_match_torch(dtype, rtol):
    from common.attention.functional import digamma_positive, lgamma_positive
    tiny = torch.finfo(dtype).tiny
    x = torch.cat([torch.rand(1000, dtype=dtype) ** 3,
                   torch.tensor([tiny, 1e-20, 1e-3, 0.5, 1, 2, 3, 5.9, 6, 10, 1e4, 1e8], dtype=dtype)])
    for ours, reference in ((lgamma_positive, torch.lgamma), (digamma_positive, torch.digamma)):
        want = reference(x.double())
        error = (ours(x).double() - want).abs() / want.abs().clamp_min(1)
        assert error.max() < rtol, ours.__name__
