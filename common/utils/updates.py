"""An epoch that makes no optimiser update is an error, never a silent run that trains nothing."""
from __future__ import annotations


def check_updates(updates: int, why: str, fix: str) -> int:
    """``updates`` (an epoch's optimiser updates) when there is one or more; else a one-line
    ``ValueError`` saying that training would make no update, ``why`` and the ``fix``."""
    if updates < 1:
        raise ValueError(f"an epoch would make no update: {why}; {fix}")
    return updates


def full_batches(examples: int, batch_size: int, what: str, processes: int = 1, key: str = "train.batch_size") -> int:
    """Updates per epoch when each of ``processes`` takes an equal share of ``examples`` (a
    ``DistributedSampler`` pads the shares) and drops its last partial batch of ``batch_size``.

    ``what`` names the examples and where they come from (``"training questions of
    data.train_splits ['train']"``); ``key`` is the batch-size setting the fix names."""
    share = -(-examples // processes)
    per = " per process" if processes > 1 else ""
    if share == 0:
        return check_updates(0, f"there are no {what}", "train on files that hold some")
    return check_updates(share // batch_size,
                         f"{key}={batch_size} exceeds the {share} {what}{per} and the last partial batch is dropped",
                         f"set {key}={share} or less")
