"""Exact layer-wise inference over full neighbourhoods (PyG's ``inference`` pattern, ``GAT.inference``): how
``loader.kind: neighbor`` runs evaluate. Each layer is computed for every node, in batches of target nodes with
all their in-neighbours, before the next layer starts. It is the full-batch forward, batch by batch, and costs
one pass over the edges per layer, where mini-batch evaluation over 2-hop neighbourhoods would recompute shared
neighbours for every batch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from common.utils.distributed import DistEnv, all_reduce_sum

from .minibatch import quiet_sampler, require_sampler

if TYPE_CHECKING:
    from torch_geometric.data import Data


def inference_loader(data: Data, batch_size: int, num_workers: int = 0):
    """Every node with all its in-neighbours (one hop), ``batch_size`` target nodes at a time, in node order."""
    require_sampler()
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    graph = Data(edge_index=data.edge_index, num_nodes=data.num_nodes)  # features are gathered per layer
    with quiet_sampler():
        return NeighborLoader(graph, num_neighbors=[-1], batch_size=batch_size, shuffle=False,
                              num_workers=num_workers)


@torch.no_grad()
def layer_over_batches(conv, x: Tensor, loader, env: DistEnv = DistEnv()) -> Tensor:
    """One layer's output for every node (PyG's layer-wise ``inference`` pattern; exact).

    ``loader`` is an :func:`inference_loader`. Each target batch runs ``conv`` as a bipartite call,
    sources = the batch's nodes, targets = its seeds (which come first), so that only the seeds are
    computed. Under ``torchrun`` each process computes every ``world_size``-th target batch and the
    output is summed over processes (each row is written by exactly one).
    """
    out = None
    for index, batch in enumerate(loader):
        if index % env.world_size != env.rank:
            continue
        n_id, seeds = batch.n_id.to(x.device), batch.batch_size
        sources = x.index_select(0, n_id)
        rows = conv((sources, sources[:seeds]), batch.edge_index.to(x.device), size=(n_id.numel(), seeds))
        if out is None:
            out = rows.new_zeros(x.size(0), rows.size(1))
        out[n_id[:seeds]] = rows
    if out is None:  # this process had no target batch
        out = x.new_zeros(x.size(0), conv.out_channels * (conv.heads if conv.concat else 1))
    return all_reduce_sum(out, env)
