"""Under ``torch.compile`` a GAT keeps the fused edge-wise kernels: the edge-wise BAM and CSR entmax kernels are
custom operators (``attention_suite::edge_bam``, ``attention_suite::entmax_csr``), so the compiled training step
calls them in one graph instead of tracing the PyTorch paths: the Triton kernels (here in Triton's interpreter)
and the C kernels of the CPU."""
import pytest
import torch
import torch.nn.functional as F

from common.attention import kernels
from common.attention.kernels import cpu_edge_bam
from graphattn.models import GAT

from ..compile_cases import training_step

TRITON = pytest.mark.skipif(not kernels.triton_available() or not kernels.interpreting(),
                            reason="needs Triton's interpreter (TRITON_INTERPRET=1)")
C_KERNELS = pytest.mark.skipif(not cpu_edge_bam.takes(torch.zeros(1, 1)), reason="the C kernels do not build here")


@pytest.mark.parametrize("normalizer,operator,triton", [
    pytest.param("bam-wc", "attention_suite.edge_bam", "1", marks=TRITON, id="bam-wc-triton"),
    pytest.param("bam-wc", "attention_suite.edge_bam", "0", marks=C_KERNELS, id="bam-wc-cpu"),
    pytest.param("entmax", "attention_suite.entmax_csr", "1", marks=TRITON, id="entmax-triton")])
def test_a_compiled_gat_keeps_the_kernels_in_one_graph(normalizer, operator, triton, monkeypatch):
    """0 breaks with the operator in the graph, and the compiled step gives eager's loss and gradients for the same
    seed (the kernels draw BAM's noise from it)."""
    monkeypatch.setenv("ATTN_TRITON", triton)
    monkeypatch.setenv("ATTN_CPU_KERNELS", "1")
    torch.manual_seed(0)
    inputs = torch.randn(6, 5), torch.randint(0, 6, (2, 14))  # few nodes: the interpreter runs one program each
    target = torch.randint(0, 3, (6,))
    model = GAT(5, 3, hidden_channels=4, heads=2, dropout=0.0, attention=normalizer).train()
    step = training_step(model, lambda out, aux: F.cross_entropy(out, target) + aux.total())
    step(*inputs)  # the layers prepare the graph (outside any compiled graph)
    params = [p for p in model.parameters() if p.requires_grad]

    def run(fn):
        torch.manual_seed(3)
        out = fn(*inputs)
        return [out.detach(), *torch.autograd.grad(out, params, allow_unused=True)]
    eager = run(step)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(step)(*inputs)
    assert explanation.graph_break_count == 0
    assert any(operator in str(node.target) for graph in explanation.graphs for node in graph.graph.nodes)
    torch._dynamo.reset()
    compiled = run(torch.compile(step, fullgraph=True, backend="aot_eager"))
    assert sum(g is not None for g in compiled) == sum(g is not None for g in eager) > 4
    for a, b in zip(compiled, eager):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
