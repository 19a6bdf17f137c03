"""The compiled Triton entmax kernel on CUDA at working sizes against the PyTorch paths (the
``entmax`` package, the scatter bisection), and the trimmed span on CUDA against the full path."""
import pytest
import torch

from common import attention
from common.attention.blocks import Attend
from common.attention.blocks.trimmed import trimmed_span_attention

pytestmark = pytest.mark.cuda


def _both_paths(monkeypatch, fn):
    """``fn()`` with the fused kernels (CUDA default), then with ``ATTN_TRITON=0``."""
    monkeypatch.delenv("ATTN_TRITON", raising=False)
    fused = fn()
    monkeypatch.setenv("ATTN_TRITON", "0")
    return fused, fn()


@pytest.mark.parametrize("name", ["entmax", "entmax15", "sparsemax"])
@pytest.mark.parametrize("keys", [512, 16384])
def test_dense_kernel_follows_the_package(monkeypatch, name, keys):
    g = torch.Generator(device="cuda").manual_seed(0)
    B, H, Q = (2, 8, 64) if keys == 512 else (1, 2, 4)
    scores = (torch.randn(B, H, Q, keys, device="cuda", generator=g) * 4).requires_grad_()
    mask = (torch.arange(keys, device="cuda") < torch.tensor([keys, keys // 3], device="cuda")[:B, None])
    mask = mask.view(B, 1, 1, keys)
    upstream = torch.randn(B, H, Q, keys, device="cuda", generator=g)
    norm = attention.build(name, num_heads=H).cuda()
    if name == "entmax":
        with torch.no_grad():
            norm.alpha_logit.copy_(torch.linspace(-3, 3, H))

    def run():
        out = norm(scores, mask=mask)
        return (out, *torch.autograd.grad((out * upstream).sum(), [scores, *norm.parameters()]))

    fused, reference = _both_paths(monkeypatch, run)
    for a, b in zip(fused, reference):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("sorted_edges", [True, False])
def test_edge_kernel_follows_the_scatter_bisection(monkeypatch, sorted_edges):
    g = torch.Generator(device="cuda").manual_seed(0)
    E, N, H = 200_000, 20_000, 8
    index = torch.randint(0, N, (E,), device="cuda", generator=g)
    ptr = None
    if sorted_edges:
        index = index.sort().values
        ptr = torch.cat([index.new_zeros(1), torch.bincount(index, minlength=N).cumsum(0)])
    scores = torch.randn(E, H, device="cuda", generator=g).requires_grad_()
    upstream = torch.randn(E, H, device="cuda", generator=g)
    norm = attention.build("entmax", num_heads=H).cuda()

    def run():
        out = norm(scores, index=index, num_nodes=N, ptr=ptr)
        return (out, *torch.autograd.grad((out * upstream).sum(), [scores, norm.alpha_logit]))

    fused, reference = _both_paths(monkeypatch, run)
    for a, b in zip(fused, reference):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5)


def test_trimmed_span_equals_full_path_on_cuda():
    """On CUDA ``Attend`` takes the full path even with ``need_maps=False`` (choosing the trimmed keys reads the
    spans back to the host: that shortcut is the CPU's in eager mode, docs/gpu.md); the trimmed computation,
    called directly on CUDA tensors, gives the full path's output and gradients on the real (unpadded) queries.
    Padding queries are left out: where a query's span reaches only a few real keys, the span's
    renormalisation ``m w / (sum m w + 1e-8)`` differs between the paths by far more than rounding (the full
    path's softmax spreads over all real keys), on the CPU in float64 too."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # an earlier test's Runtime may have turned TF32 on (H100: 8e-4 off)
    try:
        _compare_trimmed_and_full_span_on_cuda()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _compare_trimmed_and_full_span_on_cuda():
    g = torch.Generator(device="cuda").manual_seed(0)
    attend = Attend(8, 64, {"span": {"max_span": 64, "ramp": 8, "init": 0.37}}).cuda()
    q, k, v = (torch.randn(2, 8, 1024, 64, device="cuda", generator=g).requires_grad_() for _ in range(3))
    mask = (torch.arange(1024, device="cuda") < torch.tensor([1024, 700], device="cuda")[:, None]).view(2, 1, 1, 1024)
    real = mask.view(2, 1, 1024, 1)
    out, maps = attend(q, k, v, mask=mask, need_maps=False)
    assert maps.weights is not None  # no shortcut on CUDA: the full path, which records its maps
    trimmed = trimmed_span_attention(q, k, v, attend.span, attend.normalizer, 64 ** -0.5, mask, 0.0, True)
    assert trimmed is not None  # a 1024-token sequence with spans of at most 64 is trimmed
    results = [(x * real, *torch.autograd.grad((x * real).square().sum(), (q, k, v, attend.span.z)))
               for x in (trimmed, out)]
    for a, b in zip(*results):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))
