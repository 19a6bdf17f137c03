"""Mini-batch training on sampled neighbourhoods (PyG's ``NeighborLoader``), on one process or many.

Training (``loader.kind: neighbor``): every step takes ``loader.batch_size`` seed nodes of the
training split (a fresh random order each epoch, the same on every process), samples
``loader.num_neighbors[l]`` in-neighbours per node for each layer ``l`` (``-1``: all of them) and
trains on the seed nodes' outputs. Under ``torchrun`` each process takes its share of every global
batch (:class:`GlobalBatches`), so N processes take the steps one process would take with the same
global batch, and DistributedDataParallel averages the gradients.

Evaluation is layer-wise inference over full neighbourhoods (PyG's ``inference`` pattern,
``GAT.inference``, :func:`layer_over_batches`): each layer is computed for every node, in batches of target nodes
with all their in-neighbours, before the next layer starts. It is exact (the full-batch forward,
batch by batch) and costs one pass over the edges per layer, where mini-batch evaluation over
2-hop neighbourhoods would recompute shared neighbours for every batch.

The sampler comes from ``torch-sparse`` or ``pyg-lib`` (see :func:`require_sampler`); this module
writes no sampler of its own.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, List, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from common.utils.distributed import DistEnv, all_reduce_sum

if TYPE_CHECKING:
    from torch_geometric.data import Data

#: How to install a neighbour sampler (the ``sampler`` extra: torch-sparse built against the installed torch).
SAMPLER_INSTALL = 'pip install --no-build-isolation -e ".[sampler]"'


class SamplerMissing(RuntimeError):
    """Neither torch-sparse nor pyg-lib is installed."""


def require_sampler() -> None:
    """Raise :class:`SamplerMissing` (one line: what to install) unless PyG has a neighbour sampler."""
    from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE

    if not (WITH_PYG_LIB or WITH_TORCH_SPARSE):
        raise SamplerMissing(f"loader.kind=neighbor needs PyG's neighbour sampler from torch-sparse or pyg-lib; "
                             f"install it with: {SAMPLER_INSTALL} (a source build of a few minutes)")


def check_fanouts(num_neighbors: Sequence[int], num_layers: int) -> List[int]:
    """``loader.num_neighbors`` as a list of ints, one per layer, each >= 1 or -1 (all neighbours)."""
    fanouts = list(num_neighbors)
    if len(fanouts) != num_layers or any(not isinstance(k, int) or isinstance(k, bool) or (k < 1 and k != -1)
                                         for k in fanouts):
        raise ValueError(f"loader.num_neighbors must give one count per layer ({num_layers}), each >= 1 or -1 "
                         f"(all neighbours), got {fanouts}; e.g. --num-neighbors 10 10")
    return fanouts


class GlobalBatches:
    """This process's share of every global batch of seed positions, as a ``batch_sampler``.

    Epoch ``e`` orders the ``num_seeds`` positions by a permutation drawn from ``seed`` and ``e``
    (identical on every process) and cuts it into global batches of ``batch_size``; process ``r``
    of ``N`` takes ``torch.tensor_split(batch, N)[r]``. A last global batch with fewer positions
    than processes is dropped, so that every process takes the same number of steps. Call
    :meth:`set_epoch` before each epoch.
    """

    def __init__(self, num_seeds: int, batch_size: int, env: DistEnv, seed: int = 0):
        if batch_size < env.world_size:
            raise ValueError(f"loader.batch_size ({batch_size}) is the global batch: it must be at least the "
                             f"number of processes ({env.world_size})")
        self.num_seeds, self.batch_size, self.env, self.seed, self.epoch = num_seeds, batch_size, env, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_batches(self) -> List[Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        batches = torch.randperm(self.num_seeds, generator=generator).split(self.batch_size)
        return [batch for batch in batches if batch.numel() >= self.env.world_size]

    def __iter__(self) -> Iterator[List[int]]:
        for batch in self.global_batches():
            yield torch.tensor_split(batch, self.env.world_size)[self.env.rank].tolist()

    def __len__(self) -> int:
        full, rest = divmod(self.num_seeds, self.batch_size)
        return full + (rest >= self.env.world_size)


def train_loader(data: Data, num_neighbors: Sequence[int], batch_size: int, env: DistEnv, seed: int,
                 num_workers: int = 0):
    """A ``NeighborLoader`` over the training nodes whose batches are :class:`GlobalBatches` shares
    (its ``batch_sampler``: call ``loader.batch_sampler.set_epoch(epoch)`` before each epoch).

    A batch's first ``batch.batch_size`` nodes are its seeds; ``batch.edge_index`` points from
    sampled neighbours to the nodes that sampled them."""
    require_sampler()
    from torch_geometric.loader import NeighborLoader

    seeds = data.train_mask.nonzero().view(-1).cpu()
    batches = GlobalBatches(seeds.numel(), batch_size, env, seed)
    with _quiet_sampler():
        return NeighborLoader(data, num_neighbors=list(num_neighbors), input_nodes=seeds, batch_sampler=batches,
                              num_workers=num_workers)


def inference_loader(data: Data, batch_size: int, num_workers: int = 0):
    """Every node with all its in-neighbours (one hop), ``batch_size`` target nodes at a time, in node order."""
    require_sampler()
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    graph = Data(edge_index=data.edge_index, num_nodes=data.num_nodes)  # features are gathered per layer
    with _quiet_sampler():
        return NeighborLoader(graph, num_neighbors=[-1], batch_size=batch_size, shuffle=False,
                              num_workers=num_workers)


@contextmanager
def _quiet_sampler():
    """PyG's deprecation notice for torch-sparse's sampler (it prefers pyg-lib, which has no wheel for every
    torch) silenced: with torch-sparse installed it would print on every run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using 'NeighborSampler' without a 'pyg-lib'", category=UserWarning)
        yield


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


def global_count(local: int, env: DistEnv, device: torch.device) -> int:
    """The number of seed nodes in this step's global batch (summed over processes)."""
    if not env.distributed:
        return local
    return int(all_reduce_sum(torch.tensor(local, device=device), env))


def seed_loss(logits: Tensor, y: Tensor, global_count: int, env: DistEnv) -> Tensor:
    """This process's part of the global batch's mean cross-entropy: ``sum CE / global_count`` times
    the number of processes, which DistributedDataParallel's gradient averaging divides out again.
    One process: the batch mean."""
    return F.cross_entropy(logits, y, reduction="sum") * (env.world_size / max(global_count, 1))
