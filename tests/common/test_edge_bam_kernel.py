"""The fused edge-wise BAM kernels against the PyTorch path: the Triton kernels (in Triton's
interpreter) and the C kernels of the CPU.

Graphs are small (the interpreter runs one Python loop per target node) but hold every kind
of segment: empty (isolated nodes), one edge, a few edges and a degree-1000 hub.
"""
import math

import pytest
import torch
from torch_geometric.index import index2ptr

from common import attention
from common.attention.groups import EdgeGroups
from common.attention.kernels import cpu_edge_bam, triton_available

BAM_VARIANTS = ["bam-wf", "bam-wc", "bam-lf", "bam-lc"]
HEADS, KEY_DIM = 3, 4


def graph(degrees):
    """Targets sorted, their CSR pointer and random sources, for the given in-degrees."""
    degrees = torch.tensor(degrees)
    index = torch.repeat_interleave(torch.arange(degrees.numel()), degrees)
    src = torch.randint(0, degrees.numel(), (index.numel(),), generator=torch.Generator().manual_seed(1))
    return index, index2ptr(index, degrees.numel()), src


SMALL = [0, 1, 3, 0, 7, 1, 2, 0, 5]  # isolated nodes, one-edge segments, small ones
HUB = [1, 0, 1000, 2]  # a degree-1000 hub: many tiles in one segment
#: The environment of each path: the PyTorch reference, the Triton kernels, the C kernels.
PATHS = {"pytorch": {"ATTN_TRITON": "0", "ATTN_CPU_KERNELS": "0"}, "triton": {"ATTN_TRITON": "1"},
         "cpu": {"ATTN_TRITON": "0", "ATTN_CPU_KERNELS": "1"}}
#: The fused kernels, each where it runs here.
KERNELS = [pytest.param("triton", marks=pytest.mark.skipif(not triton_available(), reason="needs triton")),
           pytest.param("cpu", marks=pytest.mark.skipif(not cpu_edge_bam.takes(torch.zeros(1, 1)),
                                                        reason="the C kernels do not build here"))]


def use(path, monkeypatch):
    for name, value in PATHS[path].items():
        monkeypatch.setenv(name, value)


def run(bam, scores, keys, groups, src, noise, grad_w, path, monkeypatch):
    """Weights, KL and gradients (scores, keys, prior network) of one path."""
    use(path, monkeypatch)
    scores = scores.clone().requires_grad_()
    keys = keys.clone().requires_grad_()
    bam.zero_grad(set_to_none=True)
    with attention.aux_losses() as aux:
        weights = bam.normalize(scores, groups, keys=keys, key_index=src, noise=noise)
    kl = aux.total()
    ((weights * grad_w).sum() + 3.0 * kl).backward()
    params = [torch.zeros(()) if p.grad is None else p.grad for p in bam.parameters()]
    return [weights.detach(), kl.detach(), scores.grad, torch.zeros(()) if keys.grad is None else keys.grad, *params]


