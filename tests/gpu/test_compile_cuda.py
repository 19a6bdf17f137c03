"""On CUDA: a training step reads nothing back to the host (``torch.cuda.set_sync_debug_mode("error")``),
``torch.compile`` takes the whole step in one graph with the kernels behind custom operators, and
``train.compile=reduce-overhead`` (CUDA graphs) trains."""
import pytest
import torch

from common.utils.runtime import compile_model

from ..compile_cases import NORMALIZERS, build, training_step

pytestmark = pytest.mark.cuda
#: The MT LSTM is left out: its encoder packs the sequences, which needs the lengths on the host. A GAT
#: prepares its graph in the first (warm-up) call.
MODELS = ("gat", "mcan", "lxmert", "att2in", "mt-transformer")


@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("model_name", MODELS)
def test_a_training_step_never_synchronises_the_host(model_name, normalizer):
    model, inputs, loss = build(model_name, normalizer, device="cuda")
    step = training_step(model, loss)
    step(*inputs).backward()  # warm-up: Triton compiles, cuBLAS initialises
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(*inputs).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("normalizer", ["bam-wc", "entmax"])
@pytest.mark.parametrize("model_name", MODELS)
def test_the_step_compiles_in_one_graph_on_cuda(model_name, normalizer):
    model, inputs, loss = build(model_name, normalizer, device="cuda")
    training_step(model, loss)(*inputs)  # a GAT prepares its graph
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        explanation = torch._dynamo.explain(training_step(model, loss))(*inputs)
    assert explanation.graph_break_count == 0


def test_reduce_overhead_trains_mcan_as_eager_does():
    model, inputs, loss = build("mcan", "softmax", device="cuda")
    step = training_step(model, loss)
    eager = [float(step(*inputs))]
    compiled = compile_model(step, mode="reduce-overhead")
    losses = []
    for _ in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(*inputs)
        out.backward()
        losses.append(float(out))
        model.zero_grad(set_to_none=True)
    assert losses == pytest.approx(eager * 3, rel=1e-3)  # the same inputs and weights: the same loss
