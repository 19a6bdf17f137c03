"""The two layouts every normalizer supports, behind one small interface.

A *group* is the set of keys one query attends to; every normalizer maps the scores of
a group to weights that sum to one over it.

* :class:`DenseGroups`: scores ``[..., queries, keys]`` and an optional boolean ``mask``
  broadcastable to them (``True`` = the key takes part, as in
  ``torch.nn.functional.scaled_dot_product_attention``). Per-head tensors are laid out
  ``[..., heads, queries, keys]``.
* :class:`EdgeGroups`: scores ``[num_edges, heads]`` (or ``[num_edges]``) grouped by the
  target node ``index``, the layout of ``torch_geometric.utils.softmax``. Memory stays
  linear in the number of edges. With edges sorted by target, the CSR pointer ``ptr``
  turns every group sum into a segment reduction (about twice as fast as a scatter).

Each layout provides per-group ``max``/``sum``, ``expand`` (group value -> its entries),
``softmax``/``log_softmax`` and ``mean`` over real entries. Masked entries get exact zero
weight and fully masked rows give all-zero weights, never NaN.

No method reads a tensor's values back into Python (``bool(t)``, ``int(t)``): on a GPU that
would be a host synchronisation, and under ``torch.compile`` a graph break. Where a value-dependent
shortcut pays on the CPU in eager mode (the edge softmax's global shift, the CSR sums), it is taken
only there, decided from the device and ``torch.compiler.is_compiling()``.
"""
from __future__ import annotations

import math
import warnings
from typing import Optional

import torch
from torch import Tensor
from torch_geometric.utils import scatter, segment


class DenseGroups:
    """Groups are the last dimension of ``[..., queries, keys]`` scores."""

    def __init__(self, mask: Optional[Tensor] = None):
        if mask is not None and mask.dtype != torch.bool:
            raise TypeError(
                f"mask must be a boolean tensor (True = attend), got dtype {mask.dtype}; "
                "convert an additive -inf mask with `mask = additive_mask == 0`"
            )
        self.mask = mask

    @property
    def empty_rows(self) -> bool:
        """Whether some query may have no key at all (then its weights must be zeroed, not NaN): with
        any mask, since finding out would read the mask's values back to the host."""
        return self.mask is not None

    def fill(self, x: Tensor, value: float) -> Tensor:
        """``x`` with masked entries replaced by ``value`` (one pass, autograd-safe). ``value`` stays a Python
        number: ``x.new_tensor(value)`` would copy it from host memory to a GPU, a synchronisation."""
        return x if self.mask is None else torch.where(self.mask, x, value)

    def zero_masked(self, x: Tensor) -> Tensor:
        return self.fill(x, 0.0)

    def max(self, x: Tensor) -> Tensor:
        return self.fill(x, float("-inf")).amax(-1, keepdim=True)

    def sum(self, x: Tensor) -> Tensor:
        return self.zero_masked(x).sum(-1, keepdim=True)

    def expand(self, group_values: Tensor) -> Tensor:
        return group_values  # broadcasting does it

    def size(self, like: Tensor) -> Tensor:
        """Number of real keys in each group, shaped like :meth:`sum` of ``like``."""
        if self.mask is None:
            return like.new_full(like.shape[:-1] + (1,), like.shape[-1])
        return self.mask.expand(like.shape).sum(-1, keepdim=True).to(like.dtype)

    def softmax(self, x: Tensor) -> Tensor:
        if self.mask is None:
            return torch.softmax(x, dim=-1)
        weights = torch.softmax(self.fill(x, float("-inf")), dim=-1)
        # Masked keys get exp(-inf) = 0 exactly; a fully masked row is NaN and becomes zeros.
        return self.zero_masked(weights) if self.empty_rows else weights

    def log_softmax(self, x: Tensor) -> Tensor:
        """Log-weights; masked entries are ``-inf`` (NaN on fully masked rows): use with :meth:`mean`."""
        return torch.log_softmax(self.fill(x, float("-inf")), dim=-1)

    def log_softmax_pair(self, x: Tensor):
        """``(log_softmax(x), softmax(x))``, see :meth:`log_softmax`."""
        log_weights = self.log_softmax(x)
        return log_weights, log_weights.exp()

    def count(self, like: Tensor) -> "int | Tensor":
        """Number of real entries in a tensor shaped like ``like`` (at least 1; a tensor with a mask)."""
        if self.mask is None:
            return max(like.numel(), 1)
        return self.mask.expand(like.shape).sum().clamp_min(1).to(like.dtype)

    def mean(self, x: Tensor) -> Tensor:
        """Mean of ``x`` over real (unmasked) entries only."""
        if self.mask is None:
            return x.mean()
        return self.zero_masked(x).sum() / self.count(x)


