"""Moses preprocessing, BPE learning/caching/application and their round trips."""
import pytest

from mt.bpe import BPE, learn_codes, remove_bpe
from mt.text import MosesDetokenizer, MosesPreprocessor, read_lines, write_lines


def test_gzip_and_plain_text_round_trip(tmp_path):
    lines = ["zwei männer .", "", "l'homme &amp; co"]
    for name in ("a.txt", "a.txt.gz"):
        write_lines(tmp_path / name, lines)
        assert read_lines(tmp_path / name) == lines
    with pytest.raises(FileNotFoundError, match="b.gz"):
        read_lines(tmp_path / "b.gz")


def test_moses_tokenise_lowercase_and_detokenise():
    pre = MosesPreprocessor("en", normalize_punctuation=True)
    assert pre('A man\'s "red" dog, running.') == "a man &apos;s &quot; red &quot; dog , running ."
    assert MosesDetokenizer("en")("a man &apos;s dog , running .") == "a man's dog, running."


def test_bpe_round_trip_and_cache(tmp_path):
    text = ["ein spielhaus aus holz .", "ein hund spielt im spielhaus .", "holzhaus und spielplatz ."] * 5
    codes = learn_codes([text, text], num_merges=30, cache=tmp_path)
    mtime = codes.stat().st_mtime_ns
    assert learn_codes([text, text], num_merges=30, cache=tmp_path) == codes  # cached, not relearned
    assert codes.stat().st_mtime_ns == mtime
    assert learn_codes([text, text], num_merges=20, cache=tmp_path) != codes
    bpe = BPE(codes)
    unseen = "ein spielplatzhund aus holzspiel ."
    for line in text + [unseen]:
        encoded = bpe(line)
        assert remove_bpe(encoded) == line
    assert "@@" in bpe(unseen)  # an unseen word is split into known units
    assert len(bpe(unseen).split()) > len(unseen.split())


def test_remove_bpe_at_line_end():
    assert remove_bpe("ein spiel@@ haus und@@") == "ein spielhaus und"


def test_missing_codes_file_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="mt.prepare"):
        BPE(tmp_path / "none.codes")


@pytest.mark.realdata
def test_sacremoses_reproduces_multi30k_tokenised_files(attn_data_root):
    base = attn_data_root / "mt/multi30k"
    raw = read_lines(base / "raw/val.en.gz")[:300]
    upstream = read_lines(base / "tok/val.lc.norm.tok.en.gz")[:300]
    assert MosesPreprocessor("en", normalize_punctuation=True).batch(raw) == upstream
