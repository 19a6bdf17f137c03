"""The CoNLL-U reader on hand-made files: what is tagged, what is skipped, and a clean error (file and line)
for each kind of broken input."""
from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tagging.data import Sentence, TreebankError, load_treebank, read_conllu, split_files, treebank_dir

from tagging.fixtures import write_toy_treebank


def row(*columns: str) -> str:
    return "\t".join(columns)


def token(i, form, upos, head="0"):
    return row(str(i), form, form.lower(), upos, "_", "_", head, "dep", "_", "_")


FRENCH = "\n".join([
    "# newdoc id = d1",
    "# sent_id = 1",
    "# text = Du chat",
    row("1-2", "Du", "_", "_", "_", "_", "_", "_", "_", "_"),   # a multiword token: skipped
    token(1, "De", "ADP", "3"),
    token(2, "le", "DET", "3"),
    token(3, "chat", "NOUN", "0"),
    row("3.1", "dort", "dormir", "VERB", "_", "_", "_", "_", "0:root", "_"),   # an empty node: skipped
    "",
    "",                                                          # two blank lines between sentences
    "# sent_id = 2",
    "# 1\tDET\tnot a token: a comment with tabs",
    token(1, "Il", "PRON", "2"),
    token(2, "dort", "VERB", "0"),
    token(3, ".", "PUNCT", "2"),
    "",
    "# sent_id = 3 (no blank line at the end of the file)",
    token(1, "_", "SYM", "0"),                                   # an underscore is a form like any other
])
EXPECTED = [Sentence(["De", "le", "chat"], ["ADP", "DET", "NOUN"]),
            Sentence(["Il", "dort", "."], ["PRON", "VERB", "PUNCT"]),
            Sentence(["_"], ["SYM"])]


@pytest.mark.parametrize("form", ["plain", "gzip", "crlf"])
def test_multiword_ranges_empty_nodes_and_comments_are_skipped(tmp_path, form):
    text = FRENCH.replace("\n", "\r\n") if form == "crlf" else FRENCH
    path = tmp_path / ("fr-ud-train.conllu.gz" if form == "gzip" else "fr-ud-train.conllu")
    path.write_bytes(gzip.compress(text.encode()) if form == "gzip" else text.encode())
    assert read_conllu(path) == EXPECTED


def test_a_sentence_of_only_a_multiword_range_is_dropped(tmp_path):
    path = tmp_path / "x.conllu"
    path.write_text("# only a range\n" + row("1-2", "du", *["_"] * 8) + "\n\n" + token(1, "a", "X") + "\n\n")
    assert read_conllu(path) == [Sentence(["a"], ["X"])]


def _write(tmp_path: Path, lines, name="xx-ud-train.conllu") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    return path


GOOD = ["# sent_id = 1", token(1, "a", "DET", "2"), token(2, "b", "NOUN", "0"), ""]   # lines 1-4


def test_a_token_line_with_nine_columns_names_the_file_and_line(tmp_path):
    path = _write(tmp_path, GOOD + ["# sent_id = 2", token(1, "c", "NOUN"), row("2", "d", "d", "VERB", "_", "_", "1",
                                                                              "dep", "_")])
    with pytest.raises(TreebankError) as err:
        read_conllu(path)
    message = str(err.value)
    assert message.startswith(f"{path}:7: a token line has 9 tab-separated columns, CoNLL-U has 10")


def test_an_invalid_upos_tag_names_the_file_line_tag_and_word(tmp_path):
    path = _write(tmp_path, GOOD + ["# sent_id = 2", token(1, "c", "NOUN"), token(2, "d", "VRB", "1")])
    with pytest.raises(TreebankError) as err:
        read_conllu(path)
    message = str(err.value)
    assert message.startswith(f"{path}:7: UPOS 'VRB' of word 'd' is not one of the 17 UD tags")
    assert "PROPN" in message


def test_a_bad_head_names_the_file_the_token_line_and_the_field(tmp_path):
    path = _write(tmp_path, GOOD + ["# sent_id = 2", token(1, "c", "NOUN"), token(2, "d", "VERB", "one")])
    with pytest.raises(TreebankError) as err:
        read_conllu(path)
    message = str(err.value)
    assert message.startswith(f"{path}:7: not valid CoNLL-U")
    assert "'head'" in message and "'one'" in message


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_file_that_is_not_utf8_is_a_clean_error(tmp_path, gzipped):
    data = ("\n".join(GOOD) + "\n").encode() + token(1, "caf\xe9", "NOUN").encode("latin-1") + b"\n\n"
    path = tmp_path / ("xx.conllu.gz" if gzipped else "xx.conllu")
    path.write_bytes(gzip.compress(data) if gzipped else data)
    with pytest.raises(TreebankError) as err:
        read_conllu(path)
    message = str(err.value)
    assert message.startswith(f"{path}: cannot be read as UTF-8 CoNLL-U{' (gzip)' if gzipped else ''}")
    assert "0xe9" in message


