"""Mini-batch training on sampled neighbourhoods (``loader.kind: neighbor``, PyG's ``NeighborLoader``): every step
takes ``loader.batch_size`` seed nodes of the training split (a fresh order each epoch), samples
``loader.num_neighbors[l]`` in-neighbours per node for layer ``l`` (``-1``: all) and trains on the seeds' outputs.
Under ``torchrun`` each process takes its share of every global batch (:func:`global_batches`): N processes take
the steps of one. Evaluation is exact layer-wise inference (:mod:`graphattn.layerwise`). The sampler comes from
``torch-sparse`` or ``pyg-lib`` (:func:`require_sampler`)."""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING, List, Sequence

import torch

from common.training import EpochBatches
from common.utils.distributed import DistEnv

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


def global_batches(num_seeds: int, batch_size: int, env: DistEnv, seed: int, epoch: int) -> List[List[int]]:
    """This process's share of every global batch of seed positions in ``epoch``.

    The epoch orders the ``num_seeds`` positions by a permutation drawn from ``seed`` and ``epoch`` (identical on
    every process) and cuts it into global batches of ``batch_size``; process ``r`` of ``N`` takes
    ``torch.tensor_split(batch, N)[r]``. A last global batch with fewer positions than processes is dropped, so
    that every process takes the same number of steps."""
    if batch_size < env.world_size:
        raise ValueError(f"loader.batch_size ({batch_size}) is the global batch: it must be at least the "
                         f"number of processes ({env.world_size})")
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    batches = torch.randperm(num_seeds, generator=generator).split(batch_size)
    return [torch.tensor_split(batch, env.world_size)[env.rank].tolist()
            for batch in batches if batch.numel() >= env.world_size]


class NeighborBatches:
    """The training updates of ``loader.kind: neighbor``: :meth:`epoch` gives this process's :func:`global_batches`
    of the training nodes, sampled by a DataLoader (in ``num_workers`` processes ahead) as the engine takes them."""

    def __init__(self, data: Data, num_neighbors: Sequence[int], batch_size: int, env: DistEnv, seed: int,
                 num_workers: int = 0):
        require_sampler()
        from torch_geometric.loader import NeighborLoader

        self.batch_size, self.env, self.seed, self.num_workers = batch_size, env, seed, num_workers
        self.nodes = data.train_mask.nonzero().view(-1).cpu()
        with quiet_sampler():  # used for its collate_fn: a batch's positions -> their sampled subgraph
            self.sampler = NeighborLoader(data, num_neighbors=check_fanouts(num_neighbors, num_layers=2),
                                          input_nodes=self.nodes, filter_per_worker=True)

    def epoch(self, epoch: int) -> EpochBatches:
        """The batches of ``epoch``; a slice of them is their loader. A batch's first ``batch_size`` nodes are its
        seeds; ``edge_index`` points from sampled neighbours to the nodes that sampled them."""
        return EpochBatches(global_batches(self.nodes.numel(), self.batch_size, self.env, self.seed, epoch),
                            range(self.nodes.numel()), self.sampler.collate_fn, self.num_workers)


@contextmanager
def quiet_sampler():
    """PyG's deprecation notice for torch-sparse's sampler (it prefers pyg-lib, which has no wheel for every
    torch) silenced: with torch-sparse installed it would print on every run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using 'NeighborSampler' without a 'pyg-lib'", category=UserWarning)
        yield