def assert_paths_agree(name, degrees, dtype, monkeypatch, device="cpu", kernel="triton", **options):
    """The PyTorch path and the fused ``kernel`` on the same scores, keys and noise give the same weights, KL
    and gradients. On the hub in float32 the reference is the PyTorch path in float64: there the key and
    prior gradients sum a thousand float32 terms, whose rounding the float32 PyTorch path (about 1e-5 of the
    largest value) shows more than the kernels do, so each kernel is held to float32 rounding of the exact
    values (1e-6 of the largest)."""
    torch.manual_seed(0)
    index, ptr, src = (t.to(device) for t in graph(degrees))
    bam = attention.build(name, num_heads=HEADS, key_dim=KEY_DIM, **options).to(device, dtype).train()
    scores = torch.randn(index.numel(), HEADS, dtype=dtype, device=device) * 3
    keys = torch.randn(len(degrees), HEADS, KEY_DIM, dtype=dtype, device=device)
    noise, grad_w = torch.randn_like(scores), torch.randn_like(scores)
    groups = EdgeGroups(index, ptr=ptr)
    exact = dtype == torch.float32 and max(degrees) >= 1000
    reference_dtype = torch.float64 if exact else dtype
    torch_path = run(bam.to(reference_dtype), *(x.to(reference_dtype) for x in (scores, keys)), groups, src,
                     *(x.to(reference_dtype) for x in (noise, grad_w)), "pytorch", monkeypatch)
    fused = run(bam.to(dtype), scores, keys, groups, src, noise, grad_w, kernel, monkeypatch)
    # float32 on small graphs: the prior's output-bias gradient, a sum over every node and head, is zero
    # up to rounding with prior_scope="all" (about 1e-5 either way)
    atol = 1e-6 * max(float(t.abs().max()) for t in torch_path) if exact else 3e-5 if dtype == torch.float32 else 1e-5
    for ref, got in zip(torch_path, fused):
        torch.testing.assert_close(got, ref.to(got.dtype), rtol=1e-5, atol=atol)
    assert fused[1].abs() > 1e-3  # the KL term is there


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", BAM_VARIANTS)
@pytest.mark.parametrize("degrees,dtype", [(SMALL, torch.float32), (HUB, torch.float64), (HUB, torch.float32)],
                         ids=["small", "hub", "hub-float32"])
def test_explicit_noise_gives_the_pytorch_weights_kl_and_gradients(kernel, name, degrees, dtype, monkeypatch):
    """The C kernels compute in float32 (float64 scores take the PyTorch path); Triton's in float64 too."""
    if (kernel, dtype) == ("cpu", torch.float64):
        pytest.skip("the C kernels take float32 scores only")
    assert_paths_agree(name, degrees, dtype, monkeypatch, kernel=kernel)


@pytest.mark.skipif(not cpu_edge_bam.takes(torch.zeros(1, 1)), reason="the C kernels do not build here")
@pytest.mark.parametrize("name", BAM_VARIANTS)
def test_the_cpu_kernels_visit_many_nodes_in_spans_and_hubs_in_blocks(name, monkeypatch):
    """300 nodes of up to 11 edges (several ranges of nodes, spans of whole segments across them) and two
    hubs longer than a span (visited block by block), as on a GPU (tests/gpu/test_edge_bam_cuda.py)."""
    degrees = torch.randint(0, 12, (300,), generator=torch.Generator().manual_seed(0))
    degrees[::50], degrees[1::50] = 0, 1
    degrees[7], degrees[100] = 1000, 3000
    assert_paths_agree(name, degrees.tolist(), torch.float32, monkeypatch, kernel="cpu")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ["bam-wc", "bam-lc"])
def test_a_prior_over_every_key_gives_the_pytorch_path_too(kernel, name, monkeypatch):
    """``prior_scope="all"`` (the official GAT code's prior): ``log pi`` normalised over all nodes."""
    assert_paths_agree(name, SMALL, torch.float32, monkeypatch, kernel=kernel, prior_scope="all")


def test_fused_path_is_taken_only_when_asked(monkeypatch):
    from common.attention import edge_bam
    calls = []
    monkeypatch.setattr(edge_bam, "edge_bam", lambda *a, **k: calls.append(1) or (a[1], None))
    index, ptr, _ = graph(SMALL)
    bam = attention.build("bam-wf").train()
    scores = torch.randn(index.numel(), HEADS)
    cpu_kernels = cpu_edge_bam.takes(scores)
    cases = [({"ATTN_TRITON": "0", "ATTN_CPU_KERNELS": "0"}, 0), ({"ATTN_TRITON": "auto", "ATTN_CPU_KERNELS": "0"}, 0),
             ({"ATTN_TRITON": "1"}, int(triton_available())), ({"ATTN_TRITON": "0", "ATTN_CPU_KERNELS": "1"},
                                                                int(cpu_kernels))]  # auto: Triton on CUDA only
    for environment, expected in cases:
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        calls.clear()
        bam(scores, index=index, ptr=ptr)
        assert len(calls) == expected, environment
    calls.clear()
    bam(scores, index=index)  # without a CSR pointer: the PyTorch path
    bam(scores.double(), index=index, ptr=ptr)  # the C kernels take float32 only
    bam(scores.unsqueeze(-1), index=index, ptr=ptr)  # neither takes scores with more dimensions
    bam(torch.randn(index.numel(), cpu_edge_bam.MAX_HEADS + 1), index=index, ptr=ptr)  # nor C, more heads
    assert not calls


