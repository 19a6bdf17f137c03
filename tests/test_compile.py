"""``torch.compile`` of every domain's training step: no graph break (``torch._dynamo.explain``) for each
model x normalizer and map operator, except the documented ones (docs/performance.md, "torch.compile");
one tiny step per domain (graphs, VQA, captioning, translation) with the inductor backend matches eager mode."""
import pytest
import torch

from common.utils.runtime import compile_model

from .compile_cases import MAP_OPERATORS, NORMALIZERS, build, training_step

#: Breaks that cannot be avoided, each with its reason in docs/gpu.md; the test pins their number.
EXPECTED_BREAKS = {"mt-lstm": 4}  # pack_padded_sequence needs the source lengths on the host
MODELS = ("gat", "mcan", "lxmert", "att2in", "mt-lstm", "mt-transformer")


def _explain(model_name, normalizer, operator=None, prepared_graph=True):
    """``torch._dynamo.explain`` of a training forward; a GAT's graph is prepared by an eager call first
    (``prepared_graph``), as the full-batch trainer's later epochs find it."""
    model, inputs, loss = build(model_name, normalizer, operator)
    if model_name == "gat" and prepared_graph:
        training_step(model, loss)(*inputs)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):  # as common.utils.runtime.compile_model sets it
        return torch._dynamo.explain(training_step(model, loss))(*inputs)


@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("model_name", MODELS)
def test_training_forward_has_no_graph_break(model_name, normalizer):
    explanation = _explain(model_name, normalizer)
    reasons = [f"{r.reason.splitlines()[0]} at {r.user_stack[-1].filename}:{r.user_stack[-1].lineno}"
               for r in explanation.break_reasons if r.user_stack]
    assert explanation.graph_break_count == EXPECTED_BREAKS.get(model_name, 0), reasons


def _pyg_twin(model):
    """The same GAT built from ``torch_geometric.nn.GATConv`` (softmax attention, PyG's own layer)."""
    import torch_geometric.nn as pyg_nn

    for name in ("conv1", "conv2"):
        ours = getattr(model, name)
        setattr(model, name, pyg_nn.GATConv(ours.in_channels, ours.out_channels, heads=ours.heads,
                                            concat=ours.concat, dropout=ours.dropout))
    return model


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_a_fresh_graph_breaks_no_more_often_than_pygs_gatconv(normalizer):
    """A GAT called with a graph it has not prepared yet sorts it (data-dependent: self-loop removal, the
    sort by target) outside the compiled graph, once per layer: fewer breaks than the same model of PyG's
    ``GATConv``, which breaks at the ``nonzero`` of its self-loop removal on every call."""
    ours = _explain("gat", normalizer, prepared_graph=False)
    model, inputs, loss = build("gat", normalizer)
    torch._dynamo.reset()
    pygs = torch._dynamo.explain(training_step(_pyg_twin(model), loss))(*inputs)
    assert pygs.graph_break_count == 6  # 3 per layer, PyG 2.8
    assert ours.graph_break_count == 5 <= pygs.graph_break_count
    assert all("torch.compiler.disable" in r.reason for r in ours.break_reasons)


@pytest.mark.parametrize("normalizer", ["softmax", "bam-wc"])
@pytest.mark.parametrize("operator", sorted(MAP_OPERATORS))
def test_map_operators_have_no_graph_break(operator, normalizer):
    explanation = _explain("mt-transformer", normalizer, operator)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


@pytest.mark.parametrize("model_name,normalizer", [("gat", "bam-wc"), ("mcan", "bam-wc"), ("att2in", "entmax"),
                                                   ("mt-transformer", "bam-lc")])
def test_inductor_step_matches_eager(model_name, normalizer, monkeypatch):
    """One training step compiled by inductor (fullgraph) gives eager mode's loss and gradients: the same
    path (the materialised BAM, which is what torch.compile traces) and the same random numbers."""
    monkeypatch.setenv("ATTN_FUSED_BAM", "0")
    model, inputs, loss = build(model_name, normalizer)
    step = training_step(model, loss)
    step(*inputs)  # a GAT prepares its graph
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same BAM noise in both runs
    eager = step(*inputs)
    eager.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    compiled = compile_model(step, fullgraph=True)
    torch.manual_seed(1)
    with torch._inductor.config.patch(fallback_random=True):  # eager's random numbers (inductor has its own)
        out = compiled(*inputs)
    out.backward()
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)
    assert expected.keys() == {name for name, p in model.named_parameters() if p.grad is not None}
    for name, grad in expected.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, rtol=1e-3, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")
