"""Dense BAM attention on a GPU as one custom operator pair, ``attention_suite::bam_attention`` and its backward.

A BAM call of :class:`~common.attention.blocks.Attend` is the attention, its noise, dropout, the
contextual prior network and the KL (Fan et al., 2020, Sec. 3): here all of it is one operator
(registered with ``torch.library``: a fake implementation for ``torch.compile`` and FakeTensor tracing,
and its gradient) whose implementation allocates its outputs and launches two Triton kernels
forward (:mod:`common.attention.kernels.dense_bam`, :mod:`common.attention.kernels.dense_bam_kl`) and two
backward, with no chain of small PyTorch operators around them: a training call costs a handful of
host dispatches, as softmax attention does.

The operator takes ``q [B, H, Q, d]``, ``k [B, H, K, d]``, ``v [B, H, K, dv]`` in any strides with a
contiguous last dimension, a boolean key mask broadcastable to ``[B, H, 1, K]`` (read through its
strides, never expanded or copied), a seed tensor, and the prior network's four weights; it returns the
output (laid out like ``q`` when ``dv == d``, so that merging the heads of a ``[B, L, H, d]`` view
is free), the layer's KL (a float32 scalar, 0 without one) and a float32 statistics buffer (the
rows' ``LSE_i`` and ``S2_i`` first, for a KL computed outside: a causal mask's).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .kernels import dense_bam as attention_kernels
from .kernels import dense_bam_kl as kl_kernels
from .kernels import compiling_only, interpreting


def attention_forward(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], seed: Tensor, w1: Optional[Tensor],
                  b1: Optional[Tensor], w2: Optional[Tensor], b2: Optional[Tensor], causal: bool, scale: float,
                  noise_kind: int, noise_scale: float, dropout: float, kl_kind: int, kl_constants: list[float],
                  scope_all: bool, activation: int, want_lse: bool, want_sq: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(out, kl, stats)`` of BAM attention: ``dropout(softmax(scale q k^T + noise_scale n)) v`` with the
    noise ``n`` of ``noise_kind`` drawn from ``seed``, and the KL of ``kl_kind`` (:mod:`~.kernels.dense_bam_kl`)
    of the prior ``(w1, b1, w2, b2)``; ``key_mask`` broadcastable to ``[B, H, 1, K]``, or None."""
    B, H, n_q, _ = q.shape
    interpret = interpreting()
    out = torch.empty_like(q) if v.shape[-1] == q.shape[-1] else q.new_empty(B, H, n_q, v.shape[-1])
    stats = torch.zeros(kl_kernels.stats_size(B * H, n_q, q.shape[-1]), device=q.device, dtype=torch.float32)
    kl = torch.empty((), device=q.device, dtype=torch.float32) if kl_kind else q.new_zeros((), dtype=torch.float32)
    mask = key_mask
    want_lse, want_sq = want_lse or bool(kl_kind), want_sq or kl_kind in kl_kernels.LOGNORMAL
    attention_kernels.forward(q, k, v, mask, seed, causal, scale, noise_kind, noise_scale, dropout, want_lse, want_sq,
                              interpret, out, stats)
    prior = [w1, b1, w2, b2] if w1 is not None else []
    if kl_kind:
        kl_kernels.kl_forward(q, k, mask, stats, kl, prior, kl_kind, kl_constants, scope_all, activation, scale)
    key = ("bam_attention", q.dtype, q.shape[-1], v.shape[-1], mask is None, causal, noise_kind, dropout > 0, kl_kind,
           want_lse, want_sq, scope_all, activation, torch.backends.cuda.matmul.allow_tf32)
    with compiling_only(key) as first:  # a backward kernel that cannot run here fails now, while we can fall back
        if first:  # stand-ins of the backward's buffers (nothing is written)
            kl_kernels.kl_backward(q, k, mask, out, out, stats, None, kl, stats, stats, k, prior, [stats] * len(prior),
                                   kl_kind, kl_constants, scope_all, activation, scale)
            attention_kernels.backward(q, k, v, mask, seed, out, stats, stats, stats, k, v, causal, scale, noise_kind,
                                       noise_scale, dropout, want_lse, want_sq, bool(kl_kind), interpret)
    return out, kl, stats


#: The operator (a plain call of :func:`attention_forward` where it runs, its fake implementation under tracing).
bam_attention = torch.library.custom_op("attention_suite::bam_attention", attention_forward, mutates_args=())