@pytest.mark.skipif(not cpu_edge_bam.takes(torch.zeros(1, 1)), reason="the C kernels do not build here")
def test_the_cpu_sample_does_not_depend_on_the_threads(monkeypatch):
    """Each entry's noise is keyed by the entry and each node's sums stay in one thread: one thread and two
    give the same weights, KL and gradients (90,000 entries: two threads' worth, cpu_bam.threads_for)."""
    from common.attention.edge_bam import Options, edge_bam_backward_op, edge_bam_op
    use("cpu", monkeypatch)
    _, ptr, _ = graph([100] * 300)
    bam = attention.build("bam-wc", num_heads=HEADS, key_dim=KEY_DIM).train()
    scores, prior = torch.randn(int(ptr[-1]), HEADS), torch.randn(int(ptr[-1]), HEADS)
    options, seed = Options.of(bam, sampling=True, with_kl=True, given_noise=False), torch.tensor([11])
    threads, out = torch.get_num_threads(), []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            weights, kl, lse = edge_bam_op(scores, prior, None, ptr, seed, *options)
            grads = edge_bam_backward_op(scores, prior, None, ptr, seed, lse, scores, torch.ones(()), *options)
            out.append((weights, kl, lse, *grads))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*out):
        assert torch.equal(a, b)


def test_without_a_compiler_the_pytorch_path_runs_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("ATTN_KERNEL_CACHE", str(tmp_path / "cache"))
    use("cpu", monkeypatch)
    cpu_edge_bam._library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="edge-wise BAM: the fused CPU kernels could not be built"):
            assert not cpu_edge_bam.takes(torch.zeros(1, 1))
        bam, index, ptr, src, scores, keys = small_case("bam-wc", training=True)
        with attention.aux_losses() as aux:
            weights = bam(scores, index=index, ptr=ptr, keys=keys, key_index=src)
        assert torch.isfinite(weights).all() and aux.total() > 0
    finally:
        cpu_edge_bam._library.cache_clear()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name,variance", [("bam-wf", math.pi**2 / 6), ("bam-lf", 1.0)])
def test_philox_noise_has_the_posterior_law_and_is_redrawn_in_backward(kernel, name, variance, monkeypatch):
    """The kernel's own noise, read back from its weights (``log w - s``, up to a constant per
    segment), has the variance of ``log(-log u)`` (Gumbel: pi^2/6) or of ``eps``; the same seed
    repeats it, and the backward regenerates exactly that noise."""
    use(kernel, monkeypatch)
    index, ptr, src = graph(HUB)
    bam = attention.build(name).train()
    dtype = torch.float64 if kernel == "triton" else torch.float32
    scores = torch.randn(index.numel(), 2, dtype=dtype)
    groups = EdgeGroups(index, ptr=ptr)

    def sample():
        s = scores.clone().requires_grad_()
        with attention.aux_losses() as aux:
            weights = bam(s, index=index, ptr=ptr)
        ((weights * grad_w).sum() + aux.total()).backward()
        return weights.detach(), s.grad

    grad_w = torch.randn_like(scores)
    torch.manual_seed(5)
    weights, grad = sample()
    torch.manual_seed(5)
    again, _ = sample()
    torch.testing.assert_close(again, weights, rtol=0, atol=0)
    noise = (weights.log() - scores) / bam.noise_scale
    hub = noise[ptr[2]:ptr[3]]
    assert torch.allclose(hub.var(0), torch.full((2,), variance, dtype=dtype), rtol=0.15)
    assert not torch.allclose(hub[:, 0], hub[:, 1])  # every head draws its own noise
    use("pytorch", monkeypatch)
    s = scores.clone().requires_grad_()
    with attention.aux_losses() as aux:
        reference = bam.normalize(s, groups, noise=noise)
    ((reference * grad_w).sum() + aux.total()).backward()
    tolerance = {} if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-6)  # the noise read back, in float32
    torch.testing.assert_close(reference.detach(), weights, **tolerance)
    torch.testing.assert_close(s.grad, grad, **tolerance)


