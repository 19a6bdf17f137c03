"""The host-side cost of a step, counted without a GPU: every operator dispatched and every Triton kernel
launched, on the ``meta`` device run as a GPU would run it.

On a GPU each dispatched operator costs host time (Python, the dispatcher, an allocation or a kernel
launch), and a step made of many small ones is bound by the host rather than by the GPU. Inside
:func:`meta_gpu` (``tests.host_reads.meta_as_gpu``: the library takes its GPU paths on ``meta`` tensors,
kernel launches are skipped), :class:`Dispatches` counts

* every operator that reaches the dispatcher below autograd (a ``TorchDispatchMode``), forward and
  backward, ``aten`` or custom (``attention_suite::*``). A custom operator is counted, then its real
  implementation runs under the counter, so that what it dispatches (allocations, reshapes) counts too;
* every Triton launch through :func:`common.attention.kernels.launch`.

``F.scaled_dot_product_attention`` is counted as CUDA runs it (:func:`cuda_sdpa`): on ``meta`` PyTorch
would take its math path (a dozen operators), so the counter calls the fused operator that CUDA picks:
flash attention for fp16/bf16 without a mask, the memory-efficient kernel otherwise, after turning a
boolean mask into an additive bias as CUDA's SDPA does. Either is one operator forward and one backward.

Each dispatch is also filed under its source (:attr:`Counts.sources`): the innermost frame of the
library that called it in the forward pass, ``backward: <autograd node>`` in the backward pass.
"""
from __future__ import annotations

import collections
import contextlib
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F
from torch._library.custom_ops import OPDEFS
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .host_reads import meta_as_gpu

ROOT = Path(__file__).resolve().parents[1]
_NOT_LIBRARY = (str(ROOT / "tests"), str(ROOT / "benchmarks"), str(ROOT / ".venv"))

#: the counters entered, innermost last (a launch is counted by the innermost)
_ACTIVE: list = []


@dataclass
class Counts:
    """What one counted block dispatched: operators by name, launches by kernel, and both by source."""

    ops: collections.Counter = field(default_factory=collections.Counter)
    launches: collections.Counter = field(default_factory=collections.Counter)
    sources: collections.Counter = field(default_factory=collections.Counter)
    backward: int = 0  # operators dispatched by the autograd engine

    @property
    def total(self) -> int:
        """Operators dispatched plus kernels launched."""
        return sum(self.ops.values()) + sum(self.launches.values())

    def summary(self) -> dict:
        """A JSON-ready record, most frequent first."""
        return {"total": self.total, "operators": sum(self.ops.values()), "launches": sum(self.launches.values()),
                "forward_operators": sum(self.ops.values()) - self.backward, "backward_operators": self.backward,
                "by_operator": dict(self.ops.most_common()), "by_kernel": dict(self.launches.most_common()),
                "by_file": dict(self._by_file().most_common()), "by_source": dict(self.sources.most_common())}

    def _by_file(self) -> collections.Counter:
        """The sources grouped by file, the backward pass as one."""
        files = collections.Counter()
        for source, n in self.sources.items():
            files["backward" if source.startswith("backward: ") else source.split(":")[0]] += n
        return files


class Dispatches(TorchDispatchMode):
    """Counts (in :attr:`counts`) the operators dispatched and the kernels launched inside it; see the module
    docstring. Enter it inside :func:`meta_gpu`."""

    def __init__(self):
        super().__init__()
        self.counts = Counts()
        self._sdpa = _CudaSdpa()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        self.counts.ops[name] += 1
        source = _source()
        self.counts.backward += source.startswith("backward: ")
        self.counts.sources[source] += 1
        custom = OPDEFS.get(name.split(".")[0])
        if custom is None:
            return func(*args, **kwargs)
        with self:  # the implementation's own operators are dispatched on the host as well
            return custom._init_fn(*args, **kwargs)

    def launched(self, kernel) -> None:
        name = getattr(getattr(kernel, "fn", kernel), "__name__", repr(kernel))
        self.counts.launches[name] += 1
        self.counts.sources[_source()] += 1

    def __enter__(self):
        _ACTIVE.append(self)
        self._sdpa.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        super().__exit__(*exc)
        return self._sdpa.__exit__(*exc)


def _source() -> str:
    """``backward: <autograd node>`` in the backward pass, else ``path:function`` of the innermost frame of the
    library (not torch, not tests or benchmarks)."""
    node = torch._C._current_autograd_node()
    if node is not None:
        return f"backward: {node.name()}"
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(str(ROOT)) and not path.startswith(_NOT_LIBRARY) and "site-packages" not in path:
            return f"{Path(path).relative_to(ROOT)}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "the step itself"


