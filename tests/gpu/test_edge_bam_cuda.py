"""The fused edge-wise BAM kernels compiled for the GPU: equal to the PyTorch path on the same
noise (weights, KL, gradients), on a graph with isolated nodes, one-edge segments and hubs."""
import pytest
import torch

from ..common.test_edge_bam_kernel import BAM_VARIANTS, assert_paths_agree

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("name", BAM_VARIANTS)
def test_compiled_kernels_give_the_pytorch_path_on_the_same_noise(name, monkeypatch):
    degrees = torch.randint(0, 12, (300,), generator=torch.Generator().manual_seed(0))
    degrees[::50] = 0
    degrees[1::50] = 1
    degrees[7], degrees[100] = 1000, 3000
    assert_paths_agree(name, degrees.tolist(), torch.float64, monkeypatch, device="cuda")
