"""Edge-wise BAM on the CPU (``cpu/edge_bam.c``): the two passes of the Triton kernels of
:mod:`common.attention.kernels.edge_bam` as C loops over the target nodes' segments (OpenMP over
``torch.get_num_threads()`` threads at most), float32, compiled on first use as the dense CPU kernels are
(:func:`common.attention.kernels.cpu_bam.build`). A pass visits a segment's entries block by block,
in the cache, where the PyTorch path makes some thirty passes over memory.

The noise of entry ``i = edge * heads + head`` is word ``i % 4`` of Philox4x32-10 at counter
``(i / 4, i >> 34, 0, 0)`` keyed by the call's seed, so it does not depend on the threads.
:func:`forward` and :func:`backward` take the arguments of the custom operators of
:mod:`common.attention.edge_bam`.
"""
from __future__ import annotations

import ctypes
import functools
import os
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import cpu_bam

#: Most heads a call may have (the kernels keep per-head sums on the stack); more take the PyTorch path.
MAX_HEADS = 64


@functools.lru_cache(maxsize=None)
def _library() -> Optional[ctypes.CDLL]:
    lib = cpu_bam.build("edge_bam", "edge-wise BAM")
    if lib is None:
        return None
    ptr, i64, i32, u64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_uint64, ctypes.c_float
    lib.edge_bam_forward.argtypes = [ptr] * 4 + [i64, i32] + [ptr] * 3 + [i32, u64] + [i32] * 4 + [f32] * 6
    lib.edge_bam_backward.argtypes = [ptr] * 4 + [i64, i32] + [ptr] * 5 + [i32, u64] + [i32] * 5 + [f32] * 5
    lib.edge_bam_forward.restype = lib.edge_bam_backward.restype = None
    return lib


@torch.compiler.assume_constant_result
def _built() -> bool:
    """Whether the kernels build here (``torch.compile`` takes the answer as a constant, found once)."""
    return _library() is not None


def takes(scores: Tensor) -> bool:
    """Whether the C kernels take edge-wise ``scores``: float32 on the CPU, at most :data:`MAX_HEADS` heads,
    ``ATTN_CPU_KERNELS`` not ``0`` (read at each call) and the kernels built here."""
    return (scores.device.type == "cpu" and scores.dtype == torch.float32 and scores.dim() <= 2
            and (scores.dim() < 2 or scores.shape[1] <= MAX_HEADS) and os.environ.get("ATTN_CPU_KERNELS", "1") != "0"
            and _built())


def _address(x: Optional[Tensor]) -> Optional[int]:
    if x is None:
        return None
    if x.dtype not in (torch.float32, torch.int64) or x.device.type != "cpu" or not x.is_contiguous():
        raise ValueError(f"the CPU edge-wise BAM kernels take contiguous float32 (and int64) CPU tensors, got "
                         f"{x.dtype} {x.device} {'contiguous' if x.is_contiguous() else 'strided'}")
    return x.data_ptr()


def forward(scores: Tensor, prior_logits: Optional[Tensor], noise: Optional[Tensor], ptr: Tensor, seed: Tensor,
            noise_kind: int, scale: float, prior: bool, prior_normalized: bool, kl: int, c0: float, c1: float,
            c2: float, const: float, centred: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """``(weights, mean KL, lse)``: the forward pass (see :func:`common.attention.edge_bam.edge_bam_op`)."""
    nodes, heads, ptr = ptr.numel() - 1, scores.shape[1], ptr.long()
    weights = torch.empty_like(scores)
    lse = scores.new_empty(nodes, 3, heads)
    shares = scores.new_empty(nodes)
    _library().edge_bam_forward(
        *(_address(x) for x in (scores, prior_logits, noise, ptr)), nodes, heads,
        *(_address(x) for x in (weights, lse, shares)), cpu_bam.threads_for(scores.numel()), int(seed), noise_kind,
        prior, prior_normalized, kl, scale, c0, c1, c2, const, 1.0 / max(scores.numel(), 1))
    return weights, shares.sum(), lse


def backward(scores: Tensor, prior_logits: Optional[Tensor], noise: Optional[Tensor], ptr: Tensor, seed: Tensor,
             lse: Tensor, grad_weights: Optional[Tensor], grad_kl: Optional[Tensor], noise_kind: int, scale: float,
             prior: bool, prior_normalized: bool, kl: int, c0: float, c1: float, c2: float, const: float,
             centred: bool) -> Tuple[Tensor, Tensor]:
    """``(d scores, d prior logits)``: the backward pass (see
    :func:`common.attention.edge_bam.edge_bam_backward_op`)."""
    nodes, heads, ptr = ptr.numel() - 1, scores.shape[1], ptr.long()
    d_scores = torch.empty_like(scores)
    d_prior = scores.new_empty(0) if prior_logits is None else torch.empty_like(prior_logits)
    grad_weights = None if grad_weights is None else grad_weights.contiguous()  # (held until the call returns)
    _library().edge_bam_backward(
        *(_address(x) for x in (scores, prior_logits, noise, ptr)), nodes, heads,
        *(_address(x) for x in (lse, grad_weights, grad_kl, d_scores, None if prior_logits is None else d_prior)),
        cpu_bam.threads_for(scores.numel()), int(seed), noise_kind, prior, prior_normalized, kl, centred, scale, c0,
        c1, c2, 1.0 / max(scores.numel(), 1))
    return d_scores, d_prior