class _CudaSdpa(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` of ``meta`` tensors as :func:`cuda_sdpa`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and args[0].device.type == "meta":
            return cuda_sdpa(*args, **kwargs)
        return func(*args, **kwargs)


def cuda_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` by the fused operator CUDA's dispatcher picks for these inputs
    (``[B, H, L, d]``): flash attention for fp16/bf16 without a mask, else the memory-efficient kernel, whose
    boolean mask becomes an additive bias (``where``), padded to a multiple of 8 keys and expanded, as in
    ``aten/src/ATen/native/transformers/attention.cpp``. Other inputs keep PyTorch's own path."""
    if query.dim() != 4 or enable_gqa:
        return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                              enable_gqa=enable_gqa)
    if attn_mask is None and query.dtype in (torch.float16, torch.bfloat16):
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                                  scale=scale)[0]
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:
        bias = torch.where(bias, 0.0, torch.scalar_tensor(-math.inf, dtype=query.dtype, device=bias.device))
    if bias is not None:
        keys = bias.shape[-1]
        if any(s % 8 for s in bias.stride()[:-1]):
            bias = F.pad(bias, (0, -keys % 8))[..., :keys]
        bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, bias, grad, dropout_p,
                                                                  is_causal, scale=scale)[0]


@contextlib.contextmanager
def meta_gpu(monkeypatch) -> Iterator[None]:
    """:func:`tests.host_reads.meta_as_gpu`, with every kernel launch counted by the innermost
    :class:`Dispatches`."""
    from common.attention import kernels

    with meta_as_gpu(monkeypatch):
        skipped = kernels.launch

        def launch(family, kernel, grid, *args, **kwargs):
            if _ACTIVE:
                _ACTIVE[-1].launched(kernel)
        for module in list(sys.modules.values()):
            if getattr(module, "launch", None) is skipped and (module.__name__ or "").startswith("common.attention"):
                monkeypatch.setattr(module, "launch", launch)
        yield


def count(step) -> Counts:
    """The dispatches of ``step()`` (inside :func:`meta_gpu`) in the steady state of a training loop: a first call
    runs uncounted (under a counter of its own, so that the custom operators run their implementations), since it
    also compiles and loads kernels once per process."""
    with Dispatches():
        step()
    counter = Dispatches()
    with counter:
        step()
    return counter.counts


def attend_call(normalizer: str, *, batch: int = 2, heads: int = 8, length: int = 1024, head_dim: int = 64,
                dtype=torch.bfloat16, mask: bool = False) -> Counts:
    """One ``Attend`` call in training mode, forward and backward (gradients of q, k, v and the module's
    parameters by ``torch.autograd.grad``, so that no ``.grad`` accumulation is counted), with the KL collected
    and added to the objective when the normalizer adds one. ``mask``: a key padding mask."""
    from common import attention
    from common.attention.blocks import Attend

    def meta(*shape, dtype=dtype, grad=False):
        return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=grad)
    q, k, v = (meta(batch, heads, length, head_dim, grad=True) for _ in range(3))
    upstream, one = meta(batch, heads, length, head_dim), meta((), dtype=torch.float32)
    padding = meta(batch, 1, 1, length, dtype=torch.bool) if mask else None
    attend = Attend(heads, head_dim, {"normalizer": normalizer}).to("meta").train()
    inputs = [q, k, v, *attend.parameters()]

    def step():
        with attention.aux_losses() as aux:
            out, _ = attend(q, k, v, mask=padding)
        outputs, grads = [out], [upstream]
        if len(aux):
            outputs.append(aux.total())
            grads.append(one)
        torch.autograd.grad(outputs, inputs, grads, allow_unused=True)
    return count(step)


def mcan_step(normalizer: str, *, batch: int = 64, question_len: int = 14, regions: int = 100) -> Counts:
    """One MCAN-small training forward and backward as ``benchmarks/vqa.py`` runs it (summed BCE + 0.01 KL;
    the optimizer's update is left out), on padded questions and regions."""
    from common import attention
    from vqa.mcan import MCAN, MCANConfig

    vocab, answers = 20_000, 3129
    with torch.device("meta"):
        model = MCAN(MCANConfig(vocab_size=vocab, num_answers=answers, attention=normalizer)).train()
        tokens = torch.zeros(batch, question_len, dtype=torch.long)
        q_mask = torch.ones(batch, question_len, dtype=torch.bool)
        features = torch.empty(batch, regions, 2048)
        r_mask = torch.ones(batch, regions, dtype=torch.bool)
        target = torch.empty(batch, answers)

    def step():
        with attention.aux_losses() as aux:
            logits = model(tokens, q_mask, features, r_mask)
        loss = F.binary_cross_entropy_with_logits(logits.float(), target, reduction="sum") + 0.01 * aux.total()
        loss.backward()
    return count(step)
