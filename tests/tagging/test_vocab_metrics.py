"""Vocabulary, OOV / ambiguous bookkeeping and the paper's three accuracies, by hand on a tiny treebank."""
from __future__ import annotations

import math

import pytest
import torch

from tagging.data import PAD, UNK, UPOS, Sentence, Vocabulary, collate, encode
from tagging.metrics import accuracies


def S(text: str) -> Sentence:
    pairs = [w.rsplit("/", 1) for w in text.split()]
    return Sentence([w for w, _ in pairs], [t for _, t in pairs])


#: counts: the 4, run 3 (NOUN and VERB), . 2, dogs 1, walk 1, fast 1: six word types
TRAIN = [S("the/DET run/NOUN ./PUNCT"), S("the/DET dogs/NOUN run/VERB ./PUNCT"), S("the/DET run/NOUN"),
         S("the/DET walk/NOUN fast/ADV")]


def test_train_forms_ambiguous_forms_and_the_most_frequent_half():
    vocab = Vocabulary.build(TRAIN, vocab_fraction=0.5)
    assert vocab.train_forms == {"the", "run", ".", "dogs", "walk", "fast"}
    assert vocab.ambiguous_forms == {"run"}           # "the" is always DET
    assert vocab.words == ["<pad>", "<unk>", "the", "run", "."]   # 3 of 6 types, by frequency
    assert vocab.word_index["the"] == 2 and vocab.words[PAD] == "<pad>" and vocab.words[UNK] == "<unk>"
    assert vocab.chars == ["<pad>", "<unk>"] + sorted(set("therun.dogswalkfast"))
    assert vocab.tags == UPOS and len(vocab.tags) == 17 and vocab.tag_index["VERB"] == 15


@pytest.mark.parametrize("fraction, kept", [(1.0, ["the", "run", ".", "dogs", "walk", "fast"]),
                                            (0.34, ["the", "run"]), (0.01, ["the"])])
def test_vocab_fraction_keeps_the_most_frequent_types(fraction, kept):
    vocab = Vocabulary.build(TRAIN, vocab_fraction=fraction)
    assert vocab.words == ["<pad>", "<unk>"] + kept
    assert vocab.train_forms == {"the", "run", ".", "dogs", "walk", "fast"}   # OOV does not depend on the fraction


def test_vocabulary_state_round_trips():
    vocab = Vocabulary.build(TRAIN)
    again = Vocabulary.from_state(vocab.state())
    assert (again.words, again.chars, again.tags, again.train_forms, again.ambiguous_forms) == (
        vocab.words, vocab.chars, vocab.tags, vocab.train_forms, vocab.ambiguous_forms)
    assert again.word_index == vocab.word_index and again.char_index == vocab.char_index


def test_encode_flags_unknown_words_chunks_and_truncates_characters():
    vocab = Vocabulary.build(TRAIN)
    chunks = encode([S("the/DET dogs/VERB zebra/NOUN run/NOUN")], vocab, max_len=3, max_word_chars=3)
    assert len(chunks) == 2
    first, second = chunks
    # "dogs" was seen in training (not OOV) but is outside the kept half: <unk>; "zebra" is OOV
    assert first.words.tolist() == [2, UNK, UNK] and second.words.tolist() == [3]
    assert first.oov.tolist() == [False, False, True] and second.oov.tolist() == [False]
    assert first.ambiguous.tolist() == [False, False, False] and second.ambiguous.tolist() == [True]
    assert first.tags.tolist() == [UPOS.index("DET"), UPOS.index("VERB"), UPOS.index("NOUN")]
    c = vocab.char_index
    assert first.chars.tolist() == [[c["t"], c["h"], c["e"]], [c["d"], c["o"], c["g"]],   # "dogs" -> "dog"
                                    [UNK, c["e"], UNK]]                                  # z and b are unseen
    assert second.chars.tolist() == [[c["r"], c["u"], c["n"]]]
    short = encode([S("q/X ./PUNCT")], vocab)[0]
    assert short.chars.tolist() == [[UNK], [c["."]]]                                    # width of the longest word


def _scored_batch():
    """Gold and predicted tags of two test sentences; returns (batch, predicted)."""
    vocab = Vocabulary.build(TRAIN)
    test = [S("the/DET dogs/VERB zebra/NOUN run/NOUN"), S("run/VERB yak/NOUN")]
    batch = collate(encode(test, vocab))
    assert batch.oov.tolist() == [[False, False, True, False], [False, True, False, False]]
    assert batch.ambiguous.tolist() == [[False, False, False, True], [True, False, False, False]]
    t = UPOS.index
    predicted = torch.tensor([[t("DET"), t("NOUN"), t("NOUN"), t("VERB")],    # right, wrong, right (OOV), wrong (amb.)
                              [t("VERB"), t("NOUN"), 0, 0]])                   # right (amb.), right (OOV), padding
    # padding that would count if the mask were ignored: gold = prediction there, and flagged OOV and ambiguous
    batch.tags[1, 2:] = 0
    batch.oov[1, 2:] = True
    batch.ambiguous[1, 2:] = True
    return batch, predicted


