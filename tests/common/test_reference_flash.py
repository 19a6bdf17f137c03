"""The reference flash-attention kernel (common.attention.kernels.reference_flash) against SDPA, output and
gradients, in Triton's interpreter without a GPU. float32 and float16 only: the interpreter's bfloat16 ``tl.dot``
multiplies the raw bit patterns (triton-lang/triton#11584); bfloat16 is compiled by the aot check."""
import pytest
import torch
import torch.nn.functional as F

from common.attention.kernels import interpreting, triton_available

pytestmark = pytest.mark.skipif(not triton_available() or not (torch.cuda.is_available() or interpreting()),
                                reason="needs Triton, with a GPU or TRITON_INTERPRET=1")


def _inputs(n_q: int, n_k: int, dtype: torch.dtype, d: int = 32):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, d, generator=g).to(dtype).requires_grad_() for n in (n_q, n_k, n_k))
    return q, k, v, torch.randn(2, 2, n_q, d, generator=g).to(dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 5e-3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k", [(40, 40), (33, 50), (50, 20)])  # 16-blocks: ragged ends, causal diagonals
def test_output_and_gradients_equal_sdpa(dtype, tol, causal, n_q, n_k):
    from common.attention.kernels.reference_flash import flash_attention
    q, k, v, d_out = _inputs(n_q, n_k, dtype)
    out = flash_attention(q, k, v, causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    ref_inputs = [x.detach().float().requires_grad_() for x in (q, k, v)]
    mask = torch.ones(n_q, n_k, dtype=torch.bool).tril() if causal else None  # SDPA's is_causal: keys j <= i
    ref = F.scaled_dot_product_attention(*ref_inputs, attn_mask=mask)
    ref_grads = torch.autograd.grad(ref, ref_inputs, d_out.float())
    assert out.dtype == dtype and out.shape == q.shape
    for got, want in zip((out, *grads), (ref, *ref_grads)):
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


def test_scale_and_custom_operator():
    """An explicit scale is applied, and ``torch.ops.attention_suite.reference_flash`` passes torch.library's
    checks (schema, fake tensors, autograd registration)."""
    from common.attention.kernels.reference_flash import flash_attention, reference_flash
    q, k, v, _ = _inputs(20, 24, torch.float32, d=16)
    torch.testing.assert_close(flash_attention(q, k, v, scale=0.3),
                               F.scaled_dot_product_attention(q, k, v, scale=0.3), atol=1e-5, rtol=1e-5)
    torch.library.opcheck(reference_flash, (q, k, v, True, 0.25),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_unsupported_shapes_are_refused():
    from common.attention.kernels.reference_flash import flash_attention
    q = torch.randn(1, 2, 8, 24)
    with pytest.raises(ValueError, match="head size 24"):
        flash_attention(q, q, q)
    with pytest.raises(ValueError, match="expected q"):
        flash_attention(q[0], q[0], q[0])
