"""The fused edge-wise BAM kernels compiled for the GPU: equal to the PyTorch path on the same
noise (weights, KL, gradients), on a graph with isolated nodes, one-edge segments and hubs."""
import pytest
import torch

from common import attention
from common.attention.groups import EdgeGroups

from ..common.test_edge_bam_kernel import BAM_VARIANTS, HEADS, KEY_DIM, graph, run

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("name", BAM_VARIANTS)
def test_compiled_kernels_give_the_pytorch_path_on_the_same_noise(name, monkeypatch):
    torch.manual_seed(0)
    degrees = torch.randint(0, 12, (300,))
    degrees[::50] = 0
    degrees[1::50] = 1
    degrees[7], degrees[100] = 1000, 3000
    index, ptr, src = (t.cuda() for t in graph(degrees.tolist()))
    bam = attention.build(name, num_heads=HEADS, key_dim=KEY_DIM).double().cuda().train()
    scores = torch.randn(index.numel(), HEADS, dtype=torch.float64, device="cuda") * 3
    keys = torch.randn(degrees.numel(), HEADS, KEY_DIM, dtype=torch.float64, device="cuda")
    noise, grad_w = torch.randn_like(scores), torch.randn_like(scores)
    groups = EdgeGroups(index, ptr=ptr)
    torch_path = run(bam, scores, keys, groups, src, noise, grad_w, "0", monkeypatch)
    fused = run(bam, scores, keys, groups, src, noise, grad_w, "1", monkeypatch)
    for ref, got in zip(torch_path, fused):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
