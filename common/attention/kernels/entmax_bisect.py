"""alpha-entmax by bisection in one fused Triton program per group, forward and backward.

Same maths as :func:`common.attention.functional.entmax_bisect_groups` (Blondel et al., 2019;
Peters et al., 2019, Eq. 9): ``p_j = [(alpha-1) z_j - tau]_+^{1/(alpha-1)}`` with ``tau`` found by
bisecting ``[max - 1, max - d^{1-alpha}]``, the last iterate renormalised. A group's scores stay in
registers for all the iterations, so a call reads the scores once and writes the weights once
(the PyTorch path makes a full pass over memory per iteration). For sparsemax and 1.5-entmax
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

#: Longest group held in registers; longer groups take the PyTorch path.
MAX_BLOCK = 16384


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
def _exact_on_support(x, support, POWER: tl.constexpr):
    """Sparsemax and 1.5-entmax in closed form on the support the bisection found (the sort-based
    algorithms' ``tau``: Martins & Astudillo, 2016, Eq. 3; Peters et al., 2019, Alg. 2)."""
    size = tl.maximum(tl.sum(support.to(x.dtype), 0), 1.0)
    mean = tl.sum(tl.where(support, x, 0.0), 0) / size
    if POWER == 1:
        tau = mean - 1 / size
        return tl.maximum(x - tau, 0.0)
    else:
        spread = tl.sum(tl.where(support, (x - mean) * (x - mean), 0.0), 0)
        tau = mean - tl.sqrt(tl.maximum((1 - spread) / size, 0.0))
        t = tl.maximum(x - tau, 0.0)
        return t * t


@triton.jit
def _row(row, ptr_ptr, alpha_ptr, n_cols, step, alpha_div, alpha_mod, alpha_stride, BLOCK: tl.constexpr,
         CSR: tl.constexpr):
    """The offsets of a program's row (a dense row, or one head of a CSR segment), which of its
    ``BLOCK`` lanes hold scores, and its alpha."""
    if CSR:
        start = tl.load(ptr_ptr + row // step)
        length = tl.load(ptr_ptr + row // step + 1) - start
        base = start * step + row % step
    else:
        length = n_cols
        base = row * n_cols
    idx = tl.arange(0, BLOCK)
    valid = idx < length
    alpha = tl.load(alpha_ptr + ((row // alpha_div) % alpha_mod) * alpha_stride)
    return base + idx * step, valid, alpha


@triton.jit
def _entmax_fwd(x_ptr, out_ptr, alpha_ptr, ptr_ptr, n_cols, step, alpha_div, alpha_mod, alpha_stride, n_iter,
                BLOCK: tl.constexpr, CSR: tl.constexpr, POWER: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs, valid, alpha = _row(row, ptr_ptr, alpha_ptr, n_cols, step, alpha_div, alpha_mod, alpha_stride, BLOCK, CSR)
    am1 = alpha - 1
    exponent = 1 / am1
    x = tl.load(x_ptr + offs, mask=valid, other=float("-inf")) * am1
    count = tl.sum((x > float("-inf")).to(x.dtype), 0)
    top = tl.where(count > 0, tl.max(x, 0), 0.0)  # a fully masked group ends all zero
    tau_lo = top - 1
    width = 1 - tl.exp2((1 - alpha) * tl.log2(tl.maximum(count, 1.0)))  # 1 - d^(1-alpha)
    f_lo = tl.sum(_power(tl.maximum(x - tau_lo, 0.0), exponent, POWER), 0) - 1
    p = tl.zeros([BLOCK], dtype=x.dtype)
    for _ in range(n_iter):
        width = width / 2
        tau_mid = tau_lo + width
        p = _power(tl.maximum(x - tau_mid, 0.0), exponent, POWER)
        f_mid = tl.sum(p, 0) - 1
        tau_lo = tl.where(f_mid * f_lo >= 0, tau_mid, tau_lo)
    if POWER != 0:
        p = _exact_on_support(x, p > 0, POWER)
    total = tl.sum(p, 0)
    tl.store(out_ptr + offs, p / tl.where(total > 0, total, 1.0), mask=valid)


@triton.jit
def _entmax_bwd(p_ptr, g_ptr, dx_ptr, dalpha_ptr, alpha_ptr, ptr_ptr, n_cols, step, alpha_div, alpha_mod,
                alpha_stride, BLOCK: tl.constexpr, CSR: tl.constexpr, POWER: tl.constexpr,
                ALPHA_GRAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs, valid, alpha = _row(row, ptr_ptr, alpha_ptr, n_cols, step, alpha_div, alpha_mod, alpha_stride, BLOCK, CSR)
    p = tl.load(p_ptr + offs, mask=valid, other=0.0)
    g = tl.load(g_ptr + offs, mask=valid, other=0.0)
    positive = p > 0
    # gppr = p^(2 - alpha) on the support: the diagonal of the entmax Jacobian (up to rank one).
    if POWER == 1:
        gppr = positive.to(p.dtype)
    elif POWER == 2:
        gppr = tl.sqrt(p)
    else:
        gppr = tl.where(positive, tl.exp2((2 - alpha) * tl.log2(tl.where(positive, p, 1.0))), 0.0)
    gppr_sum = tl.sum(gppr, 0)
    q = tl.sum(g * gppr, 0) / tl.where(gppr_sum > 0, gppr_sum, 1.0)
    tl.store(dx_ptr + offs, gppr * (g - q), mask=valid)
    if ALPHA_GRAD:
        am1 = alpha - 1
        plogp = tl.where(positive, p * tl.log(tl.where(positive, p, 1.0)), 0.0)
        entropy = tl.sum(plogp, 0)
        d_alpha = (tl.sum(g * p, 0) - q) / (am1 * am1) - (tl.sum(g * plogp, 0) - q * entropy) / am1
        tl.store(dalpha_ptr + row, d_alpha)


class _Layout(NamedTuple):
    rows: int
    n_cols: int  # dense: keys per row
    step: int  # stride between a group's entries (dense 1, edge-wise heads)
    ptr: Optional[Tensor]  # edge-wise CSR pointer
    block: int
    alpha_div: int  # group r uses alpha[(r // alpha_div) % alpha_mod]
    alpha_mod: int


def _warps(block: int) -> int:
    return 1 if block <= 128 else 4 if block <= 2048 else 8


def _power_mode(alpha: Union[float, Tensor]) -> int:
    if isinstance(alpha, Tensor):
        return 0
    return {2.0: 1, 1.5: 2}.get(float(alpha), 0)


class _EntmaxBisect(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, alpha: Tensor, layout: _Layout, n_iter: int, power: int) -> Tensor:
        out = torch.zeros_like(x) if layout.rows == 0 else torch.empty_like(x)  # no group: nothing to launch
        ctx.save_for_backward(out, alpha)
        ctx.layout, ctx.power = layout, power
        if layout.rows == 0:
            return out
        ptr = layout.ptr if layout.ptr is not None else x  # unused dummy pointer in the dense layout
        _entmax_fwd[(layout.rows,)](
            x, out, alpha, ptr, layout.n_cols, layout.step, layout.alpha_div, layout.alpha_mod,
            0 if alpha.numel() == 1 else 1, n_iter,
            BLOCK=layout.block, CSR=layout.ptr is not None, POWER=power, num_warps=_warps(layout.block))
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        p, alpha = ctx.saved_tensors
        layout = ctx.layout
        alpha_grad = ctx.needs_input_grad[1]
        if layout.rows == 0:
            return torch.zeros_like(p), torch.zeros_like(alpha) if alpha_grad else None, None, None, None
        dx = torch.empty_like(p)
        d_rows = p.new_empty(layout.rows if alpha_grad else 1)
        _entmax_bwd[(layout.rows,)](
            p, grad.contiguous(), dx, d_rows, alpha, layout.ptr if layout.ptr is not None else p,
            layout.n_cols, layout.step, layout.alpha_div, layout.alpha_mod, 0 if alpha.numel() == 1 else 1,
            BLOCK=layout.block, CSR=layout.ptr is not None, POWER=ctx.power, ALPHA_GRAD=alpha_grad,
            num_warps=_warps(layout.block))
        d_alpha = None
        if alpha_grad:
            if alpha.numel() == 1:
                d_alpha = d_rows.sum().view(alpha.shape)
            else:
                d_alpha = d_rows.view(-1, layout.alpha_mod, layout.alpha_div).sum((0, 2)).view(alpha.shape)
        return dx, d_alpha, None, None, None


def _as_alpha(alpha: Union[float, Tensor], like: Tensor) -> Tensor:
    if not isinstance(alpha, Tensor):
        return like.new_tensor([float(alpha)])
    return alpha.to(like.dtype).reshape(-1)


def _block(length: int) -> int:
    return max(triton.next_power_of_2(max(length, 1)), 16)


def fits(length: int) -> bool:
    """Whether groups of ``length`` entries fit one program (else use the PyTorch path)."""
    return length <= MAX_BLOCK


def entmax_bisect_dense(scores: Tensor, alpha: Union[float, Tensor], mask: Optional[Tensor] = None,
                        n_iter: int = 31) -> Tensor:
    """alpha-entmax over the last dim of ``scores``; masked keys (``mask`` False) get exactly 0.

    ``alpha``: a float, a one-element tensor, or one per head for ``scores [..., heads, queries, keys]``.
    """
    x = scores if mask is None else torch.where(mask, scores, scores.new_tensor(float("-inf")))
    shape = x.shape
    x = x.contiguous().view(-1, shape[-1])
    a = _as_alpha(alpha, x)
    heads = a.numel()
    if heads > 1 and (len(shape) < 3 or shape[-3] != heads):
        raise ValueError(f"{heads} per-head alphas need scores [..., {heads} heads, queries, keys], "
                         f"got {tuple(shape)}")
    layout = _Layout(x.shape[0], shape[-1], 1, None, _block(shape[-1]), shape[-2] if heads > 1 else 1, heads)
    return _EntmaxBisect.apply(x, a, layout, n_iter, _power_mode(alpha)).view(shape)


def entmax_bisect_csr(scores: Tensor, alpha: Union[float, Tensor], ptr: Tensor, n_iter: int = 31,
                      max_degree: Optional[int] = None) -> Tensor:
    """alpha-entmax of edge-wise ``scores [num_edges, heads]`` (or ``[num_edges]``) sorted by target.

    ``ptr [num_nodes + 1]`` is the CSR pointer; ``alpha`` a float, one value, or one per head.
    """
    x = scores.contiguous()
    heads = x.shape[1] if x.dim() > 1 else 1
    a = _as_alpha(alpha, x)
    if a.numel() not in (1, heads):
        raise ValueError(f"{a.numel()} alphas for edge-wise scores with {heads} heads")
    if max_degree is None:
        max_degree = int((ptr[1:] - ptr[:-1]).max()) if ptr.numel() > 1 else 0
    layout = _Layout((ptr.numel() - 1) * heads, 0, heads, ptr.to(torch.long).contiguous(), _block(max_degree),
                     1, heads)
    return _EntmaxBisect.apply(x, a, layout, n_iter, _power_mode(alpha))


def entmax_bisect_groups(scores: Tensor, alpha: Union[float, Tensor], groups, n_iter: int) -> Optional[Tensor]:
    """The fused kernel for a :class:`~common.attention.groups.DenseGroups` or ``EdgeGroups`` call,
    or ``None`` when a group is longer than :data:`MAX_BLOCK` (then use the PyTorch path).

    Edge-wise groups without ``ptr`` are sorted by target first (one argsort) and unsorted after.
    """
    if isinstance(groups, DenseGroups):
        return entmax_bisect_dense(scores, alpha, groups.mask, n_iter) if fits(scores.shape[-1]) else None
    ptr, order = groups.ptr, None
    if ptr is None:
        counts = torch.bincount(groups.index, minlength=groups.num_nodes)
        ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        order = groups.index.argsort(stable=True)
        scores = scores.index_select(0, order)
    degree = int((ptr[1:] - ptr[:-1]).max()) if ptr.numel() > 1 else 0
    if not fits(degree):
        return None
    weights = entmax_bisect_csr(scores, alpha, ptr, n_iter, degree)
    return weights if order is None else torch.zeros_like(weights).index_copy(0, order, weights)


__all__ = ["MAX_BLOCK", "entmax_bisect_csr", "entmax_bisect_dense", "entmax_bisect_groups", "fits"]