def small_case(name, training):
    """A BAM normalizer, the SMALL graph, scores and per-node keys."""
    torch.manual_seed(0)
    index, ptr, src = graph(SMALL)
    bam = attention.build(name, num_heads=HEADS, key_dim=KEY_DIM).train(training)
    return bam, index, ptr, src, torch.randn(index.numel(), HEADS), torch.randn(len(SMALL), HEADS, KEY_DIM)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ["bam-wc", "bam-lf"])
def test_eval_mode_gives_softmax_and_the_same_kl(kernel, name, monkeypatch):
    bam, index, ptr, src, scores, keys = small_case(name, training=False)
    out = {}
    for path in ("pytorch", kernel):
        use(path, monkeypatch)
        with attention.aux_losses() as aux:
            out[path] = bam(scores, index=index, ptr=ptr, keys=keys, key_index=src), aux.total()
    torch.testing.assert_close(out[kernel][0], torch_geometric_softmax(scores, index))
    torch.testing.assert_close(out[kernel][1], out["pytorch"][1])


def torch_geometric_softmax(scores, index):
    from torch_geometric.utils import softmax
    return softmax(scores, index)


@pytest.mark.parametrize("kernel", KERNELS)
def test_extreme_scores_stay_finite(kernel, monkeypatch):
    """Scores spanning far more than the float32 exponent range: weights and gradients finite,
    weights summing to one per segment (the segment log-sum-exps are exact)."""
    use(kernel, monkeypatch)
    index, ptr, src = graph(SMALL)
    bam = attention.build("bam-wc", num_heads=HEADS, key_dim=KEY_DIM).train()
    scores = (torch.randn(index.numel(), HEADS) * 1e4).requires_grad_()
    keys = torch.randn(len(SMALL), HEADS, KEY_DIM) * 1e3
    with attention.aux_losses() as aux:
        weights = bam(scores, index=index, ptr=ptr, keys=keys, key_index=src)
    (weights.square().sum() + aux.total()).backward()
    assert torch.isfinite(weights).all() and torch.isfinite(aux.total()) and torch.isfinite(scores.grad).all()
    sums = torch.zeros(len(SMALL), HEADS).index_add_(0, index, weights.detach())
    torch.testing.assert_close(sums[ptr.diff() > 0], torch.ones(int((ptr.diff() > 0).sum()), HEADS))


@pytest.mark.parametrize("kernel", KERNELS)
def test_gatconv_runs_the_kernels_and_matches_the_pytorch_path_in_eval(kernel, monkeypatch):
    from graphattn import GATConv
    torch.manual_seed(0)
    index, _, src = graph(SMALL)
    edge_index = torch.stack([src, index])
    x = torch.randn(len(SMALL), 5)
    conv = GATConv(5, KEY_DIM, heads=HEADS, attention="bam-wc").eval()
    out = {}
    for path in ("pytorch", kernel):
        use(path, monkeypatch)
        conv.zero_grad(set_to_none=True)
        with attention.aux_losses() as aux:
            y = conv(x, edge_index.clone())
        (y.square().sum() + aux.total()).backward()
        out[path] = [y.detach(), aux.total().detach()] + [p.grad for p in conv.parameters() if p.grad is not None]
    for ref, got in zip(out["pytorch"], out[kernel]):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ["bam-wc", "bam-lf"])
