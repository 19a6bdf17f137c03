r"""``GATConv`` with the suite's attention normalizers: PyG's layer, any attention variant.

Graph attention (Velickovic et al., ICLR 2018, Eqs. 1-4), per head :math:`h`:

.. math::
    e_{ij} = \mathrm{LeakyReLU}\big(\mathbf{a}_t^\top \Theta_t \mathbf{x}_i
             + \mathbf{a}_s^\top \Theta_s \mathbf{x}_j\;[+\,\mathbf{a}_e^\top \Theta_e \mathbf{e}_{ij}]\big),
    \qquad
    \alpha_{i\cdot} = \mathrm{normalize}\big(e_{i\cdot}\big)\ \text{over}\ j \in \mathcal{N}(i) \cup \{i\},
    \qquad
    \mathbf{x}'_i = \sum_j \mathrm{dropout}(\alpha_{ij})\, \mathrm{dropout_v}(\Theta_s \mathbf{x}_j) .

``dropout_v`` (``value_dropout``, off by default as in PyG) is the dropout that the original GAT
code (PetarV-/GAT, ``utils/layers.py: attn_head``/``sp_attn_head``: ``seq_fts =
tf.nn.dropout(seq_fts, 1.0 - in_drop)`` before ``vals = coefs @ seq_fts``) also applies, with
its input dropout rate 0.6, to the projected features being aggregated: one mask per node and
head, drawn after the attention scores (and BAM's contextual-prior keys) are computed from the
undropped features. ``torch_geometric.nn.GATConv`` has no such dropout.

Two options reproduce details of the original TF code (PetarV-/GAT and the BAM code built on
it, which builds every head separately): ``attention_bias`` adds one learnt bias per head to each
half of :math:`e_{ij}` inside the LeakyReLU (its ``f_1``/``f_2`` are biased ``conv1d`` s), and
``input_dropout`` drops the layer's input with an independent mask for every head (its
``attn_head`` applies ``in_drop`` to ``seq`` per head). Both are off by default, as in PyG.

``normalize`` is any :mod:`common.attention` variant: ``softmax`` is the GAT of the paper (and
of ``torch_geometric.nn.GATConv``, weight for weight); the BAM variants (Fan et al., NeurIPS
2020, Sec. 3) sample :math:`\alpha_{i\cdot} = \mathrm{softmax}(e_{i\cdot} + \text{noise})` in
training, use the posterior mean (softmax) in evaluation, and add their KL term to an active
:func:`common.attention.aux_losses` collector. The contextual prior of ``bam-wc``/``bam-lc`` reads
the keys :math:`\Theta_s \mathbf{x}_j` per node (``key_dim = out_channels``), so everything
stays linear in the number of edges.

How it runs: the edges (with self-loops) are sorted by target once, so each node's scores are
normalised by segment sums, and the weighted sum :math:`\mathbf{x}'_i` is one sparse-dense
product (PyG's ``message_and_aggregate`` hook, :mod:`graphattn.aggregate`) instead of a gather,
a multiply and a scatter over ``[edges, heads, channels]``. The prepared graph is kept while the
layer is called again with the same, unchanged ``edge_index`` tensor (transductive training).
Attention weights are returned in the order of PyG's layer.
"""
from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter
from torch_geometric import EdgeIndex
from torch_geometric.index import index2ptr
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import glorot, zeros
from torch_geometric.typing import Adj, OptTensor, Size, SparseTensor, torch_sparse
from torch_geometric.utils import add_self_loops, is_torch_sparse_tensor, remove_self_loops, to_edge_index
from torch_geometric.utils.sparse import set_sparse_value

from common import attention as attention_lib

from .aggregate import TargetCSR, attention_aggregate, edge_by_edge, sort_order
from .dropout import Dropout, SparseDropout
from .sparse_features import sparse_linear

#: Keyword arguments that go to ``MessagePassing``; all other extra keywords are options of
#: the attention normalizer (e.g. ``k``, ``beta``, ``sigma``, ``d_mid`` for BAM).
MESSAGE_PASSING_KWARGS = ("aggr", "aggr_kwargs", "flow", "decomposed_layers")


def _apply_linear(lin: Linear, x: Tensor) -> Tensor:
    """A bias-free ``lin(x)`` for a dense or sparse CSR ``x``."""
    return sparse_linear(x, lin.weight) if x.layout == torch.sparse_csr else lin(x)