def test_accuracies_by_hand_with_padding_ignored():
    batch, predicted = _scored_batch()
    scores = accuracies([(batch, predicted)])
    assert scores["words"] == 6 and scores["oov_words"] == 2 and scores["ambiguous_words"] == 2
    assert scores["all"] == pytest.approx(100 * 4 / 6)
    assert scores["oov"] == pytest.approx(100.0)
    assert scores["ambiguous"] == pytest.approx(50.0)
    # the authors' groups: <unk> words (dogs: seen in training, outside the kept half; zebra; yak), all of them
    # apart from "dogs" tagged right; ambiguous inside the index: both "run", one right
    assert (scores["oov_index_words"], scores["ambiguous_index_words"]) == (3, 2)
    assert scores["oov_index"] == pytest.approx(100 * 2 / 3) and scores["ambiguous_index"] == pytest.approx(50.0)


def test_accuracies_pool_words_over_batches_and_an_empty_group_is_nan():
    batch, predicted = _scored_batch()
    vocab = Vocabulary.build(TRAIN)
    other = collate(encode([S("the/DET")], vocab))   # one known, unambiguous word, tagged wrong
    scores = accuracies([(batch, predicted), (other, torch.tensor([[UPOS.index("X")]]))])
    assert scores["words"] == 7 and scores["all"] == pytest.approx(100 * 4 / 7)   # not the mean of 66.7 and 0
    assert scores["oov"] == pytest.approx(100.0) and scores["ambiguous"] == pytest.approx(50.0)
    alone = accuracies([(other, torch.tensor([[UPOS.index("DET")]]))])
    assert alone["all"] == 100.0 and alone["words"] == 1
    assert math.isnan(alone["oov"]) and math.isnan(alone["ambiguous"])
    assert alone["oov_words"] == 0 and alone["ambiguous_words"] == 0
    assert all(math.isnan(accuracies([])[group]) for group in ("all", "oov", "ambiguous"))


def test_the_word_index_counts_the_given_splits_and_rounds_down():
    dev = [S("zebra/NOUN zebra/NOUN zebra/NOUN zebra/NOUN yak/NOUN")]
    vocab = Vocabulary.build(TRAIN, vocab_fraction=0.5, counted=TRAIN + dev)
    # 8 types over train + dev: the 4 most frequent (zebra 4 ties with "the" 4: first seen first)
    assert vocab.words == ["<pad>", "<unk>", "the", "zebra", "run", "."]
    assert vocab.train_forms == {"the", "run", ".", "dogs", "walk", "fast"}   # OOV stays relative to train
    assert set(vocab.chars) == {"<pad>", "<unk>", *"therun.dogswalkfast"}      # characters: train only
    assert Vocabulary.build(TRAIN[:3], vocab_fraction=0.5).words[2:] == ["the", "run"]  # 5 types: 5 // 2


def test_an_ambiguous_word_outside_the_index_counts_only_in_our_definition():
    train = TRAIN + [S("walk/VERB")]                  # walk: NOUN and VERB, once each
    vocab = Vocabulary.build(train, vocab_fraction=0.5)
    assert "walk" in vocab.ambiguous_forms and "walk" not in vocab.word_index
    batch = collate(encode([S("walk/VERB run/VERB")], vocab))
    scores = accuracies([(batch, torch.tensor([[UPOS.index("VERB"), UPOS.index("NOUN")]]))])
    assert (scores["ambiguous_words"], scores["ambiguous"]) == (2, 50.0)
    assert (scores["ambiguous_index_words"], scores["ambiguous_index"]) == (1, 0.0)   # run only
    assert (scores["oov_words"], scores["oov_index_words"], scores["oov_index"]) == (0, 1, 100.0)


def test_the_official_preset_is_the_authors_initialisation_and_vocabulary():
    from tagging.config import load_config

    standard, official = load_config(), load_config(preset="official")
    assert (standard.preset, standard.model.init, standard.data.vocab_splits) == ("standard", "torch", "train")
    assert (official.preset, official.model.init, official.data.vocab_splits) == ("official", "keras", "all")
    assert load_config(["model.init=torch"], preset="official").model.init == "torch"   # an override still wins
    with pytest.raises(ValueError, match="--preset nosuch: unknown; available: standard, official"):
        load_config(preset="nosuch")
