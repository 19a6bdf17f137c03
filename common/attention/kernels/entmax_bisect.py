"""alpha-entmax by bisection in one fused Triton program per group, forward and backward.

Same maths as :func:`common.attention.functional.entmax_bisect_groups` (Blondel et al., 2019;
Peters et al., 2019, Eq. 9): ``p_j = [(alpha-1) z_j - tau]_+^{1/(alpha-1)}`` with ``tau`` found by
bisecting ``[max - 1, max - d^{1-alpha}]``, the last iterate renormalised. The first ``BLOCK``
entries of a group stay in registers for all the iterations, so a call on groups that fit reads
the scores once and writes the weights once (the PyTorch path makes a full pass over memory per
iteration); the entries of a longer group past its first block are read again at every pass
(from the cache), so one long group (a hub node) does not widen every program. ``BLOCK`` comes
from the shapes alone (the row length, or the mean degree), never from the data: choosing it
reads nothing back from the GPU. Everything is computed in float32 (float64 for float64 inputs)
whatever the input dtype; the weights are stored in it. For sparsemax and 1.5-entmax
the threshold is then recomputed in closed form on the support found, as the exact sort-based
algorithms compute it.

Layouts: dense rows ``[..., keys]`` (masked keys enter as ``-inf``) and edge-wise scores
``[num_edges, heads]`` sorted by target with the CSR pointer ``ptr`` (a group is one
(node, head) segment). ``alpha`` is one value or one per head (dense: ``[..., heads, queries,
keys]``). The backward is analytic: the ``entmax`` package's formulas for the scores and for
alpha, reduced per group in the same kernel.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..groups import DenseGroups
from .jit_utils import upcast
from . import int_key, launch, precompile

#: Most entries of a dense row held in registers (with 8 warps: 16 per thread, no spills).
DENSE_BLOCK = 4096
#: Most entries of a CSR segment held in registers; the block follows the mean degree up to this.
CSR_BLOCK = 1024


@triton.jit
def _power(t, exponent, POWER: tl.constexpr):
    """``t ** exponent`` for ``t >= 0``; POWER 1 is sparsemax (exponent 1), 2 is 1.5-entmax."""
    if POWER == 1:
        return t
    elif POWER == 2:
        return t * t
    else:
        positive = t > 0
        return tl.where(positive, tl.exp2(tl.log2(tl.where(positive, t, 1.0)) * exponent), 0.0)


@triton.jit
def _row(row, ptr_ptr, alpha_ptr, n_cols, step, alpha_div, alpha_mod, alpha_stride, CSR: tl.constexpr):
    """A program's group (a dense row, or one head of a CSR segment): the offset of its first entry,
    its length (entries ``step`` apart) and its alpha."""
    if CSR:
        start = tl.load(ptr_ptr + row // step)
        length = tl.load(ptr_ptr + row // step + 1) - start
        base = start * step + row % step
    else:
        length = n_cols
        base = row * n_cols
    alpha = upcast(tl.load(alpha_ptr + ((row // alpha_div) % alpha_mod) * alpha_stride))
    return base, length, alpha


@triton.jit
def _scaled(x_ptr, base, lanes, length, step, am1):
    """``(alpha - 1) x`` of the group's entries ``lanes`` (``-inf`` past its end), in float32 at least."""
    return upcast(tl.load(x_ptr + base + lanes * step, mask=lanes < length, other=float("-inf"))) * am1


@triton.jit
def _mass(x, x_ptr, base, length, step, am1, tau, exponent, POWER: tl.constexpr, BLOCK: tl.constexpr):
    """``sum_j [x_j - tau]_+^exponent`` over the group: its first ``BLOCK`` entries ``x`` are in
    registers, the rest (groups longer than ``BLOCK``) are read block by block."""
    total = tl.sum(_power(tl.maximum(x - tau, 0.0), exponent, POWER), 0)
    for start in range(BLOCK, length, BLOCK):
        xs = _scaled(x_ptr, base, start + tl.arange(0, BLOCK), length, step, am1)
        total += tl.sum(_power(tl.maximum(xs - tau, 0.0), exponent, POWER), 0)
    return total