def test_without_a_kl_collector_the_kernels_only_sample(kernel, name, monkeypatch):
    bam, index, ptr, src, scores, keys = small_case(name, training=True)
    noise, grad_w = torch.randn_like(scores), torch.randn_like(scores)
    out = {}
    for path in ("pytorch", kernel):
        use(path, monkeypatch)
        s = scores.clone().requires_grad_()
        weights = bam.normalize(s, EdgeGroups(index, ptr=ptr), keys=keys, key_index=src, noise=noise)
        (weights * grad_w).sum().backward()
        out[path] = weights.detach(), s.grad
    for ref, got in zip(out["pytorch"], out[kernel]):
        torch.testing.assert_close(got, ref)
    assert all(p.grad is None for p in bam.parameters())  # no prior without a KL


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ["bam-wc", "bam-lf"])
def test_the_operators_pass_opcheck(kernel, name, monkeypatch):
    """``torch.library.opcheck`` of both operators: schema, autograd registration, fake implementations and
    AOT dispatch with dynamic shapes, on each kind of kernel."""
    from common.attention.edge_bam import Options, edge_bam_backward_op, edge_bam_op
    use(kernel, monkeypatch)
    bam, index, ptr, _, scores, _ = small_case(name, training=True)
    options = Options.of(bam, sampling=True, with_kl=True, given_noise=False)
    prior = torch.randn_like(scores).requires_grad_() if options.prior else None
    seed = torch.tensor([5])
    torch.library.opcheck(edge_bam_op, (scores.requires_grad_(), prior, None, ptr, seed, *options))
    detached = (scores.detach(), None if prior is None else prior.detach(), None, ptr, seed)
    _, _, lse = edge_bam_op(*detached, *options)
    torch.library.opcheck(edge_bam_backward_op, (*detached, lse, torch.randn_like(scores), torch.randn(()), *options))


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_graph_without_nodes_launches_nothing(kernel, monkeypatch):
    use(kernel, monkeypatch)
    bam = attention.build("bam-wc", num_heads=HEADS, key_dim=KEY_DIM).train()
    scores = torch.randn(0, HEADS, requires_grad=True)
    index = torch.zeros(0, dtype=torch.long)
    with attention.aux_losses() as aux:
        weights = bam(scores, index=index, ptr=torch.zeros(1, dtype=torch.long), keys=torch.randn(0, HEADS, KEY_DIM),
                      key_index=index)
    (weights.sum() + aux.total()).backward()
    assert weights.shape == (0, HEADS) and scores.grad.shape == (0, HEADS) and aux.total() == 0


@pytest.mark.parametrize("name,most", [("bam-wf", 14), ("bam-wc", 49)])
def test_a_training_step_makes_few_host_dispatches(name, most, monkeypatch):
    """On a GPU (``meta`` standing in) the normalizer's forward and backward cost one kernel launch each and a
    few allocations, besides the contextual prior's network and its gather to the edges: no float glue, no
    copies. Counted with every operator call, views and the custom operators included (before they were
    operators, bam-wf made 18 and bam-wc 57: the mean KL's sum, division and addition, their gradients and a
    copy of the expanded one, the dtype promotions, a zero fill)."""
    from tests.dispatch_counts import Dispatches, meta_gpu
    monkeypatch.delenv("ATTN_TRITON", raising=False)
    with meta_gpu(monkeypatch):
        bam = attention.build(name, num_heads=HEADS, key_dim=KEY_DIM).to("meta").train()
        scores = torch.empty(40, HEADS, device="meta", requires_grad=True)
        keys = torch.empty(10, HEADS, KEY_DIM, device="meta", requires_grad=True)
        index = torch.empty(40, dtype=torch.long, device="meta")
        ptr = torch.empty(11, dtype=torch.long, device="meta")
        counter = Dispatches()
        with counter, attention.aux_losses() as aux:
            weights = bam(scores, index=index, ptr=ptr, keys=keys, key_index=index)
        (_, kl), = aux.terms
        upstream = [torch.empty_like(weights), torch.empty_like(kl)]
        with counter:
            torch.autograd.backward([weights, kl], upstream)
    counts = counter.counts
    assert counts.launches == {"_edge_bam_fwd": 1, "_edge_bam_bwd": 1}
    assert not {"aten::clone", "aten::copy_", "aten::_to_copy"} & counts.ops.keys(), counts.ops
    assert counts.total <= most, counts.summary()
