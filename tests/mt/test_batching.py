"""Length-bucketed token-budget batches: budget, coverage, determinism."""
import pytest
import torch

from mt.batching import collate, token_batches


def lengths(n=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 40, (n,), generator=g).tolist(), torch.randint(2, 45, (n,), generator=g).tolist()


def test_every_batch_fits_the_token_budget_and_every_pair_appears_once():
    src, tgt = lengths()
    batches = token_batches(src, tgt, max_tokens=300, seed=3, epoch=1)
    for batch in batches:
        width = max(max(src[i], tgt[i]) for i in batch)
        assert width * len(batch) <= 300
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(src)))
    # bucketing: widths inside a batch are close, so padding is small
    padded = sum(max(max(src[i], tgt[i]) for i in b) * len(b) for b in batches)
    real = sum(max(s, t) for s, t in zip(src, tgt))
    assert real / padded > 0.9


def test_max_sentences_and_shuffling_is_deterministic_per_epoch():
    src, tgt = lengths()
    a = token_batches(src, tgt, max_tokens=10_000, max_sentences=7, seed=1, epoch=0)
    assert max(len(b) for b in a) == 7
    assert a == token_batches(src, tgt, max_tokens=10_000, max_sentences=7, seed=1, epoch=0)
    assert a != token_batches(src, tgt, max_tokens=10_000, max_sentences=7, seed=1, epoch=1)
    unshuffled = token_batches(src, tgt, max_tokens=10_000, max_sentences=7, shuffle=False)
    widths = [max(max(src[i], tgt[i]) for i in b) for b in unshuffled]
    assert widths == sorted(widths)


def test_budget_smaller_than_a_sentence_is_a_clear_error():
    with pytest.raises(ValueError, match="max_tokens=10 is smaller than the longest sentence"):
        token_batches([3, 12], [4, 5], max_tokens=10)


def test_collate_pads_and_shifts_targets():
    src = [torch.tensor([5, 6, 3]), torch.tensor([7, 3])]
    tgt = [torch.tensor([2, 8, 9, 3]), torch.tensor([2, 10, 3])]
    batch = collate(src, tgt, [0, 1], src_pad=0, tgt_pad=0)
    assert batch.src.tolist() == [[5, 6, 3], [7, 3, 0]]
    assert batch.src_mask.tolist() == [[True, True, True], [True, True, False]]
    assert batch.tgt_in.tolist() == [[2, 8, 9], [2, 10, 3]]
    assert batch.tgt_out.tolist() == [[8, 9, 3], [10, 3, 0]]


def test_collate_rounds_lengths_up_for_fixed_shapes():
    """``multiple`` (train.compile=reduce-overhead) pads source and decoder input/output to a multiple."""
    src = [torch.tensor([5, 6, 3]), torch.tensor([7, 3])]
    tgt = [torch.tensor([2, 8, 9, 3]), torch.tensor([2, 10, 3])]
    batch = collate(src, tgt, [0, 1], src_pad=0, tgt_pad=1, multiple=4)
    assert batch.src.tolist() == [[5, 6, 3, 0], [7, 3, 0, 0]] and batch.src_mask.sum().item() == 5
    assert batch.tgt_in.tolist() == [[2, 8, 9, 3], [2, 10, 3, 1]]
    assert batch.tgt_out.tolist() == [[8, 9, 3, 1], [10, 3, 1, 1]]
