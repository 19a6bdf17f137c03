"""Corpus preparation: Multi30k layout, fairseq's IWSLT'14 pipeline, and the missing-file messages."""
import io
import tarfile

import pytest

from mt.data import DataError, Prepared, ensure_prepared, load_split
from mt.prepare import clean_pairs, iwslt14_from_release, main as prepare_main
from mt.text import read_lines, write_lines


def test_multi30k_preparation_writes_every_split_and_is_cached(tiny_root, tmp_path):
    out = tmp_path / "prep"
    prepared = ensure_prepared("multi30k", tiny_root, out, num_merges=40)
    assert prepared.manifest["splits"] == ["train", "val", "test_2016_flickr"]
    assert set(prepared.manifest["missing_splits"]) == {"test_2017_flickr", "test_2017_mscoco", "test_2018_flickr"}
    tok = prepared.lines("val", "tok", "tgt")
    assert all(line == line.lower() and line.endswith(" .") for line in tok)  # tokenised, lowercased
    assert prepared.lines("val", "raw", "tgt")[0][0].isupper()  # raw references keep their case
    bpe = prepared.lines("train", "bpe", "src")
    assert [line.replace("@@ ", "") for line in bpe] == prepared.lines("train", "tok", "src")
    data = load_split(prepared, "train")
    assert len(data) == 60 and int(data.src[0][-1]) == prepared.src_vocab.eos
    assert int(data.tgt[0][0]) == prepared.tgt_vocab.bos and int(data.tgt[0][-1]) == prepared.tgt_vocab.eos
    stamp = (out / "prepared.json").stat().st_mtime_ns
    assert ensure_prepared("multi30k", tiny_root, out).manifest == prepared.manifest
    assert (out / "prepared.json").stat().st_mtime_ns == stamp
    with pytest.raises(DataError, match="split 'test_2018_flickr' is not in"):
        prepared.lines("test_2018_flickr", "bpe", "src")


def test_missing_training_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"raw/train\.de\.gz is missing \(multi30k\).*--data-root"):
        ensure_prepared("multi30k", tmp_path, tmp_path / "out")
    with pytest.raises(DataError, match="prepared.json is missing"):
        Prepared.open(tmp_path / "nothing")


@pytest.mark.realdata
def test_iwslt14_without_train_split_names_the_file_and_the_fix(attn_data_root, tmp_path, capsys):
    code = prepare_main(["iwslt14", "--data-root", str(attn_data_root), "--out", str(tmp_path / "o"), "--offline"])
    err = capsys.readouterr().err
    assert code == 2
    assert "iwslt14_de_en/train.de is missing" in err and "de-en.tgz" in err
    assert not (attn_data_root / "mt/iwslt14_de_en/de-en.tgz").exists()  # nothing written into the data root


def test_clean_corpus_keeps_lengths_1_to_175_and_ratio_1_5():
    src = ["a b c", "a", "a b c d", " ", "w " * 176]
    tgt = ["x y z", "x y", "x y z w v u t", "x", "x " * 170]
    assert clean_pairs(src, tgt) == (["a b c"], ["x y z"])


