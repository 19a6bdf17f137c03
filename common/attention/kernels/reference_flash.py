"""A reference flash-attention kernel: plain softmax attention (no noise, no KL) in FlashAttention-2's structure.

It is the baseline of the dense kernels' SASS budget (:mod:`common.attention.kernels.sass`) and of GPU timings
next to ``F.scaled_dot_product_attention``. The structure follows Triton's fused-attention tutorial
(``python/tutorials/06-fused-attention.py``, MIT licence, after Tri Dao's FlashAttention-2):

* forward: one program per block of ``BLOCK_M`` queries of one (batch, head), warps along the queries, streaming
  over blocks of ``BLOCK_N`` keys with the online softmax in base 2 and tensor-core products in the input dtype
  (TF32 for float32) accumulated in float32; it writes O and each query's log-sum-exp in base 2;
* backward: a small kernel for ``delta_i = dO_i . O_i``, one kernel per key block for ``dk`` and ``dv`` (the
  transposed score tile, warps along the keys) and one per query block for ``dq``; both recompute the
  probabilities from the saved LSE.

Every loop over blocks runs in two stages: the blocks that need no mask, then the causal diagonal and the ragged
ends, masked. The steady-state loop, the one the SASS report measures, carries no masking. ``q, k, v`` are
``[B, H, L, d]`` (bfloat16, float16 or float32) with one head size, a power of two from 16 to 128; causal masks
hide the keys ``j > i`` (as SDPA's ``is_causal``).

:func:`flash_attention` is the function to call (autograd through the custom operators
``torch.ops.attention_suite.reference_flash`` and ``reference_flash_backward``); :func:`forward` and
:func:`backward` launch the kernels without autograd.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import interpreting, launch

LOG2E = 1.4426950408889634


@triton.jit
def _forward_stage(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_d, lo, hi, n_k, qk_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                   PRECISION: tl.constexpr):
    """The online softmax over the key blocks in ``[lo, hi)``; ``MASKED`` hides keys past ``n_k`` (and after the
    query, when ``CAUSAL``)."""
    for start in range(lo, hi, BLOCK_N):
        start = tl.multiple_of(start, BLOCK_N)
        offs_n = start + tl.arange(0, BLOCK_N)
        if MASKED:
            in_range = offs_n < n_k
            k = tl.load(k_base + offs_n[None, :] * HEAD_DIM + offs_d[:, None], mask=in_range[None, :], other=0.0)
            v = tl.load(v_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=in_range[:, None], other=0.0)
        else:
            k = tl.load(k_base + offs_n[None, :] * HEAD_DIM + offs_d[:, None])
            v = tl.load(v_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :])
        s = tl.dot(q, k, input_precision=PRECISION)
        if MASKED:
            visible = in_range[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _forward(Q, K, V, O, LSE, n_q, n_k, qk_scale,
             HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    pid_m, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # int64: bh * n_q * d passes 2^31
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    q = tl.load(Q + bh * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)
    k_base, v_base = K + bh * n_k * HEAD_DIM, V + bh * n_k * HEAD_DIM
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    full, end = n_k // BLOCK_N * BLOCK_N, n_k
    if CAUSAL:  # keys before the block's first query are visible to all its queries; none after its last
        full, end = tl.minimum(full, pid_m * BLOCK_M), tl.minimum(n_k, (pid_m + 1) * BLOCK_M)
    acc, l_i, m_i = _forward_stage(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_d, 0, full, n_k, qk_scale,
                                   HEAD_DIM, BLOCK_N, False, CAUSAL, PRECISION)
    acc, l_i, m_i = _forward_stage(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_d, full, end, n_k, qk_scale,
                                   HEAD_DIM, BLOCK_N, True, CAUSAL, PRECISION)
    tl.store(O + bh * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             (acc / l_i[:, None]).to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + bh * n_q + offs_m, m_i + tl.math.log2(l_i), mask=row_ok)


@triton.jit
def _delta(O, DO, DELTA, n_rows, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """``delta_i = dO_i . O_i`` over the rows of every (batch, head)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    where = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    ok = rows < n_rows
    o = tl.load(O + where, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + where, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + rows, tl.sum(o * do, 1), mask=ok)


