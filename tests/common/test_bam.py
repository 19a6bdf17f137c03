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
