"""common.training.EpochBatches: an epoch's batches, whose slice is a DataLoader that a resumed epoch can build
without drawing from torch's global generator."""
import torch

from common.training import EpochBatches


def _collate(items):
    return torch.tensor(items)


def test_items_are_batches_and_a_slice_loads_the_rest_of_the_epoch_in_order():
    batches = EpochBatches([[3, 1], [0, 2], [4]], dataset=[10, 11, 12, 13, 14], collate=_collate)
    assert len(batches) == 3 and batches[1] == [0, 2]
    assert [b.tolist() for b in batches[1:]] == [[10, 12], [14]]
    assert batches[3:] == []  # nothing left: no loader built


def test_a_whole_epoch_draws_from_the_global_generator_a_resumed_one_or_a_given_generator_does_not():
    batches = EpochBatches([[0], [1]], dataset=[5, 6], collate=_collate)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    list(batches[1:])  # resumed inside the epoch: a generator of its own
    assert torch.equal(torch.get_rng_state(), before)
    list(batches[0:])  # a whole epoch: the workers' base seed from torch's generator, as a loader over a sampler
    assert not torch.equal(torch.get_rng_state(), before)
    own = EpochBatches([[0], [1]], dataset=[5, 6], collate=_collate, generator=lambda: torch.Generator().manual_seed(1))
    before = torch.get_rng_state()
    list(own[0:])
    assert torch.equal(torch.get_rng_state(), before)
