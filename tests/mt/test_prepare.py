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
