"""The reader on the 14 staged UD v2.2 treebanks (the counts of the data README, section 6), and a tiny tagger
that overfits 20 real sentences."""
from __future__ import annotations

import gzip
import re
import time

import pytest
import torch
import torch.nn.functional as F

from common.utils.runtime import Runtime
from tagging.data import Vocabulary, batches, encode, read_conllu, split_files, treebank_dir
from tagging.model import Tagger
from tagging.predict import evaluate

#: ``/work/shared/data/README.md`` section 6: sentences / syntactic words of train, dev and test at r2.2.
COUNTS = {
    "UD_Afrikaans-AfriBooms": ((1315, 33894), (194, 5317), (425, 10065)),
    "UD_English-GUM": ((2914, 53686), (707, 13164), (769, 13191)),
    "UD_English-LinES": ((2738, 50096), (912, 17102), (914, 15623)),
    "UD_French-Sequoia": ((2231, 50543), (412, 10011), (456, 10048)),
    "UD_French-Spoken": ((1153, 14952), (907, 10010), (726, 10010)),
    "UD_Gothic-PROIEL": ((3387, 35024), (985, 10114), (1029, 10198)),
    "UD_Greek-GDT": ((1662, 42326), (403, 10443), (456, 10672)),
    "UD_Hungarian-Szeged": ((910, 20166), (441, 11418), (449, 10448)),
    "UD_Korean-GSD": ((4400, 56687), (950, 11958), (989, 11677)),
    "UD_Old_Church_Slavonic-PROIEL": ((4123, 37432), (1073, 10100), (1141, 10031)),
    "UD_Swedish-LinES": ((2738, 48325), (912, 16462), (914, 15029)),
    "UD_Turkish-IMST": ((3685, 38082), (975, 10011), (975, 10004)),
    "UD_Uyghur-UDT": ((1656, 19262), (900, 10644), (900, 10330)),
    "UD_Vietnamese-VTB": ((1400, 20285), (800, 11514), (800, 11955)),
}
#: Multiword tokens (train/dev/test) of the README: the reader must not count them as words.
MULTIWORD = {"UD_French-Sequoia": (1363, 283, 310), "UD_Greek-GDT": (1114, 304, 250),
             "UD_Turkish-IMST": (1087, 301, 252)}


@pytest.mark.realdata
def test_the_staged_treebanks_are_the_fourteen_of_the_readme(attn_data_root):
    assert sorted(p.name for p in (attn_data_root / "ud").iterdir() if p.is_dir()) == sorted(COUNTS)


@pytest.mark.realdata
@pytest.mark.parametrize("name", sorted(COUNTS))
def test_sentence_and_word_counts_match_the_readme(attn_data_root, name):
    files = split_files(attn_data_root / "ud" / name)
    assert all(p.name.endswith(f"-ud-{split}.conllu.gz") for split, p in files.items())
    for split, (sentences, words) in zip(("train", "dev", "test"), COUNTS[name]):
        read = read_conllu(files[split])
        assert (len(read), sum(len(s.words) for s in read)) == (sentences, words), (name, split)
        assert all(len(s.words) == len(s.tags) for s in read)
    for split, ranges in zip(("train", "dev", "test"), MULTIWORD.get(name, (0, 0, 0))):
        # the files do hold the README's multiword-token ranges, which the counts above left out
        with gzip.open(files[split], "rt", encoding="utf-8") as handle:
            assert sum(1 for line in handle if re.match(r"\d+-\d+\t", line)) == ranges, (name, split)


@pytest.mark.realdata
def test_treebank_dir_accepts_names_and_paths(attn_data_root):
    gum = attn_data_root / "ud" / "UD_English-GUM"
    assert treebank_dir(attn_data_root, "UD_English-GUM") == gum
    assert treebank_dir(attn_data_root, "English-GUM") == gum
    assert treebank_dir(attn_data_root / "nowhere", str(gum)) == gum
    assert {s: p.name for s, p in split_files(gum).items()} == {
        "train": "en_gum-ud-train.conllu.gz", "dev": "en_gum-ud-dev.conllu.gz", "test": "en_gum-ud-test.conllu.gz"}


@pytest.mark.realdata
def test_a_tiny_tagger_overfits_twenty_real_sentences(attn_data_root):
    train = read_conllu(split_files(attn_data_root / "ud" / "UD_English-GUM")["train"])[:20]
    vocab = Vocabulary.build(train)
    chunks = encode(train, vocab, max_len=60)
    words = sum(len(c.words) for c in chunks)
    assert len(chunks) == 20 and words > 300
    torch.manual_seed(0)
    model = Tagger(len(vocab.words), len(vocab.chars), len(vocab.tags), "pe-add", word_dim=32, char_dim=16, heads=2,
                   layers=2, dropout=0.0, max_len=60)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=3e-3, alpha=0.9, eps=1e-7)
    runtime = Runtime.create("cpu", "fp32")
    before = evaluate(model, chunks, runtime)
    assert before["words"] == words and before["all"] < 50
    batch = next(batches(chunks, batch_size=20))
    start = time.perf_counter()
    for step in range(150):
        model.train()
        logits = model(batch.words, batch.chars, batch.char_index, batch.mask)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tags.flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = evaluate(model, chunks, runtime)
    assert after["all"] >= 95.0, after
    assert time.perf_counter() - start < 60