def test_a_plain_file_named_gz_is_a_clean_error(tmp_path):
    path = tmp_path / "xx-ud-train.conllu.gz"
    path.write_text("\n".join(GOOD) + "\n")
    with pytest.raises(TreebankError, match=r"cannot be read as UTF-8 CoNLL-U \(gzip\)"):
        read_conllu(path)


@pytest.mark.parametrize("data, reason", [
    (b"", "the file is empty"), (b"\n \n\t\n", "the file holds only blank lines"),
    (b"# just a comment\n\n", "no token line of a syntactic word (only comments, ranges or empty nodes)")])
@pytest.mark.parametrize("gzipped", [False, True])
def test_a_file_without_sentences_names_the_file_why_and_the_fix(tmp_path, data, reason, gzipped):
    path = tmp_path / ("xx-ud-train.conllu.gz" if gzipped else "xx-ud-train.conllu")
    path.write_bytes(gzip.compress(data) if gzipped else data)
    with pytest.raises(TreebankError) as err:
        read_conllu(path)
    assert str(err.value) == (f"{path}: no sentence found: {reason}; a CoNLL-U file holds sentences of one token per "
                              f"line, separated by blank lines: put back the treebank's file from its UD release")


def test_a_missing_dev_file_names_the_directory_and_the_split(tmp_path):
    directory = write_toy_treebank(tmp_path / "UD_Toy-Tiny")
    (directory / "xx_tiny-ud-dev.conllu").unlink()
    with pytest.raises(TreebankError) as err:
        split_files(directory)
    assert str(err.value).startswith(f"{directory}: no *-ud-dev.conllu (or .conllu.gz) file")
    with pytest.raises(TreebankError, match="no \\*-ud-dev.conllu"):
        load_treebank(tmp_path, str(directory))


def test_two_files_of_one_split_are_an_error(tmp_path):
    directory = write_toy_treebank(tmp_path / "UD_Toy-Tiny")
    (directory / "yy-ud-train.conllu").write_text("\n".join(GOOD) + "\n")
    with pytest.raises(TreebankError, match=r"several train files \(xx_tiny-ud-train.conllu, yy-ud-train.conllu\)"):
        split_files(directory)


def test_an_unknown_treebank_lists_the_treebanks_found(tmp_path):
    for name in ("UD_Toy-Tiny", "UD_Toy-Other"):
        (tmp_path / "ud" / name).mkdir(parents=True)
    with pytest.raises(TreebankError) as err:
        treebank_dir(tmp_path, "NoSuch")
    message = str(err.value)
    assert f"treebank 'NoSuch' not found under {tmp_path / 'ud'} or {tmp_path}" in message
    assert "treebanks there: UD_Toy-Other, UD_Toy-Tiny" in message


def test_treebank_names_with_or_without_ud_prefix_and_paths(tmp_path):
    ud = write_toy_treebank(tmp_path / "ud" / "UD_Toy-Tiny", gzipped=True)
    flat = write_toy_treebank(tmp_path / "UD_Toy-Flat")
    assert treebank_dir(tmp_path, "UD_Toy-Tiny") == ud
    assert treebank_dir(tmp_path, "Toy-Tiny") == ud
    assert treebank_dir(tmp_path, "Toy-Flat") == flat           # directly under the data root
    assert treebank_dir(tmp_path / "elsewhere", str(flat)) == flat
    files = split_files(ud)
    assert {k: p.name for k, p in files.items()} == {s: f"xx_tiny-ud-{s}.conllu.gz" for s in ("train", "dev", "test")}
    gz, plain = load_treebank(tmp_path, "Toy-Tiny"), load_treebank(tmp_path, "Toy-Flat")
    assert gz.name == "UD_Toy-Tiny" and gz.sentences == plain.sentences   # same seed: the same sentences
    assert {s: c["sentences"] for s, c in gz.counts().items()} == {"train": 30, "dev": 6, "test": 6}
