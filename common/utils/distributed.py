"""Multi-process data-parallel training on ``torch.distributed`` (launch with ``torchrun``).

Each process trains a replica on its shard of every global batch; DistributedDataParallel
averages the gradients, so N processes with per-rank batch B follow the same trajectory
as one process with batch N*B (for losses that are means over the batch)::

    torchrun --nproc_per_node 2 -m graphattn.train ...

    env = init_distributed()                 # reads RANK / WORLD_SIZE / LOCAL_RANK
    model = wrap_model(model.to(env.device), env)
    sampler = shard_sampler(dataset, env, shuffle=True, seed=seed)

Auxiliary losses collected with ``common.attention.aux_losses()`` work unchanged: each
process collects its own, and their gradients are averaged like the task loss's.
"""
from __future__ import annotations

import os
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, List, Optional, Sequence, Tuple, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, DistributedSampler

T = TypeVar("T")


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: ``rank`` of ``world_size``, on ``device``."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Only the main process writes checkpoints, logs and results."""
        return self.rank == 0


def init_distributed(
    backend: Optional[str] = None, device: Optional[str] = None, timeout_s: float = 1800.0
) -> DistEnv:
    """Join the process group described by torchrun's environment variables, if any.

    Without ``WORLD_SIZE`` (or with 1) this is a single process and nothing is initialised.
    The backend defaults to NCCL on CUDA and gloo on CPU; a collective that waits longer
    than ``timeout_s`` raises instead of hanging.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and device != "cpu"
    if device is None:
        device = f"cuda:{local_rank}" if use_cuda else "cpu"
    if world_size > 1 and not dist.is_initialized():
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise RuntimeError(
                f"WORLD_SIZE={world_size} but {', '.join(missing)} is not set: launch with "
                "`torchrun --nproc_per_node N ...`, which sets them"
            )
        dist.init_process_group(
            backend or ("nccl" if use_cuda else "gloo"), rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    if str(device).startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    return DistEnv(rank, world_size, local_rank, torch.device(device))


#: The DistributedDataParallel models made by :func:`wrap_model` that :func:`cleanup` disarms.
_WRAPPED: "weakref.WeakSet[DistributedDataParallel]" = weakref.WeakSet()


def wrap_model(model: nn.Module, env: DistEnv) -> nn.Module:
    """``DistributedDataParallel(model)`` when there are several processes, else ``model``."""
    if not env.distributed:
        return model
    ids = [env.device.index] if env.device.type == "cuda" else None
    wrapped = DistributedDataParallel(model, device_ids=ids)
    _WRAPPED.add(wrapped)
    return wrapped


def shard_sampler(dataset: Dataset, env: DistEnv, shuffle: bool = True, seed: int = 0) -> Optional[DistributedSampler]:
    """A sampler giving each process its own shard (call ``set_epoch`` every epoch), or None."""
    if not env.distributed:
        return None
    return DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=shuffle, seed=seed)


def all_reduce_mean(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """The mean of ``value`` over processes (for logging metrics), ``value`` itself when alone."""
    if not env.distributed:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / env.world_size


def round_robin(items: Sequence[T], env: DistEnv, start: int = 0,
                per_process: int = 1) -> Iterator[Tuple[int, List[T]]]:
    """Deal ``items[start:]`` to the processes in rounds of ``world_size * per_process`` items:
    every item goes to exactly one process, once (no padding and no dropping, unlike
    ``DistributedSampler``).

    Yields, per round, the position after it and this process's items (``per_process`` of
    them; fewer, possibly none, in the last round). A process left with none must still take
    part in the round's gradient all-reduce, with a contribution weighted zero. One process
    gets every item, in order.
    """
    size = env.world_size * per_process
    for first in range(start, len(items), size):
        mine = range(first + env.rank * per_process, min(first + (env.rank + 1) * per_process, len(items)))
        yield min(first + size, len(items)), [items[i] for i in mine]


def all_reduce_sum(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """The sum of ``value`` over processes (a new tensor), ``value`` itself when alone."""
    if not env.distributed:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def global_count(local: int, env: DistEnv, device: torch.device) -> int:
    """The sum of a count over processes (the seed nodes or target tokens of a global batch), ``local`` when
    alone."""
    return int(all_reduce_sum(torch.tensor(local, device=device), env)) if env.distributed else local


def share_of_mean(local_sum: torch.Tensor, count: int, world_size: int) -> torch.Tensor:
    """This process's part of a global batch's mean loss: its ``local_sum`` over the global ``count`` (of
    :func:`global_count`) times ``world_size``, which DistributedDataParallel's gradient averaging divides out
    again. One process: the batch mean."""
    return local_sum * (world_size / max(int(count), 1))


def broadcast_objects(objects: List[Any], env: DistEnv, src: int = 0) -> List[Any]:
    """The main process's ``objects`` (picklable) on every process, e.g. a decision taken after
    a validation that only the main process ran."""
    if not env.distributed:
        return objects
    payload = list(objects) if env.rank == src else [None] * len(objects)
    dist.broadcast_object_list(payload, src=src)
    return payload


def barrier(env: DistEnv) -> None:
    """Wait until every process gets here (no-op for one process)."""
    if env.distributed:
        dist.barrier()


@contextmanager
def main_first(env: DistEnv) -> Iterator[None]:
    """The body runs on the main process first and on the others once it is done there (the main process writes a
    cache that the others then read)."""
    if not env.is_main:
        barrier(env)
    yield
    if env.is_main:
        barrier(env)


def cleanup(env: DistEnv) -> None:
    """Leave the process group once every process has arrived.

    The models of :func:`wrap_model` stop being data-parallel here: their gradient reducer is
    dropped before the group. A reducer outliving the group would destroy it later, with
    Python's GIL held, and gloo's destructor then waits for its worker thread, which may need
    the GIL to free a finished collective's tensor: a deadlock. Delete DDP models made
    elsewhere before calling this.
    """
    if env.distributed and dist.is_initialized():
        dist.barrier()
        for model in list(_WRAPPED):
            for name in ("reducer", "logger"):  # the logger shares the reducer
                model.__dict__.pop(name, None)
        _WRAPPED.clear()
        dist.destroy_process_group()