@dataclass
class PreparedGraph:
    """What :meth:`GATConv.forward` needs of the graph: ``edge_index`` with self-loops (the
    one returned with attention weights), the same edges sorted by target (``sorted``, with the
    permutation ``to_sorted`` if it was not sorted), their features and the CSR structure."""

    edge_index: Adj
    sorted: Adj
    to_sorted: Optional[Tensor]
    edge_attr: OptTensor
    csr: Optional[TargetCSR]  # None in explain mode, where PyG does not fuse
    #: ``sorted`` as PyG's edge updater takes it fastest, and as torch.compile traces it: a plain tensor,
    #: not an ``EdgeIndex``
    edges: Adj = dataclasses.field(init=False)

    def __post_init__(self):
        self.edges = self.sorted.as_tensor() if isinstance(self.sorted, EdgeIndex) else self.sorted

    @property
    def ptr(self) -> Optional[Tensor]:
        return None if self.csr is None else self.csr.ptr


def sort_by_target(edge_index: Tensor, num_src: int, num_dst: int, num_loops: int = 0,
                   presorted: Optional[bool] = None) -> Tuple[EdgeIndex, Optional[Tensor]]:
    """``edge_index`` (``[2, E]``, an ``EdgeIndex`` or a ``torch.sparse`` ``adj_t``) as an
    ``EdgeIndex`` sorted by target, and the permutation applied (``None`` if already sorted).

    The last ``num_loops`` edges of a ``[2, E]`` input may be the self-loops ``0 .. num_loops-1``
    that PyG's ``add_self_loops`` appends. When the edges before them are sorted by target
    (``presorted``, e.g. from an ``EdgeIndex`` with ``sort_order='col'``; checked in one pass
    when not given), the loops are merged in (:func:`merge_appended_loops`) and nothing is sorted;
    otherwise the edges are sorted by target, stably (:func:`~graphattn.aggregate.sort_order`).
    """
    if is_torch_sparse_tensor(edge_index):
        edge_index, num_loops = to_edge_index(edge_index)[0].flip(0), 0
    if not isinstance(edge_index, EdgeIndex):
        edge_index = EdgeIndex(edge_index, sparse_size=(num_src, num_dst))
    try:
        edge_index.validate()
    except ValueError as err:
        raise ValueError(f"edge_index does not fit x ({num_src} source and {num_dst} target nodes): {err}; "
                         f"node ids must lie in [0, num_nodes)") from err
    if edge_index.is_sorted_by_col:
        return edge_index, None
    edges = edge_index.as_tensor()
    col = edges[1, :edges.size(1) - num_loops]
    if presorted is None:
        presorted = bool((col[1:] >= col[:-1]).all())
    if not presorted:
        to_sorted, _ = sort_order(edges[1], num_dst)
        return EdgeIndex(edges.index_select(1, to_sorted), sparse_size=(num_src, num_dst), sort_order="col"), to_sorted
    to_sorted = merge_appended_loops(col, num_loops, num_dst) if num_loops else None
    if to_sorted is not None:
        edges = edges.index_select(1, to_sorted)
    return EdgeIndex(edges, sparse_size=(num_src, num_dst), sort_order="col"), to_sorted


def target_count(edge_index: Adj, size: Size, x_dst: Tensor) -> int:
    """The number of target nodes, as PyG's ``MessagePassing`` finds it: ``size[1]``, else the
    adjacency's own shape (a ``torch.sparse`` or ``SparseTensor`` ``adj_t`` has a row per target, an
    ``EdgeIndex`` may know its column count), else the rows of ``x_dst`` (``x_src`` when there is no
    ``x_dst``)."""
    if size is not None and size[1] is not None:
        return int(size[1])
    if is_torch_sparse_tensor(edge_index) or isinstance(edge_index, SparseTensor):
        return int(edge_index.size(0))
    if isinstance(edge_index, EdgeIndex) and edge_index.num_cols is not None:
        return int(edge_index.num_cols)
    return x_dst.size(0)


def merge_appended_loops(col: Tensor, num_loops: int, num_dst: int) -> Tensor:
    """The permutation that sorts ``[edges sorted by target col, loops 0 .. num_loops-1]`` by
    target, in one pass: each loop goes after the edges of its node (a stable sort's place)."""
    num_edges = col.numel()
    ptr = index2ptr(col, num_dst)
    arange = torch.arange(num_edges + num_loops, device=col.device)
    position = torch.cat([arange[:num_edges] + col.clamp_max(num_loops), ptr[1:num_loops + 1] + arange[:num_loops]])
    return torch.empty_like(position).scatter_(0, position, arange)