@triton.jit
def _exact_tau(x, x_ptr, base, length, step, am1, tau, POWER: tl.constexpr, BLOCK: tl.constexpr):
    """The threshold of sparsemax and 1.5-entmax in closed form on the support ``x > tau`` the bisection
    found (the sort-based algorithms' ``tau``: Martins & Astudillo, 2016, Eq. 3; Peters et al., 2019, Alg. 2)."""
    support = x > tau
    size = tl.sum(support.to(x.dtype), 0)
    total = tl.sum(tl.where(support, x, 0.0), 0)
    for start in range(BLOCK, length, BLOCK):
        xs = _scaled(x_ptr, base, start + tl.arange(0, BLOCK), length, step, am1)
        size += tl.sum((xs > tau).to(x.dtype), 0)
        total += tl.sum(tl.where(xs > tau, xs, 0.0), 0)
    size = tl.maximum(size, 1.0)
    mean = total / size
    if POWER == 1:
        return mean - 1 / size
    else:
        spread = tl.sum(tl.where(support, (x - mean) * (x - mean), 0.0), 0)
        for start in range(BLOCK, length, BLOCK):
            xs = _scaled(x_ptr, base, start + tl.arange(0, BLOCK), length, step, am1)
            spread += tl.sum(tl.where(xs > tau, (xs - mean) * (xs - mean), 0.0), 0)
        return mean - tl.sqrt(tl.maximum((1 - spread) / size, 0.0))