def _edge_shift(x: Tensor, groups: "EdgeGroups") -> Tensor:
    """A per-entry shift that makes ``exp(x - shift)`` safe inside every group.

    The textbook choice is each group's maximum (a slow scatter-max on the CPU). When all of
    ``x`` spans less than half the exponent range of its dtype, the global maximum is just as
    exact: no group's largest term can underflow, and nothing overflows. Checking that reads a
    value back, so it is done only on the CPU in eager mode.
    """
    if host_reads_are_free(x):
        low, high = torch.aminmax(x)
        if high - low < -math.log(torch.finfo(x.dtype).tiny) / 2:
            return high
    return groups.expand(groups.max(x))


def host_reads_are_free(x: Tensor) -> bool:
    """Whether reading ``x``'s values into Python costs neither a device synchronisation nor a graph break."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


class _EdgeSoftmax(torch.autograd.Function):
    """Softmax over edges grouped by target; saves only the output for backward."""

    @staticmethod
    def forward(ctx, x: Tensor, groups: "EdgeGroups") -> Tensor:
        out = (x - _edge_shift(x, groups)).exp_()
        out.div_(groups.total(out))
        ctx.save_for_backward(out)
        ctx.groups = groups
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (out,) = ctx.saved_tensors
        weighted = grad * out
        return weighted.sub_(out * ctx.groups.total(weighted)), None


def _edge_log_softmax(x: Tensor, groups: "EdgeGroups", with_weights: bool = False):
    """``(log_softmax(x), softmax(x) if with_weights)`` over the groups, from one ``exp``."""
    shifted = x - _edge_shift(x, groups)
    exp = shifted.exp()
    total = groups.sum(exp)
    weights = exp.div_(groups.expand(total)) if with_weights else None
    return shifted.sub_(groups.expand(total.log_())), weights


class _EdgeLogSoftmax(torch.autograd.Function):
    """Log-softmax over edges grouped by target; saves only the output for backward."""

    @staticmethod
    def forward(ctx, x: Tensor, groups: "EdgeGroups") -> Tensor:
        out = _edge_log_softmax(x, groups)[0]
        ctx.save_for_backward(out)
        ctx.groups = groups
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (out,) = ctx.saved_tensors
        return grad - out.exp() * ctx.groups.total(grad), None


_CSR_SUM_DTYPES = (torch.float32, torch.float64)


class EdgeGroups:
    """Groups are the edges sharing a target node: scores ``[num_edges, heads]``.

    ``ptr`` (optional, ``[num_nodes + 1]``) is the CSR pointer of ``index`` when the edges are
    sorted by target, as ``torch_geometric.utils.softmax`` takes it.
    """

    empty_rows = False  # a node without incoming edges is simply not a group

    def __init__(self, index: Tensor, num_nodes: Optional[int] = None, ptr: Optional[Tensor] = None):
        if index.dim() != 1 or index.dtype not in (torch.long, torch.int):
            raise ValueError(
                f"index must be a 1-D integer tensor of target nodes, got shape "
                f"{tuple(index.shape)} and dtype {index.dtype}"
            )
        self.index = index
        if ptr is not None:
            if ptr.dim() != 1 or ptr.numel() < 1:
                raise ValueError(
                    f"ptr must be the CSR pointer [num_nodes + 1] of the target-sorted edges, "
                    f"got shape {tuple(ptr.shape)}"
                )
            num_nodes = ptr.numel() - 1
        self.ptr = ptr
        self._ones: Optional[Tensor] = None  # see _csr_sum
        # without num_nodes (and ptr) the count is read from the index: a host synchronisation on a GPU
        self.num_nodes = int(index.max()) + 1 if num_nodes is None and index.numel() else (num_nodes or 0)

    def check(self, scores: Tensor) -> None:
        if scores.shape[0] != self.index.shape[0]:
            raise ValueError(
                f"edge-wise scores have {scores.shape[0]} rows but index has "
                f"{self.index.shape[0]} entries; scores must be [num_edges, heads]"
            )

    def fill(self, x: Tensor, value: float) -> Tensor:
        return x  # every edge is a real entry

    def zero_masked(self, x: Tensor) -> Tensor:
        return x

    def _reduce(self, x: Tensor, reduce: str) -> Tensor:
        if self.ptr is not None:
            return segment(x, self.ptr, reduce=reduce)
        return scatter(x, self.index, 0, dim_size=self.num_nodes, reduce=reduce)

    def max(self, x: Tensor) -> Tensor:
        return self._reduce(x, "max")

    def sum(self, x: Tensor) -> Tensor:
        if self.ptr is not None and host_reads_are_free(x) and x.dtype in _CSR_SUM_DTYPES \
                and x.dim() > 1 and not (x.requires_grad and torch.is_grad_enabled()):
            return self._csr_sum(x)
        return self._reduce(x, "sum")

    def _csr_sum(self, x: Tensor) -> Tensor:
        """Segment sums on CPU as one product with the ``[nodes, edges]`` 0/1 CSR matrix of
        ``ptr``: the same sums in the same order, several times faster than ``segment_reduce``."""
        if self._ones is None or self._ones.dtype != x.dtype:
            num_edges = self.index.numel()
            with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
                warnings.simplefilter("ignore", UserWarning)
                self._ones = torch.sparse_csr_tensor(
                    self.ptr, torch.arange(num_edges, dtype=self.ptr.dtype, device=x.device), x.new_ones(num_edges),
                    (self.num_nodes, num_edges), check_invariants=False)
        out = torch.sparse.mm(self._ones, x.reshape(x.shape[0], -1))
        return out.view((self.num_nodes,) + x.shape[1:])

    def expand(self, group_values: Tensor) -> Tensor:
        return group_values.index_select(0, self.index)

    def total(self, x: Tensor) -> Tensor:
        """The sum of each edge's group, per edge."""
        return self.expand(self.sum(x))

    def size(self, like: Tensor) -> Tensor:
        ones = like.new_ones(like.shape[0]).view((-1,) + (1,) * (like.dim() - 1))
        return self.sum(ones.expand_as(like))

    def softmax(self, x: Tensor) -> Tensor:
        return _EdgeSoftmax.apply(x, self)

    def log_softmax(self, x: Tensor) -> Tensor:
        return _EdgeLogSoftmax.apply(x, self)

    def log_softmax_pair(self, x: Tensor):
        """``(log_softmax(x), softmax(x))`` (no autograd), sharing one ``exp``."""
        return _edge_log_softmax(x, self, with_weights=True)

    def count(self, like: Tensor) -> int:
        return max(like.numel(), 1)

    def mean(self, x: Tensor) -> Tensor:
        return x.mean()


def make_groups(
    scores: Tensor,
    mask: Optional[Tensor] = None,
    index: Optional[Tensor] = None,
    num_nodes: Optional[int] = None,
    ptr: Optional[Tensor] = None,
):
    """Pick the layout from the call: ``index`` means edge-wise, otherwise dense."""
    if index is None:
        if ptr is not None:
            raise ValueError("ptr describes edge-wise groups: pass index=... with it")
        return DenseGroups(mask)
    if mask is not None:
        raise ValueError("pass either mask (dense layout) or index (edge-wise layout), not both")
    groups = EdgeGroups(index, num_nodes, ptr)
    groups.check(scores)
    return groups
