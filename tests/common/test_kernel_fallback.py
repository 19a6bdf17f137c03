"""A Triton kernel that cannot compile, load or launch on the GPU at hand warns once, naming the
kernel and the reason, and its normalizer takes the PyTorch path from then on (the kernels run in
Triton's interpreter here; the failures are made on purpose)."""
import warnings

import pytest
import torch

from common import attention
from common.attention import dense_bam, kernels
from common.attention.groups import EdgeGroups

pytestmark = pytest.mark.skipif(not kernels.triton_available() or not kernels.interpreting(),
                                reason="needs Triton's interpreter (TRITON_INTERPRET=1)")


class Broken:
    """Stands in for a ``@triton.jit`` kernel whose compilation fails."""

    def __init__(self, name):
        self.__name__, self.calls = name, 0

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls += 1
            raise RuntimeError("ptxas fatal   : Unsupported .version 9.4; current version is '8.8'")
        return run


@pytest.fixture
def fresh(monkeypatch):
    """ATTN_TRITON=1 and no family failed yet; returns a function running ``fn`` with the fused
    kernels off (the reference) then on."""
    monkeypatch.setattr(kernels, "FAILED", {})
    monkeypatch.setattr(kernels, "_PRECOMPILED", set())

    def both(fn):
        monkeypatch.setenv("ATTN_TRITON", "0")
        torch.manual_seed(0)
        reference = fn()
        monkeypatch.setenv("ATTN_TRITON", "1")
        torch.manual_seed(0)
        return reference
    return both


def _grads(out, *inputs):
    return torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), inputs)


def _warned_once(fn, kernel):
    with pytest.warns(RuntimeWarning, match=rf"Triton kernel {kernel} \(\w+\) failed: RuntimeError: ptxas fatal"):
        first = fn()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        second = fn()
    return first, second


def test_entmax_kernel_that_fails_to_compile_falls_back_to_the_package(monkeypatch, fresh):
    from common.attention.kernels import entmax_bisect
    broken = Broken("_entmax_fwd")
    monkeypatch.setattr(entmax_bisect, "_entmax_fwd", broken)
    norm = attention.build("entmax", num_heads=2)
    scores = torch.randn(1, 2, 3, 5, requires_grad=True)

    def run():
        out = norm(scores)
        return out, *_grads(out, scores, norm.alpha_logit)
    reference = fresh(run)
    first, second = _warned_once(run, "_entmax_fwd")
    assert broken.calls == 1 and kernels.FAILED.keys() == {"entmax"}
    for a, b, c in zip(first, second, reference):
        torch.testing.assert_close(a, c)
        torch.testing.assert_close(b, c)


def test_csr_entmax_kernel_that_fails_falls_back_to_the_pytorch_bisection(monkeypatch, fresh):
    from common.attention.kernels import entmax_bisect
    monkeypatch.setattr(entmax_bisect, "_entmax_fwd", Broken("_entmax_fwd"))
    norm = attention.build("entmax", num_heads=2)
    index, ptr = torch.tensor([0, 0, 1, 2, 2, 2]), torch.tensor([0, 2, 3, 6])
    scores = torch.randn(6, 2, requires_grad=True)

    def run():
        out = norm(scores, index=index, ptr=ptr)
        return out, *_grads(out, scores, norm.alpha_logit)
    reference = fresh(run)
    first, second = _warned_once(run, "_entmax_fwd")
    assert kernels.FAILED.keys() == {"entmax"}
    for a, b, c in zip(first, second, reference):
        torch.testing.assert_close(a, c)
        torch.testing.assert_close(b, c)


def test_backward_kernel_that_fails_to_load_is_found_in_the_forward(monkeypatch, fresh):
    from common.attention.kernels import entmax_bisect

    def failing(family, key, kernel, *args, **kwargs):
        raise kernels.KernelFailure(family, kernel, RuntimeError("ptxas fatal   : out of resources"))
    monkeypatch.setattr(entmax_bisect, "precompile", failing)
    norm = attention.build("sparsemax")
    scores = torch.randn(2, 7, requires_grad=True)
    reference = fresh(lambda: norm(scores))
    with pytest.warns(RuntimeWarning, match=r"Triton kernel _entmax_bwd \(entmax\) failed"):
        out = norm(scores)
    torch.testing.assert_close(out, reference)
    assert _grads(out, scores)[0].isfinite().all()  # the PyTorch path's backward


def test_edge_bam_kernel_that_fails_falls_back(monkeypatch, fresh):
    from common.attention.kernels import edge_bam
    monkeypatch.setattr(edge_bam, "_edge_bam_fwd", Broken("_edge_bam_fwd"))
    bam = attention.build("bam-wc", num_heads=2, key_dim=3).eval()  # posterior mean: both paths are deterministic
    index = torch.tensor([0, 0, 1, 2, 2, 2])
    groups = EdgeGroups(index, ptr=torch.tensor([0, 2, 3, 6]))
    scores, keys = torch.randn(6, 2, requires_grad=True), torch.randn(6, 2, 3)

    def run():
        with attention.aux_losses() as aux:
            weights = bam.normalize(scores, groups, keys=keys)
        return weights, aux.total(), *_grads(weights + aux.total(), scores)
    reference = fresh(run)
    first, second = _warned_once(run, "_edge_bam_fwd")
    for a, b, c in zip(first, second, reference):
        torch.testing.assert_close(a, c)
        torch.testing.assert_close(b, c)


def test_dense_bam_kernel_that_fails_falls_back_to_the_chunks(monkeypatch, fresh):
    from common.attention.kernels import dense_bam as kernel_module
    monkeypatch.setattr(kernel_module, "_forward", Broken("_forward"))
    norm = attention.build("bam-wc", key_dim=4).train()
    q, k, v = (torch.randn(1, 2, 5, 4, requires_grad=True) for _ in range(3))

    def run():
        with attention.aux_losses() as aux:
            out = dense_bam.dense_bam_attention(norm, q, k, v)
        return out, aux.total()
    fresh(run)
    first, second = _warned_once(run, "_forward")
    assert kernels.FAILED.keys() == {"dense_bam"}
    for out, kl in (first, second):  # sampled by the chunks (a fresh draw each): finite, with gradients
        assert out.shape == (1, 2, 5, 4) and kl.isfinite() and all(g.isfinite().all() for g in _grads(out, q, k, v))
