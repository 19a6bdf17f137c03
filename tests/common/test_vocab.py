import json

import pytest

from common.text import Vocabulary


def test_from_counts_orders_by_count_then_token_and_applies_min_count():
    vocab = Vocabulary.from_counts({"b": 3, "a": 3, "c": 5, "rare": 1}, min_count=2)
    assert vocab.tokens == ["<pad>", "<unk>", "<bos>", "<eos>", "c", "a", "b"]
    assert (vocab.pad, vocab.unk, vocab.bos, vocab.eos) == (0, 1, 2, 3)
    assert "rare" not in vocab and vocab.index("rare") == vocab.unk


def test_max_size_counts_only_regular_tokens():
    vocab = Vocabulary.from_counts({"x": 9, "y": 8, "z": 7}, max_size=2)
    assert len(vocab) == 6 and "z" not in vocab


def test_encode_decode_round_trip_strips_specials_and_stops_at_eos():
    vocab = Vocabulary(["a", "man", "rides"])
    ids = vocab.encode("a man rides a horse".split(), add_bos=True, add_eos=True)
    assert ids[0] == vocab.bos and ids[-1] == vocab.eos and ids[-2] == vocab.unk
    assert vocab.decode(ids) == ["a", "man", "rides", "a", "<unk>"]
    assert vocab.decode(ids + [vocab.index("man")]) == vocab.decode(ids)  # nothing after eos
    assert vocab.decode([vocab.pad, vocab.index("a")], stop_at_eos=False) == ["a"]
    assert vocab.decode(ids, strip_specials=False, stop_at_eos=False)[0] == "<bos>"


def test_custom_specials_without_unk_raise_on_unknown_tokens():
    vocab = Vocabulary(["yes", "no"], specials=())
    assert vocab.pad is None and vocab.unk is None and vocab.index("no") == 1
    with pytest.raises(KeyError, match="maybe"):
        vocab.index("maybe")
    with pytest.raises(ValueError, match="<eos>"):
        vocab.encode(["yes"], add_eos=True)


def test_duplicates_are_rejected():
    with pytest.raises(ValueError, match="duplicate token 'a'"):
        Vocabulary(["a", "b", "a"])


def test_save_load_round_trip_and_clear_errors(tmp_path):
    vocab = Vocabulary.from_counts({"hund": 2, "katze": 4})
    path = vocab.save(tmp_path / "vocab.json")
    assert Vocabulary.load(path) == vocab
    assert json.loads(path.read_text())["tokens"] == ["katze", "hund"]
    with pytest.raises(FileNotFoundError, match="missing.json"):
        Vocabulary.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"words": []}')
    with pytest.raises(ValueError, match="bad.json.*'specials' and 'tokens'"):
        Vocabulary.load(tmp_path / "bad.json")