def _add(tar, name, text):
    data = text.encode("utf-8")
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_fairseq_iwslt14_pipeline_on_a_tiny_release(tmp_path):
    train_de = ["<url>http://ted.com</url>", "<talkid>1</talkid>", "<keywords>k</keywords>",
                "<title>Der Titel</title>"] + [f"Satz Nummer {i}, gut." for i in range(46)]
    train_en = ["<url>http://ted.com</url>", "<talkid>1</talkid>", "<keywords>k</keywords>",
                "<title>The Title</title>"] + [f"Sentence number {i}, fine." for i in range(46)]
    release = tmp_path / "de-en.tgz"
    with tarfile.open(release, "w:gz") as tar:
        _add(tar, "de-en/train.tags.de-en.de", "\n".join(train_de) + "\n")
        _add(tar, "de-en/train.tags.de-en.en", "\n".join(train_en) + "\n")
        for k, name in enumerate(("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
                                  "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")):
            for lang, word in (("de", "Test"), ("en", "Test")):
                _add(tar, f"de-en/{name}.de-en.{lang}.xml",
                     f'<doc>\n<seg id="1"> {word} {k} isn\u2019t. </seg>\n<seg id="2">Zwei {k}</seg>\n</doc>\n')
    out = iwslt14_from_release(release, tmp_path / "fairseq")
    train, valid = read_lines(out / "train.en"), read_lines(out / "valid.en")
    assert len(train) + len(valid) == 47 and len(valid) == 2  # every 23rd line is validation
    assert train[0] == "the title"  # tags removed, lowercased
    assert valid[0] == "sentence number 21 , fine ."
    test = read_lines(out / "test.en")
    assert len(test) == 10 and test[0] == "test 0 isn &apos;t ." and test[-1] == "zwei 4"


def test_parallel_files_of_different_lengths_name_both_files(tiny_root, tmp_path):
    write_lines(tiny_root / "mt/multi30k/raw/val.en.gz", ["Only one line."])
    with pytest.raises(ValueError, match=r"val\.de\.gz has 12 lines but .*val\.en\.gz has 1"):
        ensure_prepared("multi30k", tiny_root, tmp_path / "prep")


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("lines, reason", [([], "the file is empty"),
                                           (["", " ", ""], "the file holds only blank lines")])
def test_a_corpus_file_without_sentences_names_the_file_and_where_it_comes_from(tiny_root, tmp_path, split, lines,
                                                                                reason):
    path = write_lines(tiny_root / f"mt/multi30k/raw/{split}.de.gz", lines)
    with pytest.raises(DataError) as err:
        ensure_prepared("multi30k", tiny_root, tmp_path / "prep")
    assert str(err.value) == (f"{path}: no sentences (multi30k): {reason}; Multi30k task 1 is published at "
                              f"https://github.com/multi30k/dataset (data/task1/raw)")
    assert not (tmp_path / "prep").exists()


@pytest.mark.parametrize("text, pairs", [("", 0), ("\n \n\n", 3), ("wort " * 176 + "\n", 1)])
def test_a_release_without_a_training_pair_left_after_cleaning_is_refused(tmp_path, text, pairs):
    release = tmp_path / "de-en"
    for lang in ("de", "en"):
        (release / f"train.tags.de-en.{lang}").parent.mkdir(exist_ok=True)
        (release / f"train.tags.de-en.{lang}").write_text(text)
    with pytest.raises(DataError) as err:
        iwslt14_from_release(release, tmp_path / "fairseq")
    assert str(err.value).startswith(f"{release}: train.tags.de-en.de and .en hold no pair of 1-175 tokens a side "
                                     f"with a length ratio of at most 1.5 ({pairs} pairs before cleaning); ")
    assert not (tmp_path / "fairseq").exists()


def test_a_split_whose_pairs_are_all_too_long_or_that_is_empty_names_the_file_and_the_fix(tiny_root, tmp_path):
    prepared = ensure_prepared("multi30k", tiny_root, tmp_path / "prep", num_merges=40)
    with pytest.raises(DataError) as err:
        load_split(prepared, "train", max_len=1)
    assert str(err.value) == (f"{tmp_path / 'prep' / 'train.bpe.de'}: all 60 sentence pairs of split 'train' have a "
                              f"side longer than data.max_len=1 BPE units; raise data.max_len (null keeps every pair)")
    write_lines(tmp_path / "prep" / "val.bpe.de", [])
    with pytest.raises(DataError) as err:
        load_split(prepared, "val")
    assert str(err.value) == (f"{tmp_path / 'prep' / 'val.bpe.de'}: no sentence pairs: the file is empty; delete "
                              f"{tmp_path / 'prep'} to have the corpus prepared again")
