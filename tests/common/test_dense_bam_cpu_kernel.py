"""The fused CPU row kernels of dense BAM (common.attention.kernels.cpu_bam) against numpy and torch."""
import os
import warnings

import numpy as np
import pytest
import torch

from common import attention
from common.attention import dense_bam
from common.attention.kernels import cpu_bam

from .test_dense_bam import CASES, KEEP, B, D, H, K, Q, _inputs, _loss_grads, _materialised, assert_standard_law

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85


def philox4x32(counter, key, rounds=10):
    """Philox4x32 (Salmon et al., 2011) in numpy, for arrays of counters ``(c0, c1, c2, c3)``."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & 0xFFFFFFFF for c in counter)
    k0, k1 = (np.uint64(k) for k in key)
    for _ in range(rounds):
        p0, p1 = np.uint64(M0) * c0, np.uint64(M1) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & np.uint64(0xFFFFFFFF),
                          (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & np.uint64(0xFFFFFFFF))
        k0, k1 = (k0 + np.uint64(W0)) & np.uint64(0xFFFFFFFF), (k1 + np.uint64(W1)) & np.uint64(0xFFFFFFFF)
    return c0, c1, c2, c3


def test_reference_philox_gives_random123_known_answers():
    """The reference above reproduces Random123's known-answer vectors for Philox4x32-10."""
    vectors = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
               ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
               ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
                (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for counter, key, want in vectors:
        assert tuple(int(w) for w in philox4x32(counter, key)) == want


needs_kernels = pytest.mark.skipif(not cpu_bam.available() and os.environ.get("CI", "").lower() != "true",
                                   reason="no C compiler here: the fused CPU kernels are not built")


def test_kernels_build_under_ci():
    """CI has a C compiler: the kernels must build there (elsewhere they are optional)."""
    if os.environ.get("CI", "").lower() == "true":
        assert cpu_bam.available()


def _words(seed, groups, queries, keys, stream):
    """The reference words of keys ``0..keys-1``: word ``j % 4`` of counter (j // 4, query, group, stream)."""
    g, r, j = np.meshgrid(np.asarray(groups), np.asarray(queries), np.arange(keys), indexing="ij")
    lanes = philox4x32((j // 4, r, g, np.full_like(j, stream)), (seed & 0xFFFFFFFF, seed >> 32))
    return np.choose(j % 4, lanes)


def _uniform(words):
    return ((words >> np.uint64(9)).astype(np.float64) + 0.5) * 2.0**-23


SEED, G0, R0 = (1 << 40) + 12345, 5, 11


def _drawn_noise(kind, keys, scale=1.0, shape=(2, 3)):
    s = torch.zeros(*shape, keys)
    out = torch.empty_like(s)
    cpu_bam.sample(s, out, SEED, G0, R0, kind, scale, softmax=False)
    return out.double().numpy()


@needs_kernels
@pytest.mark.parametrize("keys", [37, 300, 1024])  # a partial 4-key group; several 256-key blocks
def test_weibull_noise_is_log_minus_log_of_the_philox_uniform(keys):
    words = _words(SEED, range(G0, G0 + 2), range(R0, R0 + 3), keys, 0)
    want = np.log(-np.log(_uniform(words)))
    np.testing.assert_allclose(_drawn_noise(cpu_bam.NOISE_WEIBULL, keys), want, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(_drawn_noise(cpu_bam.NOISE_WEIBULL, keys, scale=0.25), 0.25 * want,
                               rtol=2e-6, atol=2e-6)


@needs_kernels
@pytest.mark.parametrize("keys", [37, 300])
def test_normal_noise_is_box_muller_of_adjacent_word_pairs(keys):
    words = _words(SEED, range(G0, G0 + 2), range(R0, R0 + 3), keys + keys % 2, 0)  # whole pairs
    u = _uniform(words)
    radius, angle = np.sqrt(-2 * np.log(u[..., 0::2])), 2 * np.pi * u[..., 1::2]
    want = np.stack([radius * np.cos(angle), radius * np.sin(angle)], -1).reshape(u.shape[:-1] + (-1,))[..., :keys]
    np.testing.assert_allclose(_drawn_noise(cpu_bam.NOISE_NORMAL, keys), want, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("law, kind", [("normal", cpu_bam.NOISE_NORMAL), ("log_weibull", cpu_bam.NOISE_WEIBULL)])
def test_kernel_noise_has_its_standard_law(law, kind):
    """A million draws over 1000 heads x 1001 keys (Box-Muller pairs are adjacent keys)."""
    x = torch.from_numpy(_drawn_noise(kind, 1001, shape=(1000, 1))).float()
    pairs = torch.arange(0, 1000, 2)[None, :] + 1001 * torch.arange(1000)[:, None]
    assert_standard_law(x, law, (pairs.flatten(), pairs.flatten() + 1))


@needs_kernels
def test_dropout_scale_comes_from_the_second_stream():
    keys, p = 300, 0.3
    s = torch.zeros(2, 3, keys)
    out, keep = torch.empty_like(s), torch.empty_like(s)
    cpu_bam.sample(s, out, SEED, G0, R0, cpu_bam.NOISE_NONE, 0.0, keep=keep, dropout=p)
    words = _words(SEED, range(G0, G0 + 2), range(R0, R0 + 3), keys, 1)
    want = np.where((words & 0xFFFFFF) >= round(p * 2**24), 1 / (1 - p), 0.0)
    np.testing.assert_allclose(keep.double().numpy(), want, rtol=1e-7)
    assert abs((keep == 0).double().mean().item() - p) < 0.05


def _scores(shape=(3, 4, 301), seed=0):
    """Scores with hidden keys (-inf), a fully hidden row, and rows far past exp's float32 range."""
    g = torch.Generator().manual_seed(seed)
    s = 3 * torch.randn(*shape, generator=g)
    s[0, :, 200:] = float("-inf")
    s[1, 1] = float("-inf")
    s[2, 0] += 100.0
    s[2, 1] -= 100.0
    return s


@needs_kernels
@pytest.mark.parametrize("kind", [cpu_bam.NOISE_NONE, cpu_bam.NOISE_WEIBULL, cpu_bam.NOISE_NORMAL])
def test_sample_is_softmax_of_noisy_scores_with_row_statistics(kind):
    s = _scores()
    noise = torch.empty_like(s)
    cpu_bam.sample(torch.zeros_like(s), noise, SEED, 0, 0, kind, 0.7, softmax=False)
    weights, lse, sq = torch.empty_like(s), torch.empty(s.shape[:2]), torch.empty(s.shape[:2])
    cpu_bam.sample(s, weights, SEED, 0, 0, kind, 0.7, lse=lse, sq=sq)
    z = (s.double() + noise.double())
    want = torch.softmax(z, -1).nan_to_num(0.0)
    torch.testing.assert_close(weights.double(), want, rtol=1e-5, atol=1e-6)
    assert torch.equal(weights[0, :, 200:], torch.zeros_like(weights[0, :, 200:]))  # hidden keys: exact zeros
    assert torch.equal(weights[1, 1], torch.zeros_like(weights[1, 1]))
    torch.testing.assert_close(lse.double(), torch.logsumexp(s.double(), -1), rtol=1e-6, atol=1e-5)
    assert torch.isneginf(lse[1, 1])
    finite = torch.isfinite(s)
    torch.testing.assert_close(sq.double(), s.double().where(finite, 0.0).square().sum(-1), rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("dropout", [False, True])
def test_grad_is_the_softmax_lse_and_square_gradient(dropout):
    s = _scores()
    g = torch.Generator().manual_seed(1)
    w = torch.softmax(s + torch.randn(s.shape, generator=g), -1).nan_to_num(0.0)
    keep = (torch.rand(s.shape, generator=g) > 0.3).float() / 0.7 if dropout else None
    d_w, d_norm, d_lse, d_sq = (torch.randn(shape, generator=g) for shape in (s.shape, s.shape[:2], s.shape[:2],
                                                                              s.shape[:2]))
    lse = torch.logsumexp(s, -1)
    got = d_w.clone()
    cpu_bam.grad(got, w, keep, d_norm, s, lse, d_lse, d_sq)
    sd, finite = s.double(), torch.isfinite(s)
    want = ((d_w.double() * (1 if keep is None else keep.double()) - d_norm.double()[..., None]) * w.double()
            + d_lse.double()[..., None] * torch.exp(sd - torch.logsumexp(sd, -1, keepdim=True)).nan_to_num(0.0)
            + 2 * d_sq.double()[..., None] * sd.where(finite, 0.0))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    plain = d_w.clone()
    cpu_bam.grad(plain, w, keep, d_norm)
    torch.testing.assert_close(plain.double(), (d_w.double() * (1 if keep is None else keep.double())
                                                - d_norm.double()[..., None]) * w.double(), rtol=1e-6, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("kind", [cpu_bam.NOISE_NONE, cpu_bam.NOISE_WEIBULL, cpu_bam.NOISE_NORMAL])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_regrad_redraws_the_forward_weights_and_takes_their_gradient(kind, dropout):
    """regrad's weights, from sample's noise, dropout and normaliser, are sample's (w keep), and its
    d_s is grad's of those weights; hidden keys and the fully hidden row stay exact zeros."""
    s = _scores()
    g = torch.Generator().manual_seed(2)
    d_w, d_norm, d_lse, d_sq = (torch.randn(shape, generator=g) for shape in (s.shape, s.shape[:2], s.shape[:2],
                                                                              s.shape[:2]))
    w, keep, lse, lse_z = torch.empty_like(s), torch.empty_like(s) if dropout else None, *(torch.empty(s.shape[:2])
                                                                                          for _ in range(2))
    cpu_bam.sample(s, w, SEED, G0, R0, kind, 0.7, keep=keep, dropout=dropout, lse=lse, lse_z=lse_z)
    assert torch.isneginf(lse_z[1, 1])
    finite = lse_z[torch.arange(3) != 1]
    z = s.double() + (torch.from_numpy(_drawn_noise(kind, s.shape[-1], 0.7, s.shape[:2])) if kind else 0.0)
    torch.testing.assert_close(finite.double(), torch.logsumexp(z, -1)[torch.arange(3) != 1], rtol=1e-6, atol=1e-5)
    want = d_w.clone()
    cpu_bam.grad(want, w, keep, d_norm, s, lse, d_lse, d_sq)
    got, dropped = d_w.clone(), torch.empty_like(s)
    cpu_bam.regrad(got, dropped, s, lse_z, d_norm, SEED, G0, R0, kind, 0.7, dropout, lse, d_lse, d_sq)
    torch.testing.assert_close(dropped, w if keep is None else w * keep, rtol=2e-5, atol=1e-7)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    hidden = torch.isneginf(s)
    assert not got.isnan().any() and bool((dropped[hidden] == 0).all())
    assert torch.equal(got[1, 1], torch.zeros_like(got[1, 1]))  # no key: no weight, no gradient
    with pytest.raises(ValueError, match="regrad: s"):
        cpu_bam.regrad(got, dropped[:, :, :-1].contiguous(), s, lse_z, d_norm, SEED, G0, R0, kind, 0.7)


@needs_kernels
def test_rows_split_over_threads_give_the_same_result():
    s = _scores((4, 64, 301))
    d_w, d_norm = torch.randn(s.shape, generator=torch.Generator().manual_seed(3)), torch.ones(s.shape[:2])
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            w, keep = torch.empty_like(s), torch.empty_like(s)
            lse, lse_z = torch.empty(s.shape[:2]), torch.empty(s.shape[:2])
            cpu_bam.sample(s, w, SEED, 2, 0, cpu_bam.NOISE_WEIBULL, 1.0, keep=keep, dropout=0.2, lse=lse,
                           lse_z=lse_z)
            d_s, regrad_s, dropped = d_w.clone(), d_w.clone(), torch.empty_like(s)
            cpu_bam.grad(d_s, w, keep, d_norm, s, lse, d_norm, d_norm)
            cpu_bam.regrad(regrad_s, dropped, s, lse_z, d_norm, SEED, 2, 0, cpu_bam.NOISE_WEIBULL, 1.0, 0.2, lse,
                           d_norm)
            results.append((w, keep, lse, lse_z, d_s, regrad_s, dropped))
    finally:
        torch.set_num_threads(threads)
    for got, want in zip(*results):
        assert torch.equal(got, want)


@needs_kernels
def test_rejects_tensors_it_cannot_read():
    s = torch.zeros(2, 3, 8)
    with pytest.raises(ValueError, match="contiguous float32"):
        cpu_bam.sample(s.double(), torch.empty(2, 3, 8, dtype=torch.float64), 0, 0, 0, 0, 0.0)
    with pytest.raises(ValueError, match="contiguous float32"):
        cpu_bam.sample(s.transpose(0, 1).contiguous().transpose(0, 1), torch.empty(2, 3, 8), 0, 0, 0, 0, 0.0)
    with pytest.raises(ValueError, match="scores' shape"):
        cpu_bam.sample(s, torch.empty(2, 3, 9), 0, 0, 0, 0, 0.0)


def test_without_a_compiler_the_chunks_fall_back_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("ATTN_KERNEL_CACHE", str(tmp_path / "cache"))
    cpu_bam._library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="could not be built"):
            assert not cpu_bam.available()
        q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
        norm = attention.build("bam-wc", key_dim=4).train()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the warning is given once
            out = dense_bam.dense_bam_attention(norm, q, k, v)
        assert torch.isfinite(out).all()
    finally:
        cpu_bam._library.cache_clear()


@needs_kernels
@pytest.mark.parametrize("name", ["bam-wc", "bam-lc"])
def test_drawn_sample_does_not_depend_on_the_chunking(name, monkeypatch):
    """The kernel's noise is keyed by (seed, head, query, key): any chunk size gives the same
    output and gradients under the same torch seed."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=g).requires_grad_() for _ in range(3))
    mask = (torch.arange(9) < torch.tensor([9, 5])[:, None]).view(2, 1, 1, 9)
    norm = attention.build(name, key_dim=8).train()
    results = []
    for chunk in (1 << 20, 9 * 4, 9):  # all heads at once; four queries; one query
        monkeypatch.setattr(dense_bam, "CHUNK_ELEMENTS", chunk)
        torch.manual_seed(7)
        with attention.aux_losses() as aux:
            out = dense_bam.dense_bam_attention(norm, q, k, v, mask=mask, dropout=0.2)
        results.append((out, *torch.autograd.grad(out.square().sum() + aux.total(), (q, k, v))))
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("keep", [*KEEP, "none, in blocks of keys", "none, in blocks of keys, more chunks"])
def test_kernel_path_equals_materialised_under_its_noise(case, keep, monkeypatch):
    """Drawn noise through the fused kernels, against the materialised path given the same noise
    (the kernel's standard noise of every (head, query, key)): output, KL and gradients; the
    backward pass of long rows takes blocks of 4 keys (two per row here), in as many chunks as
    the forward pass, or in more (two queries per forward chunk, three per backward one)."""
    name, use_mask, causal, options = case if len(case) == 4 else (*case, {})
    norm = attention.build(name, key_dim=D, k=4.0, sigma=0.5, **options).train()
    monkeypatch.setattr(dense_bam, "CHUNK_ELEMENTS", K * (2 if keep.endswith("more chunks") else 4))
    monkeypatch.setattr(dense_bam, "KEEP_BYTES", KEEP.get(keep, 0))
    if keep not in KEEP:
        monkeypatch.setattr(dense_bam, "KEY_BLOCK", 4)
    monkeypatch.setattr(dense_bam, "KEY_ALIGN", 4)
    q, k, v, mask, _ = _inputs()
    mask = mask if use_mask else None
    torch.manual_seed(3)
    seed = int(torch.randint(0, 1 << 62, ()))  # what dense_bam_attention draws
    kind = cpu_bam.NOISE_WEIBULL if norm.posterior == "weibull" else cpu_bam.NOISE_NORMAL
    noise = torch.empty(B * H, Q, K)
    cpu_bam.sample(torch.zeros(B * H, Q, K), noise, seed, 0, 0, kind, 1.0, softmax=False)
    torch.manual_seed(3)
    with attention.aux_losses() as aux:
        out = dense_bam.dense_bam_attention(norm, q, k, v, mask=mask, causal=causal)
    kl = aux.total()
    ref_out, ref_kl = _materialised(norm, q, k, v, mask, causal, noise.view(B, H, Q, K))
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kl, ref_kl, rtol=1e-5, atol=1e-5)
    for got, want in zip(_loss_grads(norm, out, kl, (q, k, v)), _loss_grads(norm, ref_out, ref_kl, (q, k, v))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