class GATConv(MessagePassing):
    """Drop-in replacement for ``torch_geometric.nn.GATConv`` with ``attention=<variant>``.

    The constructor, the call ``conv(x, edge_index, edge_attr=None, size=None,
    return_attention_weights=None)`` and the parameter names (so ``state_dict`` s load both ways
    for ``softmax``) are those of PyG's ``GATConv``, and so is the repr with the default
    ``attention``. ``edge_index`` may be a ``[2, E]`` tensor, an ``EdgeIndex``, a ``torch.sparse``
    adjacency ``adj_t`` (COO, CSR or CSC: rows are targets) or a ``torch_sparse.SparseTensor``; the
    number of targets comes from ``size``, else from the adjacency's shape, else from ``x``
    (:func:`target_count`). ``x`` may also be a sparse CSR matrix (see :func:`sparse_linear`).

    Args:
        value_dropout: dropout probability of the projected source features (the values summed
            with weights ``alpha_ij``), as in the original GAT code (see the module docstring).
            ``0`` (default) is PyG's layer; the paper's model uses the input dropout, ``0.6``.
        input_dropout: dropout probability of the input ``x``, with an independent mask for
            every head (the original TF code); ``0`` (default): none (drop ``x`` before the layer).
        attention_bias: a learnt bias per head on each half of ``e_ij``, inside the LeakyReLU
            (the original TF code); ``False`` (default): none, as PyG.
        attention: a :func:`common.attention.available` name: ``softmax`` (default),
            ``bam-wf``, ``bam-wc``, ``bam-lf``, ``bam-lc``, ``entmax``, ``entmax15``, ``sparsemax``.
        **kwargs: ``aggr``/``flow``/``decomposed_layers`` go to ``MessagePassing``; everything
            else is an option of the normalizer (BAM: ``k``, ``sigma``, ``beta``, ``d_mid``,
            ``prior_sigma``, ``prior_alpha``, ``prior_mu``, ``prior_activation``).
    """

    #: PyG calls :meth:`message_and_aggregate` for target-sorted ``EdgeIndex`` inputs.
    SUPPORTS_FUSED_EDGE_INDEX = True

    def __init__(
        self,
        in_channels: Union[int, Tuple[int, int]],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: Optional[int] = None,
        fill_value: Union[float, Tensor, str] = "mean",
        bias: bool = True,
        residual: bool = False,
        attention: str = "softmax",
        value_dropout: float = 0.0,
        input_dropout: float = 0.0,
        attention_bias: bool = False,
        **kwargs,
    ):
        mp_kwargs = {key: kwargs.pop(key) for key in MESSAGE_PASSING_KWARGS if key in kwargs}
        mp_kwargs.setdefault("aggr", "add")
        super().__init__(node_dim=0, **mp_kwargs)
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.edge_dim, self.fill_value = add_self_loops, edge_dim, fill_value
        self.residual, self.attention = residual, attention
        for name, p in (("value_dropout", value_dropout), ("input_dropout", input_dropout)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p}")
        self.value_dropout = value_dropout

        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = Linear(in_channels, heads * out_channels, bias=False, weight_initializer="glorot")
        else:
            self.lin_src = Linear(in_channels[0], heads * out_channels, False, weight_initializer="glorot")
            self.lin_dst = Linear(in_channels[1], heads * out_channels, False, weight_initializer="glorot")
        self.att_src = Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = Parameter(torch.empty(1, heads, out_channels))
        if attention_bias:
            self.att_src_bias, self.att_dst_bias = Parameter(torch.empty(heads)), Parameter(torch.empty(heads))
        else:
            self.register_parameter("att_src_bias", None)
            self.register_parameter("att_dst_bias", None)
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, heads * out_channels, bias=False, weight_initializer="glorot")
            self.att_edge = Parameter(torch.empty(1, heads, out_channels))
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)
        total_out_channels = out_channels * (heads if concat else 1)
        if residual:
            res_in = in_channels if isinstance(in_channels, int) else in_channels[1]
            self.res = Linear(res_in, total_out_channels, bias=False, weight_initializer="glorot")
        else:
            self.register_parameter("res", None)
        if bias:
            self.bias = Parameter(torch.empty(total_out_channels))
        else:
            self.register_parameter("bias", None)

        self.normalizer = attention_lib.build(attention, num_heads=heads, key_dim=out_channels, **kwargs)
        self._normalizer_options = dict(kwargs)  # for the repr
        # Only contextual priors (bam-wc, bam-lc) read the keys.
        self.needs_keys = getattr(self.normalizer, "prior_net", None) is not None
        # A module (not F.dropout) so that common.attention.mc_sampling(dropout=True) sees it.
        self.attention_dropout = Dropout(dropout)
        self.value_dropout_layer = Dropout(value_dropout)
        self.input_dropout = SparseDropout(input_dropout)
        self._graph_cache = None  # see _prepare_graph
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res):
            if lin is not None:
                lin.reset_parameters()
        glorot(self.att_src)
        glorot(self.att_dst)
        glorot(self.att_edge)
        zeros(self.bias)
        zeros(self.att_src_bias)
        zeros(self.att_dst_bias)

    def _project(self, lin: Linear, x: Tensor) -> Tensor:
        """``lin(input_dropout(x))`` as ``[N, heads, out_channels]``, each head with its own mask."""
        drop = self.input_dropout
        if not drop.training or drop.p == 0:
            return _apply_linear(lin, x).view(-1, self.heads, self.out_channels)
        weights = lin.weight.view(self.heads, self.out_channels, -1)
        heads = [sparse_linear(drop(x), w) if x.layout == torch.sparse_csr else F.linear(drop(x), w) for w in weights]
        return torch.stack(heads, dim=1)

    def forward(
        self,
        x: Union[Tensor, Tuple[Tensor, Optional[Tensor]]],
        edge_index: Adj,
        edge_attr: OptTensor = None,
        size: Size = None,
        return_attention_weights: Optional[bool] = None,
    ):
        """Same call and returns as ``torch_geometric.nn.GATConv.forward``."""
        res: Optional[Tensor] = None
        if isinstance(x, Tensor):
            if x.dim() != 2:
                raise ValueError(f"node features must be [num_nodes, channels], got shape {tuple(x.shape)}")
            if self.res is not None:
                res = _apply_linear(self.res, x)
            if self.lin is not None:
                x_src = x_dst = self._project(self.lin, x)
            else:
                x_src, x_dst = self._project(self.lin_src, x), self._project(self.lin_dst, x)
        else:
            x_src, x_dst = x
            if x_dst is not None and self.res is not None:
                res = _apply_linear(self.res, x_dst)
            lin_src = self.lin if self.lin is not None else self.lin_src
            lin_dst = self.lin if self.lin is not None else self.lin_dst
            x_src = self._project(lin_src, x_src)
            x_dst = None if x_dst is None else self._project(lin_dst, x_dst)

        # Node-level halves of e_ij (GAT Eq. 3 splits a^T [Wh_i || Wh_j] into two dot products).
        alpha_src = (x_src * self.att_src).sum(dim=-1)
        alpha_dst = None if x_dst is None else (x_dst * self.att_dst).sum(-1)
        if self.att_src_bias is not None:
            alpha_src = alpha_src + self.att_src_bias
            alpha_dst = None if alpha_dst is None else alpha_dst + self.att_dst_bias

        num_src = x_src.size(0)
        num_dst = target_count(edge_index, size, x_dst if x_dst is not None else x_src)
        if x_dst is not None and x_dst.size(0) != num_dst:
            raise ValueError(f"x_dst has {x_dst.size(0)} rows but the graph has {num_dst} target nodes "
                             f"(from size or the sparse adjacency's shape); give one row per target node")
        if torch.compiler.is_compiling() and not return_attention_weights and not self.explain:
            return self._traced_forward(x_src, x_dst, alpha_src, alpha_dst, res, edge_index, edge_attr, num_src,
                                        num_dst, size)
        graph = self._prepare_graph(edge_index, edge_attr, num_src, num_dst, size)
        alpha = self.edge_updater(graph.edges, alpha=(alpha_src, alpha_dst), edge_attr=graph.edge_attr,
                                  keys=x_src, target_ptr=graph.ptr, size=size)
        # Per node and head (not per edge), after the scores and keys used the undropped x_src.
        values = self.value_dropout_layer(x_src)
        out = self.propagate(graph.sorted, x=(values, x_dst), alpha=alpha, csr=graph.csr, size=size)
        out = self._finish(out, res)

        if return_attention_weights:
            edge_index = graph.edge_index
            if graph.to_sorted is not None:  # back to the order of the returned edge_index, as PyG gives it
                alpha = torch.empty_like(alpha).index_copy(0, graph.to_sorted, alpha)
            if isinstance(edge_index, Tensor):
                if is_torch_sparse_tensor(edge_index):
                    return out, (set_sparse_value(edge_index, alpha), alpha)
                return out, (edge_index, alpha)
            return out, edge_index.set_value(alpha, layout="coo")
        return out

    def _finish(self, out: Tensor, res: OptTensor) -> Tensor:
        """Heads concatenated (or averaged), the residual and the bias added."""
        out = out.reshape(-1, self.heads * self.out_channels) if self.concat else out.mean(dim=1)
        if res is not None:
            out = out + res
        return out if self.bias is None else out + self.bias

    def _traced_forward(self, x_src, x_dst, alpha_src, alpha_dst, res, edge_index, edge_attr, num_src, num_dst,
                        size) -> Tensor:
        """The forward pass as ``torch.compile`` traces it: plain tensors only (no ``EdgeIndex``), the
        prepared graph taken from the cache without reading ``edge_index``'s version (an in-place change of
        ``edge_index`` between compiled calls goes unseen), and the aggregation edge by edge (gather,
        weight, ``index_add``), which inductor fuses; a graph not prepared yet is prepared outside the
        compiled graph (one break)."""
        graph = self._cached_graph(edge_index, edge_attr, self._graph_key(edge_index, num_src, num_dst, size))
        if graph is None:
            graph = self._prepare_untraced(edge_index, edge_attr, num_src, num_dst, size)
        edges = graph.edges
        alpha = self.edge_updater(edges, alpha=(alpha_src, alpha_dst), edge_attr=graph.edge_attr, keys=x_src,
                                  target_ptr=graph.ptr, size=size)
        out = edge_by_edge(alpha, self.value_dropout_layer(x_src), edges[0], edges[1], num_dst)
        return self._finish(out, res)

    @staticmethod
    def _graph_key(edge_index: Adj, num_src: int, num_dst: int, size: Size) -> tuple:
        """What a cached graph must match besides the ``edge_index`` object: its version counter (not read
        while torch.compile traces: reading it is a graph break), the node counts and ``size``."""
        version = 0 if torch.compiler.is_compiling() else getattr(edge_index, "_version", 0)
        return version, num_src, num_dst, None if size is None else tuple(size)

    def _cached_graph(self, edge_index: Adj, edge_attr: OptTensor, key: tuple) -> Optional["PreparedGraph"]:
        """The graph prepared for this ``edge_index`` object and ``key``, or None (see :meth:`_prepare_graph`)."""
        cache = self._graph_cache
        if self.explain or edge_attr is not None or cache is None or cache[0]() is not edge_index:
            return None
        same_version = torch.compiler.is_compiling() or cache[1][0] == key[0]
        return cache[2] if same_version and cache[1][1:] == key[1:] else None

    @torch.compiler.disable
    def _prepare_untraced(self, edge_index, edge_attr, num_src, num_dst, size) -> "PreparedGraph":
        return self._prepare_graph(edge_index, edge_attr, num_src, num_dst, size)

    def _prepare_graph(self, edge_index: Adj, edge_attr: OptTensor, num_src: int, num_dst: int,
                       size: Size) -> "PreparedGraph":
        """Self-loops added (as PyG's layer does) and the edges sorted by target.

        Without edge features the result is cached for the next call with the same
        ``edge_index`` object, as long as it is unchanged (same version counter) and alive:
        a transductive model calls its layers with one graph for every epoch.
        """
        key = self._graph_key(edge_index, num_src, num_dst, size)
        cached = self._cached_graph(edge_index, edge_attr, key)
        if cached is not None:
            return cached
        given, num_loops = edge_index, 0
        if is_torch_sparse_tensor(edge_index) and edge_index.layout == torch.sparse_csc:
            edge_index = edge_index.to_sparse_csr()  # PyG's self-loop utilities take COO and CSR only
        presorted = True if isinstance(edge_index, EdgeIndex) and edge_index.is_sorted_by_col else None
        if self.add_self_loops:
            if isinstance(edge_index, Tensor):
                num_nodes = min(num_src, num_dst) if size is None else min(size)
                num_loops = 0 if is_torch_sparse_tensor(edge_index) else num_nodes
                edge_index, edge_attr = remove_self_loops(edge_index, edge_attr)
                edge_index, edge_attr = add_self_loops(edge_index, edge_attr, fill_value=self.fill_value,
                                                       num_nodes=num_nodes)
            elif isinstance(edge_index, SparseTensor):
                if self.edge_dim is not None:
                    raise NotImplementedError("edge_attr with add_self_loops needs a [2, E] edge_index, "
                                              "not a SparseTensor")
                edge_index = torch_sparse.set_diag(edge_index)
        if self.explain:  # explainer masks follow PyG's edge order: keep it (and the unfused path)
            return PreparedGraph(edge_index, edge_index, None, edge_attr, None)
        if isinstance(edge_index, Tensor):  # [2, E] or torch.sparse adj_t
            graph, to_sorted = sort_by_target(edge_index, num_src, num_dst, num_loops, presorted)
            if edge_attr is not None and to_sorted is not None:
                edge_attr = edge_attr.index_select(0, to_sorted)
            prepared = PreparedGraph(edge_index, graph, to_sorted, edge_attr, TargetCSR.from_edge_index(graph))
        else:  # torch_sparse.SparseTensor adj_t: rows are targets, already sorted
            ptr, src, _ = edge_index.csr()
            prepared = PreparedGraph(edge_index, edge_index, None, edge_attr, TargetCSR(src, ptr, edge_index.size(1)))
        if edge_attr is None and isinstance(given, Tensor):
            self._graph_cache = (weakref.ref(given), key, prepared)
        return prepared

    def edge_update(self, alpha_j: Tensor, alpha_i: OptTensor, edge_attr: OptTensor, keys: Tensor,
                    edge_index_j: Tensor, index: Tensor, target_ptr: OptTensor, dim_size: Optional[int]) -> Tensor:
        """Scores ``e_ij`` of every edge, normalised over the edges of each target node ``i``."""
        alpha = alpha_j if alpha_i is None else alpha_j + alpha_i
        if index.numel() == 0:
            return alpha
        if edge_attr is not None and self.lin_edge is not None:
            if edge_attr.dim() == 1:
                edge_attr = edge_attr.view(-1, 1)
            edge_attr = self.lin_edge(edge_attr).view(-1, self.heads, self.out_channels)
            alpha = alpha + (edge_attr * self.att_edge).sum(dim=-1)
        alpha = F.leaky_relu(alpha, self.negative_slope)
        if self.needs_keys:
            alpha = self.normalizer(alpha, index=index, num_nodes=dim_size, ptr=target_ptr, keys=keys,
                                    key_index=edge_index_j)
        else:
            alpha = self.normalizer(alpha, index=index, num_nodes=dim_size, ptr=target_ptr)
        return self.attention_dropout(alpha)

    def message(self, x_j: Tensor, alpha: Tensor) -> Tensor:
        """Edge by edge (used only where PyG does not fuse: in explain mode)."""
        return alpha.unsqueeze(-1) * x_j

    def message_and_aggregate(self, edge_index: Union[EdgeIndex, SparseTensor], x: Tensor, alpha: Tensor,
                              csr: TargetCSR) -> Tensor:
        """GAT Eq. 4 as one sparse-dense product (see :mod:`graphattn.aggregate`)."""
        return attention_aggregate(alpha, x[0] if isinstance(x, tuple) else x, csr)

    def __getstate__(self):
        state = super().__getstate__()
        state["_graph_cache"] = None  # holds a weak reference, which cannot be pickled
        return state

    def __repr__(self) -> str:
        """PyG's repr (``GATConv(8, 32, heads=2)``) plus only the options set away from their defaults."""
        extra = {"attention": self.attention} if self.attention != "softmax" else {}
        extra.update(self._normalizer_options)
        if self.value_dropout:
            extra["value_dropout"] = self.value_dropout
        if self.input_dropout.p:
            extra["input_dropout"] = self.input_dropout.p
        if self.att_src_bias is not None:
            extra["attention_bias"] = True
        options = "".join(f", {key}={value!r}" for key, value in extra.items())
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads}{options})"