@bam_attention.register_fake
def _(q, k, v, key_mask, seed, w1, b1, w2, b2, causal, scale, noise_kind, noise_scale, dropout, kl_kind, kl_constants,
      scope_all, activation, want_lse, want_sq):
    B, H, n_q, _ = q.shape
    out = torch.empty_like(q) if v.shape[-1] == q.shape[-1] else q.new_empty(B, H, n_q, v.shape[-1])
    stats = q.new_empty(kl_kernels.stats_size(B * H, n_q, q.shape[-1]), dtype=torch.float32)
    return out, q.new_empty((), dtype=torch.float32), stats


def attention_backward(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], seed: Tensor,
                           w1: Optional[Tensor], b1: Optional[Tensor], w2: Optional[Tensor], b2: Optional[Tensor],
                           out: Tensor, stats: Tensor, d_out: Tensor, d_kl: Optional[Tensor],
                           d_stats: Optional[Tensor], causal: bool, scale: float, noise_kind: int,
                           noise_scale: float, dropout: float, kl_kind: int, kl_constants: list[float],
                           scope_all: bool, activation: int, want_lse: bool, want_sq: bool) -> list[Tensor]:
    """``[dq, dk, dv]`` of :func:`attention_forward`, followed by the prior network's four gradients when it has a
    contextual prior and its KL has a gradient."""
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    interpret = interpreting()
    mask = key_mask
    d_out = d_out if d_out.stride(-1) == 1 else d_out.contiguous()
    prior = [w1, b1, w2, b2] if w1 is not None else []
    kl_kind = kl_kind if d_kl is not None else kl_kernels.KL_NONE
    grads = torch.empty(4, B * H, n_q, device=q.device, dtype=torch.float32)
    dq = torch.empty(B, H, n_q, d, device=q.device, dtype=torch.float32)
    dk = k.new_empty(B, H, n_k, d)
    dv = v.new_empty(B, H, n_k, v.shape[-1])
    d_prior = [torch.zeros_like(p, dtype=torch.float32) for p in prior] if kl_kind and prior else []
    kl_kernels.kl_backward(q, k, mask, out, d_out, stats, d_stats, d_kl, grads, dq, dk, prior, d_prior, kl_kind,
                           kl_constants, scope_all, activation, scale)
    want_lse, want_sq = want_lse or bool(kl_kind), want_sq or kl_kind in kl_kernels.LOGNORMAL
    attention_kernels.backward(q, k, v, mask, seed, d_out, stats, grads, dq, dk, dv, causal, scale, noise_kind,
                               noise_scale, dropout, want_lse, want_sq, bool(kl_kind), interpret)
    dq = dq if q.dtype == torch.float32 else dq.to(q.dtype)
    return [dq, dk, dv] + [g if g.dtype == p.dtype else g.to(p.dtype) for g, p in zip(d_prior, prior)]


bam_attention_backward = torch.library.custom_op("attention_suite::bam_attention_backward", attention_backward,
                                                 mutates_args=())


@bam_attention_backward.register_fake
def _(q, k, v, key_mask, seed, w1, b1, w2, b2, out, stats, d_out, d_kl, d_stats, causal, scale, noise_kind,
      noise_scale, dropout, kl_kind, kl_constants, scope_all, activation, want_lse, want_sq):
    prior = [w1, b1, w2, b2] if w1 is not None and kl_kind and d_kl is not None else []
    return [q.new_empty(q.shape), torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format)] + [torch.empty_like(p) for p in prior]


def _setup(ctx, inputs, output):
    q, k, v, key_mask, seed, w1, b1, w2, b2, *options = inputs
    out, _, stats = output
    ctx.save_for_backward(q, k, v, key_mask, seed, w1, b1, w2, b2, out, stats)
    ctx.options = options


def _gradient(ctx, d_out, d_kl, d_stats):
    q, k, v, key_mask, seed, w1, b1, w2, b2, out, stats = ctx.saved_tensors
    if d_out is None:  # only the KL was used
        d_out = torch.zeros_like(out)
    dq, dk, dv, *d_prior = bam_attention_backward(q, k, v, key_mask, seed, w1, b1, w2, b2, out, stats, d_out, d_kl,
                                                  d_stats, *ctx.options)
    return (dq, dk, dv, None, None, *(d_prior or [None] * 4)) + (None,) * len(ctx.options)


bam_attention.register_autograd(_gradient, setup_context=_setup)

