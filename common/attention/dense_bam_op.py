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


def attention_forward(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], seed: Tensor,
                      w1: Optional[Tensor], b1: Optional[Tensor], w2: Optional[Tensor], b2: Optional[Tensor],
                      causal: bool, scale: float, noise_kind: int, noise_scale: float, dropout: float, kl_kind: int,
                      kl_constants: list[float], scope_all: bool, activation: int, want_lse: bool,
                      want_sq: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(out, kl, stats)`` of BAM attention: ``dropout(softmax(scale q k^T + noise_scale n)) v`` with the
    noise ``n`` of ``noise_kind`` drawn from ``seed``, and the KL of ``kl_kind`` (:mod:`~.kernels.dense_bam_kl`)
    of the prior ``(w1, b1, w2, b2)``; ``key_mask`` broadcastable to ``[B, H, 1, K]``, or None."""
    call = attention_kernels.Call(causal, scale, noise_kind, noise_scale, dropout, kl_kind, kl_constants, scope_all,
                                  activation, want_lse, want_sq)
    out, kl, stats = _outputs(q, v, kl_kind)
    prior = [w1, b1, w2, b2] if w1 is not None else []
    interpret = interpreting()
    attention_kernels.forward(q, k, v, key_mask, seed, prior, call, interpret, out, stats, kl)
    key = ("bam_attention", q.dtype, q.shape[-1], v.shape[-1], key_mask is None, call[:5], kl_kind, want_lse, want_sq,
           scope_all, activation, torch.backends.cuda.matmul.allow_tf32)
    with compiling_only(key) as first:  # a backward kernel that cannot run here fails now, while we can fall back
        if first:  # its buffers' stand-ins (nothing is written)
            attention_kernels.backward(q, k, v, key_mask, seed, prior, call, interpret, out, stats, out, None,
                                       kl if kl_kind else None, stats, stats if q.dtype == torch.float32 else q, k, v,
                                       [stats] * len(prior) if kl_kind else [])
    return out, kl, stats


def _outputs(q: Tensor, v: Tensor, kl_kind: int) -> tuple[Tensor, Tensor, Tensor]:
    """The operator's outputs, allocated: ``out`` laid out like ``q`` when the head sizes agree, the KL, the zeroed
    statistics buffer."""
    B, H, n_q, _ = q.shape
    out = torch.empty_like(q) if v.shape[-1] == q.shape[-1] else q.new_empty(B, H, n_q, v.shape[-1])
    kl = q.new_empty((), dtype=torch.float32) if kl_kind else q.new_zeros((), dtype=torch.float32)
    stats = q.new_zeros(kl_kernels.stats_size(B * H, n_q, q.shape[-1]), dtype=torch.float32)
    return out, kl, stats


#: The operator (a plain call of :func:`attention_forward` where it runs, its fake implementation under tracing).
bam_attention = torch.library.custom_op("attention_suite::bam_attention", attention_forward, mutates_args=())


@bam_attention.register_fake
def _(q, k, v, key_mask, seed, w1, b1, w2, b2, causal, scale, noise_kind, noise_scale, dropout, kl_kind, kl_constants,
      scope_all, activation, want_lse, want_sq):
    return _outputs(q, v, kl_kind)


def attention_backward(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], seed: Tensor,
                       w1: Optional[Tensor], b1: Optional[Tensor], w2: Optional[Tensor], b2: Optional[Tensor],
                       out: Tensor, stats: Tensor, d_out: Tensor, d_kl: Optional[Tensor], d_stats: Optional[Tensor],
                       causal: bool, scale: float, noise_kind: int, noise_scale: float, dropout: float, kl_kind: int,
                       kl_constants: list[float], scope_all: bool, activation: int, want_lse: bool,
                       want_sq: bool) -> list[Tensor]:
    """``[dq, dk, dv]`` of :func:`attention_forward`, followed by the prior network's four gradients when it has a
    contextual prior and its KL has a gradient: one kernel launch (:func:`~.kernels.dense_bam.backward`)."""
    call = attention_kernels.Call(causal, scale, noise_kind, noise_scale, dropout, kl_kind, kl_constants, scope_all,
                                  activation, want_lse, want_sq)
    prior = [w1, b1, w2, b2] if w1 is not None else []
    d_out = d_out if d_out.stride(-1) == 1 else d_out.contiguous()
    dq_out, dk, dv, d_prior = _gradients(q, k, v, prior, kl_kind and d_kl is not None)
    B, H, n_q, d = q.shape
    dq = dq_out if dq_out.dtype == torch.float32 else q.new_zeros(B * H * n_q * d + B * H, dtype=torch.float32)
    attention_kernels.backward(q, k, v, key_mask, seed, prior, call, interpreting(), out, stats, d_out, d_stats, d_kl,
                               dq, dq_out, dk, dv, d_prior)
    return [dq_out, dk, dv] + [g if g.dtype == p.dtype else g.to(p.dtype) for g, p in zip(d_prior, prior)]


def _gradients(q: Tensor, k: Tensor, v: Tensor, prior: list, with_prior: bool) -> tuple:
    """The backward's outputs, allocated: ``dq`` (zeroed float32 for float32 inputs: the kernel adds to it),
    ``dk``, ``dv`` and the prior's (zeroed float32) when ``with_prior``."""
    dq = q.new_zeros(q.shape) if q.dtype == torch.float32 else q.new_empty(q.shape)
    dk, dv = k.new_empty(k.shape), v.new_empty(v.shape)
    return dq, dk, dv, [torch.zeros_like(p, dtype=torch.float32) for p in prior] if with_prior else []


bam_attention_backward = torch.library.custom_op("attention_suite::bam_attention_backward", attention_backward,
                                                 mutates_args=())


@bam_attention_backward.register_fake
def _(q, k, v, key_mask, seed, w1, b1, w2, b2, out, stats, d_out, d_kl, d_stats, causal, scale, noise_kind,
      noise_scale, dropout, kl_kind, kl_constants, scope_all, activation, want_lse, want_sq):
    prior = [w1, b1, w2, b2] if w1 is not None else []
    dq, dk, dv, d_prior = _gradients(q, k, v, prior, kl_kind and d_kl is not None)
    return [dq, dk, dv] + [torch.empty_like(p) for p in d_prior]


def _setup(ctx, inputs, output):
    q, k, v, key_mask, seed, w1, b1, w2, b2, *options = inputs
    out, _, stats = output
    ctx.save_for_backward(q, k, v, key_mask, seed, w1, b1, w2, b2, out, stats)
    ctx.options = options
    want_lse, want_sq = options[-2:]
    if not (want_lse or want_sq):  # the statistics are the kernels' own: no gradient flows through them
        ctx.mark_non_differentiable(stats)
    ctx.set_materialize_grads(False)


def _gradient(ctx, d_out, d_kl, d_stats):
    q, k, v, key_mask, seed, w1, b1, w2, b2, out, stats = ctx.saved_tensors
    if d_out is None:  # only the KL was used
        d_out = torch.zeros_like(out)
    dq, dk, dv, *d_prior = bam_attention_backward(q, k, v, key_mask, seed, w1, b1, w2, b2, out, stats, d_out, d_kl,
                                                  d_stats, *ctx.options)
    return (dq, dk, dv, None, None, *(d_prior or [None] * 4)) + (None,) * len(ctx.options)


bam_attention.register_autograd(_gradient, setup_context=_setup)
