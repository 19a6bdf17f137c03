import json

import numpy as np
import pytest
import torch

from captioning.data import CaptionCorpus, CaptionDataset, collate
from captioning.prepare import CaptionDataError
from common.features import RegionFeatureStore, RegionFeatureWriter


def test_items_and_batches(coco_fixture):
    corpus = CaptionCorpus(coco_fixture["prepared"])
    vocab = corpus.vocab
    images = corpus.split("train")
    assert len(images) == 20 and len(corpus.split("val")) == 5 and len(corpus.split("test", max_images=2)) == 2
    dataset = CaptionDataset(images, RegionFeatureStore(coco_fixture["features"]), vocab, corpus.max_length)
    batch = collate([dataset[i] for i in range(3)])
    captions = batch["captions"]
    assert captions.shape == (3, 5, corpus.max_length + 2)
    assert torch.all(captions[:, :, 0] == vocab.bos)
    lengths = (captions != vocab.pad).sum(-1)
    assert torch.all(captions.gather(2, (lengths - 1).unsqueeze(-1)) == vocab.eos)
    decoded = {" ".join(vocab.decode(row.tolist())) for row in captions[0]}
    assert decoded == {" ".join(s.lower().rstrip(".").split()) for s in images[0]["references"]}
    real = torch.tensor([dataset[i]["regions"].num_regions for i in range(3)])
    assert torch.equal(batch["mask"].sum(1), real) and torch.all(batch["features"][~batch["mask"]] == 0)


def test_images_with_few_captions_repeat_them(coco_fixture):
    corpus = CaptionCorpus(coco_fixture["prepared"])
    image = dict(corpus.split("train")[0], captions=corpus.split("train")[0]["captions"][:2])
    item = CaptionDataset([image], RegionFeatureStore(coco_fixture["features"]), corpus.vocab, corpus.max_length)[0]
    assert item["captions"].shape[0] == 5
    assert {tuple(r.tolist()) for r in item["captions"]} <= {
        tuple([corpus.vocab.bos, *c, corpus.vocab.eos] + [corpus.vocab.pad] * (corpus.max_length - len(c)))
        for c in image["captions"]}


def test_missing_features_name_the_file_and_images(coco_fixture, tmp_path):
    path = tmp_path / "partial.h5"
    with RegionFeatureWriter(path, feature_dim=4) as writer:
        writer.add(1, np.ones((2, 4)), np.zeros((2, 4)), 10, 10)
    corpus = CaptionCorpus(coco_fixture["prepared"])
    with pytest.raises(CaptionDataError) as err:
        CaptionDataset(corpus.split("val"), RegionFeatureStore(path), corpus.vocab, corpus.max_length)
    assert str(path) in str(err.value) and str(corpus.split("val")[0]["image_id"]) in str(err.value)


def test_unprepared_or_foreign_directory_is_a_clear_error(tmp_path):
    with pytest.raises(CaptionDataError, match="captioning.prepare"):
        CaptionCorpus(tmp_path)
    (tmp_path / "captions.json").write_text(json.dumps({"images": []}))
    with pytest.raises(CaptionDataError, match="'format'"):
        CaptionCorpus(tmp_path)
    (tmp_path / "captions.json").write_text(json.dumps({"format": "attention-suite/karpathy-captions"}))
    with pytest.raises(CaptionDataError, match="'vocab_size', 'max_length', 'images'"):
        CaptionCorpus(tmp_path)
    (tmp_path / "captions.json").write_text("{truncated")
    with pytest.raises(CaptionDataError, match="not valid JSON"):
        CaptionCorpus(tmp_path)