@triton.jit
def _entmax_fwd(x_ptr, out_ptr, alpha_ptr, ptr_ptr, n_cols, step, alpha_div, alpha_mod, alpha_stride, n_iter,
                BLOCK: tl.constexpr, CSR: tl.constexpr, POWER: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base, length, alpha = _row(row, ptr_ptr, alpha_ptr, n_cols, step, alpha_div, alpha_mod, alpha_stride, CSR)
    lanes = tl.arange(0, BLOCK)
    am1 = alpha - 1
    exponent = 1 / am1
    x = _scaled(x_ptr, base, lanes, length, step, am1)
    count = tl.sum((x > float("-inf")).to(x.dtype), 0)
    top = tl.max(x, 0)
    for start in range(BLOCK, length, BLOCK):
        xs = _scaled(x_ptr, base, start + lanes, length, step, am1)
        count += tl.sum((xs > float("-inf")).to(x.dtype), 0)
        top = tl.maximum(top, tl.max(xs, 0))
    top = tl.where(count > 0, top, 0.0)  # a fully masked group ends all zero
    tau_lo = top - 1
    width = 1 - tl.exp2((1 - alpha) * tl.log2(tl.maximum(count, 1.0)))  # 1 - d^(1-alpha)
    f_lo = _mass(x, x_ptr, base, length, step, am1, tau_lo, exponent, POWER, BLOCK) - 1
    tau = tau_lo
    for _ in range(n_iter):
        width = width / 2
        tau = tau_lo + width
        f_mid = _mass(x, x_ptr, base, length, step, am1, tau, exponent, POWER, BLOCK) - 1
        tau_lo = tl.where(f_mid * f_lo >= 0, tau, tau_lo)
    if POWER != 0:  # tau: the last midpoint, whose support the closed form takes
        tau = _exact_tau(x, x_ptr, base, length, step, am1, tau, POWER, BLOCK)
    total = _mass(x, x_ptr, base, length, step, am1, tau, exponent, POWER, BLOCK)
    scale = 1 / tl.where(total > 0, total, 1.0)
    p = _power(tl.maximum(x - tau, 0.0), exponent, POWER) * scale
    tl.store(out_ptr + base + lanes * step, p.to(out_ptr.dtype.element_ty), mask=lanes < length)
    for start in range(BLOCK, length, BLOCK):
        xs = _scaled(x_ptr, base, start + lanes, length, step, am1)
        p = _power(tl.maximum(xs - tau, 0.0), exponent, POWER) * scale
        tl.store(out_ptr + base + (start + lanes) * step, p.to(out_ptr.dtype.element_ty), mask=start + lanes < length)


@triton.jit
def _jacobian_terms(p_ptr, g_ptr, base, lanes, length, step, alpha, POWER: tl.constexpr):
    """Weights ``p``, upstream gradient ``g`` and ``gppr = p^(2 - alpha)`` on the support (the diagonal
    of the entmax Jacobian, up to rank one) of the group's entries ``lanes``."""
    ok = lanes < length
    p = upcast(tl.load(p_ptr + base + lanes * step, mask=ok, other=0.0))
    g = upcast(tl.load(g_ptr + base + lanes * step, mask=ok, other=0.0))
    positive = p > 0
    if POWER == 1:
        gppr = positive.to(p.dtype)
    elif POWER == 2:
        gppr = tl.sqrt(p)
    else:
        gppr = tl.where(positive, tl.exp2((2 - alpha) * tl.log2(tl.where(positive, p, 1.0))), 0.0)
    plogp = tl.where(positive, p * tl.log(tl.where(positive, p, 1.0)), 0.0)
    return p, g, gppr, plogp


@triton.jit
def _entmax_bwd(p_ptr, g_ptr, dx_ptr, dalpha_ptr, alpha_ptr, ptr_ptr, n_cols, step, alpha_div, alpha_mod,
                alpha_stride, BLOCK: tl.constexpr, CSR: tl.constexpr, POWER: tl.constexpr,
                ALPHA_GRAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base, length, alpha = _row(row, ptr_ptr, alpha_ptr, n_cols, step, alpha_div, alpha_mod, alpha_stride, CSR)
    lanes = tl.arange(0, BLOCK)
    p, g, gppr, plogp = _jacobian_terms(p_ptr, g_ptr, base, lanes, length, step, alpha, POWER)
    gppr_sum, g_gppr = tl.sum(gppr, 0), tl.sum(g * gppr, 0)
    g_p, entropy, g_plogp = tl.sum(g * p, 0), tl.sum(plogp, 0), tl.sum(g * plogp, 0)
    for start in range(BLOCK, length, BLOCK):
        ps, gs, gpprs, plogps = _jacobian_terms(p_ptr, g_ptr, base, start + lanes, length, step, alpha, POWER)
        gppr_sum += tl.sum(gpprs, 0)
        g_gppr += tl.sum(gs * gpprs, 0)
        if ALPHA_GRAD:
            g_p += tl.sum(gs * ps, 0)
            entropy += tl.sum(plogps, 0)
            g_plogp += tl.sum(gs * plogps, 0)
    q = g_gppr / tl.where(gppr_sum > 0, gppr_sum, 1.0)
    tl.store(dx_ptr + base + lanes * step, (gppr * (g - q)).to(dx_ptr.dtype.element_ty), mask=lanes < length)
    for start in range(BLOCK, length, BLOCK):
        _, gs, gpprs, _ = _jacobian_terms(p_ptr, g_ptr, base, start + lanes, length, step, alpha, POWER)
        tl.store(dx_ptr + base + (start + lanes) * step, (gpprs * (gs - q)).to(dx_ptr.dtype.element_ty),
                 mask=start + lanes < length)
    if ALPHA_GRAD:
        am1 = alpha - 1
        d_alpha = (g_p - q) / (am1 * am1) - (g_plogp - q * entropy) / am1
        tl.store(dalpha_ptr + row, d_alpha.to(dalpha_ptr.dtype.element_ty))


class _Layout(NamedTuple):
    rows: int
    n_cols: int  # dense: keys per row
    step: int  # stride between a group's entries (dense 1, edge-wise heads)
    ptr: Optional[Tensor]  # edge-wise CSR pointer
    block: int
    alpha_div: int  # group r uses alpha[(r // alpha_div) % alpha_mod]
    alpha_mod: int


def _warps(block: int) -> int:
    return 1 if block <= 256 else 4 if block <= 2048 else 8


def power_mode(alpha: Union[float, Tensor]) -> int:
    """The kernels' ``POWER`` for ``alpha``: 1 sparsemax, 2 1.5-entmax (exact on the support), 0 any other."""
    if isinstance(alpha, Tensor):
        return 0
    return {2.0: 1, 1.5: 2}.get(float(alpha), 0)


def _forward(x: Tensor, alpha: Tensor, layout: _Layout, n_iter: int, power: int, with_backward: bool) -> Tensor:
    """The weights of ``x`` (no autograd); ``with_backward`` also compiles and loads the backward kernel."""
    out = torch.zeros_like(x) if layout.rows == 0 else torch.empty_like(x)  # no group: nothing to launch
    if layout.rows == 0:
        return out
    ptr = layout.ptr if layout.ptr is not None else x  # unused dummy pointer in the dense layout
    shape = (layout.n_cols, layout.step, layout.alpha_div, layout.alpha_mod, 0 if alpha.numel() == 1 else 1)
    options = dict(BLOCK=layout.block, CSR=layout.ptr is not None, POWER=power, num_warps=_warps(layout.block))
    launch("entmax", _entmax_fwd, (layout.rows,), x, out, alpha, ptr, *shape, n_iter, **options)
    if with_backward:  # the backward kernel, with stand-ins of its arguments
        d_rows = x.new_empty(1, dtype=torch.promote_types(x.dtype, torch.float32))
        for alpha_grad in (False, True):
            key = (x.dtype, tuple(options.items()), int_key(*shape), alpha_grad)
            precompile("entmax", key, _entmax_bwd, (1,), out, x, out, d_rows, alpha, ptr, *shape,
                       ALPHA_GRAD=alpha_grad, **options)
    return out


def _backward(p: Tensor, grad: Tensor, alpha: Tensor, layout: _Layout, power: int, alpha_grad: bool):
    """``(d x, d alpha or None)`` of the weights ``p`` for the upstream gradient ``grad`` (no autograd)."""
    if layout.rows == 0:
        return torch.zeros_like(p), torch.zeros_like(alpha) if alpha_grad else None
    dx = torch.empty_like(p)
    d_rows = p.new_empty(layout.rows if alpha_grad else 1, dtype=torch.promote_types(p.dtype, torch.float32))
    launch("entmax", _entmax_bwd, (layout.rows,),
           p, grad.contiguous(), dx, d_rows, alpha, layout.ptr if layout.ptr is not None else p,
           layout.n_cols, layout.step, layout.alpha_div, layout.alpha_mod, 0 if alpha.numel() == 1 else 1,
           BLOCK=layout.block, CSR=layout.ptr is not None, POWER=power, ALPHA_GRAD=alpha_grad,
           num_warps=_warps(layout.block))
    d_alpha = None
    if alpha_grad:
        if alpha.numel() == 1:
            d_alpha = d_rows.sum().view(alpha.shape)
        else:
            d_alpha = d_rows.view(-1, layout.alpha_mod, layout.alpha_div).sum((0, 2)).view(alpha.shape)
        d_alpha = d_alpha.to(alpha.dtype)
    return dx, d_alpha


class _EntmaxBisect(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, alpha: Tensor, layout: _Layout, n_iter: int, power: int) -> Tensor:
        out = _forward(x, alpha, layout, n_iter, power, with_backward=any(ctx.needs_input_grad[:2]))
        ctx.save_for_backward(out, alpha)
        ctx.layout, ctx.power = layout, power
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        p, alpha = ctx.saved_tensors
        return (*_backward(p, grad, alpha, ctx.layout, ctx.power, ctx.needs_input_grad[1]), None, None, None)


def _as_alpha(alpha: Union[float, Tensor], like: Tensor) -> Tensor:
    """``alpha`` as a flat tensor in the kernels' compute dtype (float32, or float64 for float64 scores)."""
    dtype = torch.promote_types(like.dtype, torch.float32)
    if not isinstance(alpha, Tensor):
        return torch.full((1,), float(alpha), dtype=dtype, device=like.device)
    return alpha.to(dtype).reshape(-1)


def _block(length: int, most: int) -> int:
    """Register lanes for groups of about ``length`` entries: a power of two in ``[16, most]``."""
    return min(max(triton.next_power_of_2(max(length, 1)), 16), most)


def entmax_bisect_dense(scores: Tensor, alpha: Union[float, Tensor], mask: Optional[Tensor] = None,
                        n_iter: int = 31) -> Tensor:
    """alpha-entmax over the last dim of ``scores``; masked keys (``mask`` False) get exactly 0.

    ``alpha``: a float, a one-element tensor, or one per head for ``scores [..., heads, queries, keys]``.
    """
    x, a, layout = _dense(scores, alpha, mask)
    return _EntmaxBisect.apply(x, a, layout, n_iter, power_mode(alpha)).view(scores.shape)


def dense_forward(scores: Tensor, alpha: Tensor, mask: Optional[Tensor], n_iter: int, power: int) -> Tensor:
    """:func:`entmax_bisect_dense` without autograd (for a custom operator's forward), ``power`` given (0: any
    alpha, 1: sparsemax, 2: 1.5-entmax); the backward kernel is compiled and loaded too."""
    x, a, layout = _dense(scores, alpha, mask)
    return _forward(x, a, layout, n_iter, power, with_backward=True).view(scores.shape)


def dense_backward(weights: Tensor, grad: Tensor, alpha: Tensor, power: int, alpha_grad: bool):
    """``(d scores, d alpha or None)`` of :func:`dense_forward`'s ``weights`` for the upstream ``grad``."""
    x, a, layout = _dense(weights, alpha, None)
    dx, d_alpha = _backward(x, grad.reshape(x.shape), a, layout, power, alpha_grad)
    return dx.view(weights.shape), None if d_alpha is None else d_alpha.to(alpha.dtype).view(alpha.shape)


def _dense(scores: Tensor, alpha: Union[float, Tensor], mask: Optional[Tensor]):
    """Rows ``[R, keys]`` of ``scores`` (masked keys at ``-inf``), the flat alpha and the dense layout."""
    x = scores if mask is None else torch.where(mask, scores, float("-inf"))  # (new_tensor: a host-to-GPU copy)
    shape = x.shape
    x = x.contiguous().view(-1, shape[-1])
    a = _as_alpha(alpha, x)
    heads = a.numel()
    if heads > 1 and (len(shape) < 3 or shape[-3] != heads):
        raise ValueError(f"{heads} per-head alphas need scores [..., {heads} heads, queries, keys], "
                         f"got {tuple(shape)}")
    layout = _Layout(x.shape[0], shape[-1], 1, None, _block(shape[-1], DENSE_BLOCK), shape[-2] if heads > 1 else 1,
                     heads)
    return x, a, layout


def _csr(scores: Tensor, alpha: Tensor, ptr: Tensor):
    """The contiguous ``scores``, the flat alpha and the layout of edge-wise groups: one per (node, head)
    segment, holding about twice the mean degree in registers (at most :data:`CSR_BLOCK`)."""
    x = scores.contiguous()
    heads = x.shape[1] if x.dim() > 1 else 1
    a = _as_alpha(alpha, x)
    if a.numel() not in (1, heads):
        raise ValueError(f"{a.numel()} alphas for edge-wise scores with {heads} heads")
    nodes = ptr.numel() - 1
    mean_degree = -(-x.shape[0] // max(nodes, 1))
    layout = _Layout(nodes * heads, 0, heads, ptr.to(torch.long).contiguous(), _block(2 * mean_degree, CSR_BLOCK),
                     1, heads)
    return x, a, layout


def csr_forward(scores: Tensor, ptr: Tensor, alpha: Union[float, Tensor], n_iter: int, power: int) -> Tensor:
    """:func:`entmax_bisect_csr` without autograd (the operator's forward); the backward kernel is compiled and
    loaded too, so that one that cannot run here fails in the forward."""
    x, a, layout = _csr(scores, alpha, ptr)
    return _forward(x, a, layout, n_iter, power, with_backward=True)


@torch.library.custom_op("attention_suite::entmax_csr", mutates_args=())
def csr_entmax(scores: Tensor, ptr: Tensor, alpha: Tensor, n_iter: int, power: int) -> Tensor:
    """:func:`csr_forward` as the custom operator ``torch.ops.attention_suite.entmax_csr`` (``power`` 0: any
    alpha, 1: sparsemax, 2: 1.5-entmax); its gradient is ``attention_suite::entmax_csr_backward``."""
    return csr_forward(scores, ptr, alpha, n_iter, power)


@csr_entmax.register_fake
def _(scores, ptr, alpha, n_iter, power):
    return torch.empty_like(scores)


def csr_backward(weights: Tensor, grad: Tensor, ptr: Tensor, alpha: Union[float, Tensor], power: int,
                 alpha_grad: bool):
    """``(d scores, d alpha or None)`` of :func:`csr_forward`'s ``weights`` for the upstream ``grad``."""
    x, a, layout = _csr(weights, alpha, ptr)
    return _backward(x, grad, a, layout, power, alpha_grad)


@torch.library.custom_op("attention_suite::entmax_csr_backward", mutates_args=())
def csr_entmax_backward(weights: Tensor, grad: Tensor, ptr: Tensor, alpha: Tensor, power: int,
                        alpha_grad: bool) -> tuple[Tensor, Tensor]:
    """:func:`csr_backward` as the custom operator ``torch.ops.attention_suite.entmax_csr_backward``; ``d alpha``
    is empty without ``alpha_grad``."""
    dx, d_alpha = csr_backward(weights, grad, ptr, alpha, power, alpha_grad)
    return dx, alpha.new_empty(0) if d_alpha is None else d_alpha.view(alpha.shape)


@csr_entmax_backward.register_fake
def _(weights, grad, ptr, alpha, power, alpha_grad):
    return torch.empty_like(weights), torch.empty_like(alpha) if alpha_grad else alpha.new_empty(0)


def _csr_setup(ctx, inputs, output):
    _, ptr, alpha, _, power = inputs
    ctx.save_for_backward(output, ptr, alpha)
    ctx.power = power


def _csr_gradient(ctx, grad):
    weights, ptr, alpha = ctx.saved_tensors
    alpha_grad = ctx.needs_input_grad[2]
    d_scores, d_alpha = csr_entmax_backward(weights, grad, ptr, alpha, ctx.power, alpha_grad)
    return d_scores, None, d_alpha if alpha_grad else None, None, None


csr_entmax.register_autograd(_csr_gradient, setup_context=_csr_setup)


def entmax_bisect_csr(scores: Tensor, alpha: Union[float, Tensor], ptr: Tensor, n_iter: int = 31) -> Tensor:
    """alpha-entmax of edge-wise ``scores [num_edges, heads]`` (or ``[num_edges]``) sorted by target, by the
    operator :func:`csr_entmax`.

    ``ptr [num_nodes + 1]`` is the CSR pointer; ``alpha`` a float, one value, or one per head.
    """
    return csr_entmax(scores.contiguous(), ptr, _as_alpha(alpha, scores), n_iter, power_mode(alpha))


def entmax_bisect_groups(scores: Tensor, alpha: Union[float, Tensor], groups, n_iter: int) -> Tensor:
    """The fused kernel for a :class:`~common.attention.groups.DenseGroups` or ``EdgeGroups`` call.

    Edge-wise groups without ``ptr`` are sorted by target first (one argsort) and unsorted after.
    """
    if isinstance(groups, DenseGroups):
        return entmax_bisect_dense(scores, alpha, groups.mask, n_iter)
    ptr, order = groups.ptr, None
    if ptr is None:
        counts = torch.bincount(groups.index, minlength=groups.num_nodes)
        ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        order = groups.index.argsort(stable=True)
        scores = scores.index_select(0, order)
    weights = entmax_bisect_csr(scores, alpha, ptr, n_iter)
    return weights if order is None else torch.zeros_like(weights).index_copy(0, order, weights)


__all__ = ["CSR_BLOCK", "DENSE_BLOCK", "csr_backward", "csr_entmax", "csr_entmax_backward", "csr_forward",
           "dense_backward", "dense_forward", "entmax_bisect_csr", "entmax_bisect_dense", "entmax_bisect_groups",
           "power_mode"]