@triton.jit
def _kv_stage(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n, offs_d, lo, hi, n_q, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              PRECISION: tl.constexpr):
    """``dk`` (unscaled) and ``dv`` of a key block over the query blocks in ``[lo, hi)``, on the transposed tile
    ``s^T [keys, queries]``; ``MASKED`` hides queries past ``n_q`` (and before the key, when ``CAUSAL``)."""
    for start in range(lo, hi, BLOCK_M):
        start = tl.multiple_of(start, BLOCK_M)
        offs_m = start + tl.arange(0, BLOCK_M)
        rows = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        if MASKED:
            in_range = offs_m < n_q
            q = tl.load(q_base + rows, mask=in_range[:, None], other=0.0)
            do = tl.load(do_base + rows, mask=in_range[:, None], other=0.0)
            lse = tl.load(lse_base + offs_m, mask=in_range, other=0.0)
            delta = tl.load(delta_base + offs_m, mask=in_range, other=0.0)
        else:
            q = tl.load(q_base + rows)
            do = tl.load(do_base + rows)
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        p = tl.math.exp2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale - lse[None, :])
        if MASKED:
            visible = in_range[None, :]
            if CAUSAL:
                visible = visible & (offs_m[None, :] >= offs_n[:, None])
            p = tl.where(visible, p, 0.0)
        dv = tl.dot(p.to(do.dtype), do, dv, input_precision=PRECISION)
        dp = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds = p * (dp - delta[None, :])
        dk = tl.dot(ds.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit
def _backward_kv(Q, K, V, DO, LSE, DELTA, DK, DV, n_q, n_k, qk_scale, scale,
                 HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tl.static_assert(BLOCK_N % BLOCK_M == 0)
    pid_n, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = bh * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    col_ok = offs_n < n_k
    k = tl.load(K + keys, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + keys, mask=col_ok[:, None], other=0.0)
    dk = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    q_base, do_base = Q + bh * n_q * HEAD_DIM, DO + bh * n_q * HEAD_DIM
    lse_base, delta_base = LSE + bh * n_q, DELTA + bh * n_q
    lo, diagonal_end = 0, 0
    if CAUSAL:  # queries before the block's first key see none of it; those after its last see all of it
        lo, diagonal_end = pid_n * BLOCK_N, tl.minimum(n_q, (pid_n + 1) * BLOCK_N)
    full = tl.maximum(diagonal_end, n_q // BLOCK_M * BLOCK_M)
    dk, dv = _kv_stage(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n, offs_d, lo, diagonal_end, n_q,
                       qk_scale, HEAD_DIM, BLOCK_M, True, CAUSAL, PRECISION)
    dk, dv = _kv_stage(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n, offs_d, diagonal_end, full, n_q,
                       qk_scale, HEAD_DIM, BLOCK_M, False, CAUSAL, PRECISION)
    dk, dv = _kv_stage(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n, offs_d, full, n_q, n_q,
                       qk_scale, HEAD_DIM, BLOCK_M, True, CAUSAL, PRECISION)
    tl.store(DK + keys, (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + keys, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _q_stage(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_d, lo, hi, n_k, qk_scale,
             HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
             PRECISION: tl.constexpr):
    """``dq`` (unscaled) of a query block over the key blocks in ``[lo, hi)``; ``MASKED`` as in the forward."""
    for start in range(lo, hi, BLOCK_N):
        start = tl.multiple_of(start, BLOCK_N)
        offs_n = start + tl.arange(0, BLOCK_N)
        if MASKED:
            in_range = offs_n < n_k
            k = tl.load(k_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=in_range[:, None], other=0.0)
            v = tl.load(v_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=in_range[:, None], other=0.0)
        else:
            k = tl.load(k_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :])
            v = tl.load(v_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :])
        p = tl.math.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - lse[:, None])
        if MASKED:
            visible = in_range[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.jit
def _backward_q(Q, K, V, DO, LSE, DELTA, DQ, n_q, n_k, qk_scale, scale,
                HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    pid_m, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = bh * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    row_ok = offs_m < n_q
    q = tl.load(Q + rows, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + rows, mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + bh * n_q + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * n_q + offs_m, mask=row_ok, other=0.0)
    k_base, v_base = K + bh * n_k * HEAD_DIM, V + bh * n_k * HEAD_DIM
    dq = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    full, end = n_k // BLOCK_N * BLOCK_N, n_k
    if CAUSAL:
        full, end = tl.minimum(full, pid_m * BLOCK_M), tl.minimum(n_k, (pid_m + 1) * BLOCK_M)
    dq = _q_stage(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_d, 0, full, n_k, qk_scale,
                  HEAD_DIM, BLOCK_N, False, CAUSAL, PRECISION)
    dq = _q_stage(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_d, full, end, n_k, qk_scale,
                  HEAD_DIM, BLOCK_N, True, CAUSAL, PRECISION)
    tl.store(DQ + rows, (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


class Tiles(NamedTuple):
    """Launch options (tile, warps, stages) of the forward, backward dk/dv and backward dq kernels."""

    forward: dict
    backward_kv: dict
    backward_q: dict


def _tile(block_m: int, block_n: int, num_warps: int, num_stages: int) -> dict:
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages)


#: (half inputs, head size > 64) -> tiles, chosen from the SASS report (:mod:`~common.attention.kernels.aot`
#: ``--sass``): no stack on sm_80 and sm_90, no work repeated across warps, few instructions per score element on
#: sm_90. Wider tiles of 128-wide heads spill on sm_80.
_TILES = {
    (True, False): Tiles(_tile(128, 128, 8, 3), _tile(64, 128, 8, 3), _tile(128, 64, 8, 3)),
    (True, True): Tiles(_tile(64, 64, 4, 2), _tile(32, 64, 4, 2), _tile(64, 32, 4, 2)),
    (False, False): Tiles(_tile(64, 32, 4, 3), _tile(32, 64, 4, 2), _tile(64, 32, 4, 2)),
    (False, True): Tiles(_tile(64, 32, 4, 2), _tile(32, 32, 4, 2), _tile(32, 32, 4, 2)),
}
#: Rows per program of the ``delta`` kernel.
DELTA_ROWS = 128


def tiles(dtype: torch.dtype, head_dim: int) -> Tiles:
    """The tiles for ``dtype`` and ``head_dim`` (16 x 16 in Triton's interpreter)."""
    if interpreting():
        one = _tile(16, 16, 4, 1)
        return Tiles(one, one, one)
    return _TILES[(dtype != torch.float32, head_dim > 64)]


def _precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: TF32 on a GPU (half inputs ignore it), exact float32 in the interpreter."""
    return "ieee" if interpreting() and dtype == torch.float32 else "tf32"


def _check(q: Tensor, k: Tensor, v: Tensor) -> None:
    d = q.shape[-1]
    if not (q.dim() == k.dim() == v.dim() == 4 and k.shape == v.shape and q.shape[:2] == k.shape[:2]
            and k.shape[-1] == d):
        raise ValueError(f"expected q [B, H, Lq, d] and k, v [B, H, Lk, d]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if d not in (16, 32, 64, 128) or q.dtype not in (torch.float32, torch.bfloat16, torch.float16) \
            or not q.dtype == k.dtype == v.dtype or k.shape[2] == 0:
        raise ValueError(f"head size {d} (16, 32, 64 or 128), dtype {q.dtype}/{k.dtype}/{v.dtype} (one of float32, "
                         f"bfloat16, float16) and {k.shape[2]} keys (at least one) not supported")


def forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """``(out, lse2)``: ``softmax(scale q k^T) v`` and each query's log-sum-exp in base 2 (float32,
    ``[B, H, Lq]``) of ``q [B, H, Lq, d]`` and ``k, v [B, H, Lk, d]``. No autograd: see :func:`flash_attention`."""
    _check(q, k, v)
    (B, H, n_q, d), n_k = q.shape, k.shape[2]
    q, k, v = (x.contiguous() for x in (q, k, v))
    out = torch.empty_like(q)
    lse = torch.empty(B, H, n_q, device=q.device, dtype=torch.float32)
    tile = tiles(q.dtype, d).forward
    launch("reference_flash", _forward, (triton.cdiv(n_q, tile["BLOCK_M"]), B * H), q, k, v, out, lse, n_q, n_k,
           scale * LOG2E, HEAD_DIM=d, CAUSAL=causal, PRECISION=_precision(q.dtype), **tile)
    return out, lse


def backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, d_out: Tensor, causal: bool,
             scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of :func:`forward` for the output gradient ``d_out``."""
    (B, H, n_q, d), n_k = q.shape, k.shape[2]
    q, k, v, out, d_out = (x.contiguous() for x in (q, k, v, out, d_out))
    delta = torch.empty_like(lse)
    launch("reference_flash", _delta, (triton.cdiv(B * H * n_q, DELTA_ROWS),), out, d_out, delta, B * H * n_q,
           HEAD_DIM=d, BLOCK_M=DELTA_ROWS)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tile = tiles(q.dtype, d)
    common = dict(HEAD_DIM=d, CAUSAL=causal, PRECISION=_precision(q.dtype))
    launch("reference_flash", _backward_kv, (triton.cdiv(n_k, tile.backward_kv["BLOCK_N"]), B * H),
           q, k, v, d_out, lse, delta, dk, dv, n_q, n_k, scale * LOG2E, scale, **common, **tile.backward_kv)
    launch("reference_flash", _backward_q, (triton.cdiv(n_q, tile.backward_q["BLOCK_M"]), B * H),
           q, k, v, d_out, lse, delta, dq, n_q, n_k, scale * LOG2E, scale, **common, **tile.backward_q)
    return dq, dk, dv


@torch.library.custom_op("attention_suite::reference_flash", mutates_args=())
def reference_flash(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """:func:`forward` as a custom operator (fake implementation and gradient registered)."""
    return forward(q, k, v, causal, scale)


@reference_flash.register_fake
def _(q, k, v, causal, scale):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("attention_suite::reference_flash_backward", mutates_args=())
def reference_flash_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, d_out: Tensor, causal: bool,
                             scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`backward` as a custom operator."""
    return backward(q, k, v, out, lse, d_out, causal, scale)


@reference_flash_backward.register_fake
def _(q, k, v, out, lse, d_out, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v, ctx.causal, ctx.scale = inputs
    ctx.save_for_backward(q, k, v, *output)


def _gradient(ctx, d_out, d_lse):
    dq, dk, dv = reference_flash_backward(*ctx.saved_tensors, d_out, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


reference_flash.register_autograd(_gradient, setup_context=_setup)


def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: Optional[float] = None) -> Tensor:
    """``softmax(scale q k^T) v`` (``scale`` defaults to ``d ** -0.5``; ``causal`` hides keys ``j > i``) of
    ``q [B, H, Lq, d]`` and ``k, v [B, H, Lk, d]`` on the GPU (or Triton's interpreter), with gradients."""
    return reference_flash(q, k, v, causal, q.shape[-1] ** -0.5 if scale is None else float(scale))[0]
