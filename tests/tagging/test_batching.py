"""Batches: padding, one character row per distinct word, and the training / evaluation orders."""
from __future__ import annotations

import random

import pytest
import torch

from common.text.batching import bucketed_order, epoch_batches
from tagging.data import PAD, Chunk, Sentence, Vocabulary, batches, collate, encode, length_sorted_order

VOCAB = Vocabulary.build([Sentence(["ab", "abc", "b", "ca"], ["X"] * 4)], vocab_fraction=1.0)


def chunks_of(*texts, **kwargs):
    return encode([Sentence(t.split(), ["NOUN"] * len(t.split())) for t in texts], VOCAB, **kwargs)


def test_collate_pads_words_tags_and_masks():
    batch = collate(chunks_of("ab abc ab", "b"))
    w = VOCAB.word_index
    assert batch.words.tolist() == [[w["ab"], w["abc"], w["ab"]], [w["b"], PAD, PAD]]
    assert batch.mask.tolist() == [[True, True, True], [True, False, False]]
    assert batch.tags.tolist() == [[7, 7, 7], [7, -100, -100]]
    assert not batch.oov[~batch.mask].any() and not batch.ambiguous[~batch.mask].any()


def test_collate_keeps_one_character_row_per_distinct_word():
    chunks = chunks_of("ab abc ab", "b ab", "ca abc")
    batch = collate(chunks)
    c = VOCAB.char_index
    assert batch.chars.shape == (1 + 4, 3)                 # padding + ab, abc, b, ca
    assert batch.chars[0].eq(0).all()                       # row 0: all padding
    assert len({tuple(r) for r in batch.chars.tolist()}) == 5
    expected = {"ab": [c["a"], c["b"], 0], "abc": [c["a"], c["b"], c["c"]], "b": [c["b"], 0, 0],
                "ca": [c["c"], c["a"], 0]}
    words = ["ab abc ab".split(), "b ab".split(), "ca abc".split()]
    for b, sentence in enumerate(words):
        for i, word in enumerate(sentence):
            assert batch.chars[batch.char_index[b, i]].tolist() == expected[word]
    assert batch.char_index[1, 2] == 0 and batch.char_index[2, 2] == 0   # padding points at row 0
    assert batch.char_index[0, 0] == batch.char_index[0, 2] == batch.char_index[1, 1]   # "ab" once
    truncated = collate(chunks_of("abc ab", max_word_chars=2))           # "abc" -> "ab": the same row
    assert truncated.chars.shape == (2, 2) and truncated.char_index[0, 0] == truncated.char_index[0, 1] == 1


def test_batches_default_to_consecutive_chunks():
    chunks = chunks_of("ab", "b ab", "ca abc b", "abc", "b")
    got = [b.words.shape for b in batches(chunks, 2)]
    assert got == [(2, 2), (2, 3), (1, 1)]
    picked = list(batches(chunks, 2, order=[[4, 2]]))
    assert len(picked) == 1 and picked[0].mask.sum(1).tolist() == [1, 3]


def _fake_chunks(lengths):
    return [Chunk(torch.zeros(n, dtype=torch.long), torch.zeros(n, 1, dtype=torch.long),
                  torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool))
            for n in lengths]


def test_bucketed_order_covers_every_chunk_once_and_is_deterministic():
    rng = random.Random(0)
    lengths = [rng.randint(1, 60) for _ in range(237)]
    order = bucketed_order(lengths, 5, torch.Generator().manual_seed(7), pool=4)
    assert sorted(i for batch in order for i in batch) == list(range(237))
    # pools of 4 x 5 = 20 chunks: 11 full pools of 4 batches, then 17 chunks in 3 full batches and one of 2
    assert len(order) == 11 * 4 + 4 and all(1 <= len(batch) <= 5 for batch in order)
    assert sum(len(batch) < 5 for batch in order) == 1
    for batch in order:   # a slice of a length-sorted pool
        assert [lengths[i] for i in batch] == sorted(lengths[i] for i in batch)
    assert order == bucketed_order(lengths, 5, torch.Generator().manual_seed(7), pool=4)
    assert order != bucketed_order(lengths, 5, torch.Generator().manual_seed(8), pool=4)
    # bucketing shrinks padding compared with consecutive batches
    padding = lambda o: sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in o)
    consecutive = [list(range(i, min(i + 5, 237))) for i in range(0, 237, 5)]
    assert padding(order) < padding(consecutive) / 2


def test_length_sorted_order_covers_every_chunk_once_by_length():
    rng = random.Random(1)
    lengths = [rng.randint(1, 60) for _ in range(53)]
    order = length_sorted_order(_fake_chunks(lengths), 10)
    assert [len(b) for b in order] == [10] * 5 + [3]
    flat = [i for b in order for i in b]
    assert sorted(flat) == list(range(53))
    assert [lengths[i] for i in flat] == sorted(lengths)
    assert order == length_sorted_order(_fake_chunks(lengths), 10)


@pytest.mark.parametrize("bucket", [True, False])
def test_an_epochs_batches_depend_on_the_seed_and_the_epoch_only(bucket):
    """epoch_batches (the tagger's and the GLUE fine-tuning's): every example once per epoch, the same batches for
    the same (seed, epoch), so a resumed epoch replays them, and other batches for another epoch or seed."""
    lengths = [random.Random(1).randint(1, 60) for _ in range(101)]
    batches = epoch_batches(lengths, 8, seed=2, epoch=3, bucket=bucket)
    assert sorted(i for batch in batches for i in batch) == list(range(101)) and len(batches) == 13
    assert batches == epoch_batches(lengths, 8, seed=2, epoch=3, bucket=bucket)
    assert batches != epoch_batches(lengths, 8, seed=2, epoch=4, bucket=bucket)
    assert batches != epoch_batches(lengths, 8, seed=3, epoch=3, bucket=bucket)
    if not bucket:  # random batches: consecutive slices of one permutation
        perm = torch.randperm(101, generator=torch.Generator().manual_seed(2 * 100_003 + 3)).tolist()
        assert batches == [perm[i:i + 8] for i in range(0, 101, 8)]
