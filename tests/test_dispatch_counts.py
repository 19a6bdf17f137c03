"""A thin host path: the operators and Triton launches of a training step, counted on the ``meta`` device
as a GPU runs them (:mod:`tests.dispatch_counts`), first the counter itself, then the issue's targets.

The targets: one BAM-WC ``Attend`` call in training (forward, backward, KL) makes at most 2x softmax's
dispatches + 12, and an MCAN-small training step with BAM-WC at most 1.3x the softmax step's
(``benchmarks/dispatches.py`` prints where the dispatches come from)."""
import pytest
import torch
import torch.nn.functional as F

from common.attention import kernels

from .dispatch_counts import attend_call, count, cuda_sdpa, mcan_step, meta_gpu

needs_triton = pytest.mark.skipif(not kernels.triton_available(), reason="the dense BAM path on a GPU needs Triton")


def double_kernel(x, out):
    """Stands for a Triton kernel: :func:`kernels.launch` skips it on ``meta``."""


@torch.library.custom_op("dispatch_counts_test::doubled", mutates_args=())
def doubled(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    kernels.launch("test", double_kernel, (1,), x, out)
    return out.mul_(2)


@doubled.register_fake
def _(x):
    return torch.empty_like(x)


def _kernel_ops(counts) -> dict:
    """Operators other than ``detach`` (autograd saving an output for the backward pass)."""
    return {name: n for name, n in counts.ops.items() if name != "aten::detach"}


def test_the_counter_counts_operators_custom_op_bodies_and_launches(monkeypatch):
    with meta_gpu(monkeypatch):
        x = torch.empty(4, device="meta")
        chain = count(lambda: x.add(1).mul(2).exp())
        assert dict(chain.ops) == {"aten::add.Tensor": 1, "aten::mul.Tensor": 1, "aten::exp": 1}
        assert chain.total == 3 and chain.backward == 0

        custom = count(lambda: doubled(x).neg())
        assert dict(custom.ops) == {"dispatch_counts_test::doubled": 1, "aten::empty_like": 1, "aten::mul_.Tensor": 1,
                                    "aten::neg": 1}
        assert dict(custom.launches) == {"double_kernel": 1} and custom.total == 5

        leaf = torch.empty(4, device="meta", requires_grad=True)
        grads = count(lambda: torch.autograd.grad(leaf.exp(), leaf, torch.empty(4, device="meta")))
        assert grads.ops["aten::exp"] == 1 and grads.sources["backward: ExpBackward0"] == grads.backward >= 1
    assert custom.summary()["by_kernel"] == {"double_kernel": 1} and custom.summary()["total"] == 5


@pytest.mark.parametrize("dtype, mask, kernel", [
    (torch.bfloat16, False, "_scaled_dot_product_flash_attention"),
    (torch.float32, False, "_scaled_dot_product_efficient_attention"),
    (torch.bfloat16, True, "_scaled_dot_product_efficient_attention"),
])
def test_softmax_attention_counts_as_cuda_runs_sdpa(monkeypatch, dtype, mask, kernel):
    with meta_gpu(monkeypatch):
        ops = _kernel_ops(attend_call("softmax", dtype=dtype, mask=mask))
    assert ops.pop(f"aten::{kernel}") == 1 and ops.pop(f"aten::{kernel}_backward") == 1
    if mask:  # the boolean mask becomes an additive bias, as CUDA's SDPA makes it
        assert ops.pop("aten::where.self") == 1 and ops.pop("aten::expand") == 1
        assert ops.pop("aten::scalar_tensor") >= 1
    assert not ops, ops


@pytest.mark.parametrize("keys, mask_shape", [(16, (2, 1, 1, 16)), (13, (2, 1, 1, 13)), (13, (13,))])
def test_cuda_sdpa_gives_sdpa_shapes(keys, mask_shape):
    q = torch.empty(2, 3, 5, 8, device="meta")
    k = v = torch.empty(2, 3, keys, 8, device="meta")
    mask = torch.empty(mask_shape, dtype=torch.bool, device="meta")
    out = cuda_sdpa(q, k, v, attn_mask=mask)
    assert out.shape == F.scaled_dot_product_attention(q, k, v, attn_mask=mask).shape and out.dtype == q.dtype


def _message(bam, softmax) -> str:
    top = ", ".join(f"{where} {n}" for where, n in bam.sources.most_common(8))
    return f"BAM-WC {bam.total} dispatches ({sum(bam.launches.values())} launches) vs softmax {softmax.total}; {top}"


@needs_triton
@pytest.mark.parametrize("dtype, mask", [(torch.bfloat16, False), (torch.float32, True)], ids=["bf16", "fp32-padded"])
def test_a_bam_wc_attend_call_dispatches_at_most_twice_softmax_plus_12(monkeypatch, dtype, mask):
    with meta_gpu(monkeypatch):
        softmax = attend_call("softmax", dtype=dtype, mask=mask)
        bam = attend_call("bam-wc", dtype=dtype, mask=mask)
    assert bam.launches, "the Triton kernels did not take the call"
    assert bam.total <= 2 * softmax.total + 12, _message(bam, softmax)


@needs_triton
def test_an_mcan_small_bam_wc_step_dispatches_at_most_1_3x_softmax(monkeypatch):
    with meta_gpu(monkeypatch):
        softmax, bam = mcan_step("softmax"), mcan_step("bam-wc")
    assert bam.launches, "the Triton kernels did not take the calls"
    assert bam.total <= 1.3 * softmax.total, _message(bam, softmax) + f" (x{bam.total / softmax.total:.2f})"
