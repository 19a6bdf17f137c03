"""The attention a user has without BAM, for the dense BAM rows of ``benchmarks/block.py``.

Every builder takes the row's :class:`Inputs` and returns a step, one forward and backward pass (the
gradients of q, k and v by ``torch.autograd.grad``), or raises :class:`Unavailable` with the reason:

* rows of equal length (no mask): SDPA with the backend it chooses (``sdpa``), and forced to its flash
  backend (fp16/bf16) or memory-efficient one (fp32), and to cuDNN's (fp16/bf16); on the CPU, ``sdpa``. A
  forced backend costs its ``sdpa_kernel`` context on the host, which shows where a step is bound by the
  host (small rows);
* padded rows: SDPA with the boolean key padding mask; ``torch.nn.attention.varlen.varlen_attn`` on the
  packed real tokens (flash attention's variable-length kernel); SDPA on nested (jagged) tensors; and one
  SDPA call per sequence at its own length. The last three compute the real queries only, where the mask
  (and BAM) computes padded query rows too. The packing is done once, outside the step, as a model that
  keeps its batches packed would;
* the reference Triton flash-attention kernel, ``common.attention.kernels.reference_flash.flash_attention``
  (rows of equal length, CUDA).
"""
from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

Step = Callable[[], None]


class Unavailable(RuntimeError):
    """This baseline cannot run here; the message says why."""


@dataclass
class Inputs:
    """One row's tensors: ``q, k, v, upstream [B, H, L, d]`` (q, k, v require gradients), each sequence's
    length, and the key padding mask ``[B, 1, 1, L]`` (None for rows of equal length)."""

    q: Tensor
    k: Tensor
    v: Tensor
    upstream: Tensor
    lengths: list
    mask: Optional[Tensor]

    @property
    def cuda(self) -> bool:
        return self.q.is_cuda

    @property
    def half(self) -> bool:
        return self.q.dtype in (torch.float16, torch.bfloat16)


def sdpa(x: Inputs, backend: Optional[str] = None) -> Step:
    """SDPA over the padded tensors, with the mask if any, on ``backend`` (a ``SDPBackend`` name) or the one
    PyTorch chooses."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def step():
        with sdpa_kernel(getattr(SDPBackend, backend)) if backend else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(x.q, x.k, x.v, attn_mask=x.mask)
        torch.autograd.grad(out, (x.q, x.k, x.v), x.upstream)
    return step


def varlen(x: Inputs) -> Step:
    """``varlen_attn`` over the real tokens packed as ``[T, H, d]`` (CUDA, fp16/bf16)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as err:
        raise Unavailable(f"this torch has no torch.nn.attention.varlen ({err})") from err
    if not (x.cuda and x.half):
        raise Unavailable("flash attention's variable-length kernel: CUDA, fp16 or bf16")
    q, k, v, upstream = (_packed(t, x.lengths) for t in (x.q, x.k, x.v, x.upstream))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ends = torch.tensor([0] + x.lengths, device=q.device).cumsum(0).to(torch.int32)
    longest = max(x.lengths)

    def step():
        out = varlen_attn(q, k, v, ends, ends, longest, longest)
        torch.autograd.grad(out, (q, k, v), upstream)
    return step


def nested(x: Inputs) -> Step:
    """SDPA over nested (jagged) tensors of the real tokens (CUDA: flash or memory-efficient varlen kernels)."""
    if not x.cuda:
        raise Unavailable("nested-tensor SDPA takes its fused kernels on CUDA only")

    def jagged(t: Tensor) -> Tensor:  # [B, j, H, d]
        return torch.nested.nested_tensor([t[b, :, :n].transpose(0, 1) for b, n in enumerate(x.lengths)],
                                          layout=torch.jagged, requires_grad=True)
    q, k, v = (jagged(t.detach()) for t in (x.q, x.k, x.v))
    upstream = _packed(x.upstream, x.lengths)

    def step():
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        torch.autograd.grad(out.transpose(1, 2).values(), (q, k, v), upstream)
    return step


def per_sequence(x: Inputs) -> Step:
    """One SDPA call per sequence at its own length, without a mask."""
    sequences = [tuple(t[b:b + 1, :, :n].detach().clone().requires_grad_() for t in (x.q, x.k, x.v))
                 for b, n in enumerate(x.lengths)]
    upstream = [x.upstream[b:b + 1, :, :n] for b, n in enumerate(x.lengths)]
    leaves = [t for qkv in sequences for t in qkv]

    def step():
        outs = [F.scaled_dot_product_attention(q, k, v) for q, k, v in sequences]
        torch.autograd.grad(outs, leaves, upstream)
    return step


def reference_flash(x: Inputs) -> Step:
    """``common.attention.kernels.reference_flash.flash_attention(q, k, v)``: rows of equal length, CUDA."""
    if x.mask is not None:
        raise Unavailable("rows of equal length only (no key padding)")
    if not x.cuda:
        raise Unavailable("a Triton kernel: CUDA only")
    try:
        module = importlib.import_module("common.attention.kernels.reference_flash")
    except ImportError as err:
        raise Unavailable(f"common.attention.kernels.reference_flash does not import: {err}") from err
    if not hasattr(module, "flash_attention"):
        raise Unavailable("common.attention.kernels.reference_flash has no flash_attention(q, k, v)")

    def step():
        torch.autograd.grad(module.flash_attention(x.q, x.k, x.v), (x.q, x.k, x.v), x.upstream)
    return step


def candidates(x: Inputs) -> dict:
    """The baselines to measure for ``x``, by name; the fastest becomes the row's baseline. On the CPU, SDPA
    as the project's no-regression check has always measured it (with the mask on padded rows)."""
    if not x.cuda:
        return {"sdpa-mask" if x.mask is not None else "sdpa": lambda: sdpa(x)}
    if x.mask is not None:
        return {"sdpa-mask": lambda: sdpa(x), "varlen": lambda: varlen(x), "nested": lambda: nested(x),
                "per-sequence": lambda: per_sequence(x)}
    if x.half:
        return {"sdpa": lambda: sdpa(x), "sdpa-flash": lambda: sdpa(x, "FLASH_ATTENTION"),
                "sdpa-cudnn": lambda: sdpa(x, "CUDNN_ATTENTION")}
    return {"sdpa": lambda: sdpa(x), "sdpa-efficient": lambda: sdpa(x, "EFFICIENT_ATTENTION")}


def _packed(t: Tensor, lengths: list) -> Tensor:
    """``[B, H, L, d]`` -> the real tokens ``[T, H, d]`` (T = sum of lengths), a new tensor."""
    return torch.cat([t[b, :, :n].transpose(0, 1) for b, n in enumerate(lengths)]).detach()
